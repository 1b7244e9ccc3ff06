"""Section 6: enwik8-prefix preparation MB/s (cold cache) and start-up time with a warm cache."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from bench import timing
from bench.report import TARGETS, Budget, Report, fmt


def section_data(rep: Report, budget: Budget, args) -> dict:
    """6: enwik8-prefix preparation MB/s (cold cache) and start-up time with a warm cache."""
    title = "6. Data preparation (enwik8 prefix)"
    from highway_repro.data import sources, text
    from highway_repro.data.tokenizers import ByteTokenizer

    try:
        raw_path = sources.fetch("enwik8/enwik8.prefix")
    except Exception as e:  # noqa: BLE001
        rep.section(title, [f"skipped: the enwik8 prefix is not available ({type(e).__name__}: {e}); "
                            "set HIGHWAY_DATA_MIRROR."])
        return {}
    mb = raw_path.stat().st_size / 1e6
    lm = {"batch_size": 22, "seq_len": 512, "eval_batch_size": 10, "eval_seq_len": 128}
    tok_s, cold_s, warm_s = [], [], []
    root = Path(tempfile.mkdtemp(prefix="bench-data-"))
    try:
        for i in range(args.data_repeats):
            raw = sources.fetch("enwik8/enwik8.prefix")  # checksum of the mirror copy included below
            t0 = timing.now()
            arr = __import__("numpy").fromfile(raw, dtype="uint8")
            n = round(0.05 * len(arr))
            parts = [arr[: len(arr) - 2 * n], arr[len(arr) - 2 * n: len(arr) - n], arr[len(arr) - n:]]
            tok = ByteTokenizer.fit(parts, "drop")
            for p in parts:
                tok.encode(p)
            tok_s.append(timing.now() - t0)
            cache = root / f"c{i}"
            t0 = timing.now()
            text.enwik8_prefix(cache_dir=str(cache), **lm)  # cold: fetch + SHA-256 + tokenize + write the cache
            cold_s.append(timing.now() - t0)
            t0 = timing.now()
            d = text.enwik8_prefix(cache_dir=str(cache), **lm)  # warm: SHA-256s, read the cache, first batch
            d.train_batch(0)
            warm_s.append(timing.now() - t0)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    tok_mb_s, cold_mb_s, warm = mb / timing.median(tok_s), mb / timing.median(cold_s), timing.median(warm_s)
    lines = [f"{mb:.2f} MB prefix, newlines dropped (204-symbol vocabulary), median of {args.data_repeats} runs.", "",
             "| stage | time s | MB/s |", "|---|---:|---:|",
             f"| preparation: read, split 90/5/5, fit the vocabulary, encode (what `text._byte_data` builds on a "
             f"cache miss) | {timing.median(tok_s):.3f} | {fmt(tok_mb_s)} |",
             f"| cold cache end to end: also SHA-256 of the mirror file, writing the .npy cache and its manifest | "
             f"{timing.median(cold_s):.3f} | {fmt(cold_mb_s)} |",
             f"| start-up with a warm cache (SHA-256 of the mirror file and of the cached arrays, build the data "
             f"object + first batch) | {warm:.3f} | |"]
    rep.row("data", "enwik8_prefix", "tokenize_mb_per_s", tok_mb_s, "MB/s")
    rep.row("data", "enwik8_prefix", "prepare_cold_mb_per_s", cold_mb_s, "MB/s")
    rep.row("data", "enwik8_prefix", "warm_startup_s", warm, "s")
    rep.target("enwik8 preparation (target >= 200 MB/s)", f"{tok_mb_s:,.0f} MB/s (cold cache end to end "
               f"{cold_mb_s:,.0f})", ">= 200 MB/s", tok_mb_s >= TARGETS["data_mb_s"])
    rep.target("first-epoch start-up with a warm cache (target < 2 s)", f"{warm:.3f} s", "< 2 s",
               warm < TARGETS["startup_s"])
    rep.section(title, lines)
    return {}
