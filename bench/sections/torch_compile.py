"""Section C (`--compile`): eager vs torch.compile per group of cases, each group in a fresh process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch

from bench import timing
from bench.peers import cases_version
from bench.report import REPO, Budget, Report


COMPILE_GROUPS = (("ours_tlm_xt", "xt"), ("txl-none",), ("tlm-none", "tlm-sdu_sigmoid"),
                  ("mlp100-plain", "mlp100-highway"))


def section_compile(rep: Report, budget: Budget, args) -> dict:
    """--compile: eager vs torch.compile per group of cases, each group in a process with a timeout."""
    title = "C. torch.compile (--compile)"
    lines = [f"Each group in a fresh process: compile (default mode, forward + backward), then eager and "
             f"compiled steps interleaved ({args.compile_rounds} rounds; speedup = median of the per-round ratios "
             f"eager / compiled step time). The optimizer step stays eager. Compile s: the first two compiled "
             f"steps, with an empty inductor cache (a cold compile). Timeout {args.compile_timeout} s per group.", "",
             "| case | compile s | eager step s | compiled step s | speedup |", "|---|---:|---:|---:|---:|"]
    notes = []
    for group in COMPILE_GROUPS:
        if "xt" in group and not cases_version():
            continue
        cmd = [sys.executable, "-m", "bench.compiled", ",".join(group),
               "--rounds", str(args.compile_rounds),
               "--threads", str(torch.get_num_threads()), "--clock", timing.clock_name()]
        t0 = time.perf_counter()
        cache = tempfile.mkdtemp(prefix="bench-inductor-")  # a cold compile: no cache of an earlier run
        try:
            p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.compile_timeout,
                               env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache})
        except subprocess.TimeoutExpired:
            lines.append(f"| {', '.join(group)} | did not finish in {args.compile_timeout} s | | | |")
            continue
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        if p.returncode != 0:
            err = (p.stderr.strip().splitlines() or ["?"])[-1][:200]
            lines.append(f"| {', '.join(group)} | failed after {time.perf_counter() - t0:.0f} s: {err} | | | |")
            continue
        res = json.loads(p.stdout.strip().splitlines()[-1])
        for n, r in res["cases"].items():
            lines.append(f"| {n} | {r['compile_s']:.0f} | {r['eager_s']:.3f} | {r['compiled_s']:.3f} | "
                         f"{r['speedup']:.2f}x |")
            rep.row("compile", n, "speedup", r["speedup"], "x")
            rep.row("compile", n, "compile_s", r["compile_s"], "s")
        if "pair_ratio_compiled" in res:
            a, b = group
            notes.append(f"{a} / {b} throughput ratio: eager {res['pair_ratio_eager']:.3f}x, compiled "
                         f"{res['pair_ratio_compiled']:.3f}x.")
            rep.row("compile", f"{a}/{b}", "throughput_ratio_compiled", res["pair_ratio_compiled"], "x")
    rep.section(title, lines + ([""] + notes if notes else []))
    return {}
