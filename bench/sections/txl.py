"""Section 4: our Transformer-XL against HF transformers' TransfoXLLMHeadModel (a worker process in its own venv),
and its MFU."""

from __future__ import annotations

import torch

from bench import cases, timing
from bench.peers import HF_VERSION, HFWorker, PeakMatmul, hf_python
from bench.report import TARGETS, Budget, Report, fmt, pct, spread_text


def section_txl(rep: Report, budget: Budget, args) -> dict:
    """4: our Transformer-XL vs HF TransfoXLLMHeadModel (subprocess), interleaved, and MFU."""
    title = "4. Transformer-XL vs HF transformers TransfoXLLMHeadModel"
    ours = cases.build("txl-none")
    peak = PeakMatmul()
    f_ours = ours.flops()
    steps = {"ours": ours.step, "peak": peak.step}
    hf, hf_note = None, ""
    py = hf_python(args.hf_python)
    if py is None:
        hf_note = (f"HF comparison skipped: no python with transformers=={HF_VERSION} (create it: "
                   f"`python -m venv .venv-bench-hf && .venv-bench-hf/bin/pip install torch transformers=={HF_VERSION}`"
                   " or set HIGHWAY_BENCH_HF_PYTHON).")
    else:
        try:
            hf = HFWorker(py, torch.get_num_threads())
            steps["hf"] = hf.step
        except Exception as e:  # noqa: BLE001
            hf, hf_note = None, f"HF comparison failed: {type(e).__name__}: {e}"
    try:
        f_hf = hf.call({"cmd": "flops"})["flops"] if hf else None
        t = timing.interleaved(steps, warmup=1, min_rounds=args.min_rounds, max_rounds=args.max_rounds,
                               budget_s=budget.alloc(0.18))
    finally:
        if hf:
            hf.close()
    peak_fs = [peak.flops / s for s in t["peak"]]
    mfu = timing.median([(f_ours / a) / p for a, p in zip(t["ours"], peak_fs)])
    tok = ours.items / timing.median(t["ours"])
    s = cases.TXL
    lines = [
        f"Size: {s['n_layers']} layers, d_model {s['d_model']}, {s['n_heads']} heads x {s['d_head']}, d_ff "
        f"{s['d_ff']}, tgt_len {s['tgt_len']}, mem_len {s['mem_len']} (full memory from the first step in "
        f"both), batch {cases.TXL_DATA['batch']}, vocab {cases.TXL_DATA['vocab']}; post-LN, relative attention "
        "with global u, v (untie_r=False), tied softmax without adaptive clusters, dropout 0, fp32, Adam "
        "(fused) step included. HF runs in its own process (its venv); each round times one step of each.",
        "",
        "| model | parameters | FLOPs / step (fwd+bwd) | step s (median) | min-max s | tokens/s | MFU |",
        "|---|---:|---:|---:|---:|---:|---:|",
        f"| ours `transformer_xl` | {ours.params:,} | {f_ours / 1e9:.1f} G | {timing.median(t['ours']):.3f} | "
        f"{spread_text(t['ours'])} | {fmt(tok)} | {pct(mfu)} |",
    ]
    out = {"mfu_txl": mfu}
    rep.row("txl", "ours", "tokens_per_s", tok, "tokens/s")
    rep.row("txl", "ours", "mfu", mfu)
    if hf:
        r = timing.ratio(t, "hf", "ours")
        mfu_hf = timing.median([(f_hf / a) / p for a, p in zip(t["hf"], peak_fs)])
        tok_hf = ours.items / timing.median(t["hf"])
        lines.append(f"| HF TransfoXLLMHeadModel {hf.info.get('version')} | {hf.info['params']:,} | "
                     f"{f_hf / 1e9:.1f} G | {timing.median(t['hf']):.3f} | {spread_text(t['hf'])} | {fmt(tok_hf)} | "
                     f"{pct(mfu_hf)} |")
        same = "match" if hf.info["params"] == ours.params else f"differ by {hf.info['params'] - ours.params:+,}"
        lines += ["", f"Parameter counts {same}. **Throughput ratio ours / HF: {r:.2f}x** (median of "
                      f"{len(t['ours'])} per-round ratios). HF projects q for the memory positions too "
                      "(more FLOPs); MFU uses each model's own counted FLOPs."]
        rep.row("txl", "hf", "tokens_per_s", tok_hf, "tokens/s")
        rep.row("txl", "ours/hf", "throughput_ratio", r, "x")
        out["hf_ratio"] = r
    else:
        lines += ["", hf_note]
    lines += ["", f"Peak matmul in the same rounds: {timing.median(peak_fs) / 1e9:.1f} GFLOP/s. FLOPs are counted "
                  "as the timed steps run: in the steady state, the memory full (each segment attends to "
                  f"mem_len + tgt_len = {s['mem_len'] + s['tgt_len']} keys; both models get one no-grad segment "
                  "before anything is counted or timed). About a sixth of them are the attention matmuls (scores "
                  "q k^T and q r^T, probabilities @ v, and their backward), three of which write a (B, H, Q, K) "
                  "matrix of 32 MiB through an inner dimension of only d_head = 64. glibc serves an allocation that "
                  "large as a fresh mmap every time, and the page faults of its first touch halve the speed of those "
                  "matmuls (measured in isolation: 21 GFLOP/s into a fresh buffer, 43-54 into a reused one); raising "
                  "glibc's mmap threshold (mallopt, a process-wide setting that keeps freed memory) gained only "
                  "about 4% per step here, so we leave the allocator alone. "
                  "Relative attention needs the score gradient for the position term, so no flash kernel applies "
                  "(our core, `kernels._RelAttnCore`, keeps one (B, H, Q, K) tensor and shifts by a view)."]
    rep.target("MFU of transformer_xl (target >= 65%)", pct(mfu), ">= 65%", mfu >= TARGETS["mfu_txl"])
    rep.section(title, lines)
    return out
