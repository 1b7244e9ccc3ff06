"""Section 7: peak memory of training steps, one fresh process per case (`python -m bench.memory CASE`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from bench.peers import HFWorker, cases_version, hf_python
from bench.report import REPO, Budget, Report


MEMORY_CASES = ("tlm-none", "tlm-sdu_sigmoid", "ours_tlm_xt", "xt", "txl-none", "txl-sdu_sigmoid", "rt-none",
                "rt-sdu_sigmoid", "mlp100-plain", "mlp100-highway", "cifarconv-plain", "cifarconv-highway")


def section_memory(rep: Report, budget: Budget, args) -> dict:
    """7: peak memory of training steps, one fresh process per case (two at a time: no timing here)."""
    title = "7. Peak memory of a training step (CPU resident set, fresh process per case)"
    names = [n for n in MEMORY_CASES if n != "xt" or cases_version()]
    threads = torch.get_num_threads()
    results: dict[str, dict] = {}
    pending = list(names)
    running: list[tuple[str, subprocess.Popen]] = []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    while pending or running:
        while pending and len(running) < 2:
            n = pending.pop(0)
            running.append((n, subprocess.Popen([sys.executable, "-m", "bench.memory", n, "--threads", "1"], cwd=REPO,
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)))
        n, p = running.pop(0)
        out, err = p.communicate(timeout=900)
        results[n] = json.loads(out.strip().splitlines()[-1]) if p.returncode == 0 else {"error": err[-300:]}
    hf_line = None
    py = hf_python(args.hf_python)
    if py is not None:
        try:
            w = HFWorker(py, 1)
            before = w.call({"cmd": "rss"})
            w.step(), w.step()
            after = w.call({"cmd": "rss"})
            w.close()
            hf_line = (w.info["params"], before["rss_kb"], after["maxrss_kb"])
        except Exception as e:  # noqa: BLE001
            hf_line = f"HF worker failed: {e}"
    lines = ["Each case in a new process (`python -m bench.memory CASE`): RSS after building "
             "model, batch and optimizer; peak RSS over 2 training steps (the first one creates the optimizer "
             "state), read as VmHWM, the kernel's high-water mark of the process (getrusage's ru_maxrss keeps "
             "the parent's RSS across fork + exec, so it is useless in a child); step = peak - setup. "
             "1 thread per process. Sizes as in sections 1, 2 and 4.", "",
             "| case | parameters | setup MB | peak MB | step MB |", "|---|---:|---:|---:|---:|"]
    for n in names:
        r = results[n]
        if "error" in r:
            lines.append(f"| {n} | failed: {r['error'].splitlines()[-1] if r['error'] else '?'} | | | |")
            continue
        lines.append(f"| {n} | {r['params']:,} | {r['setup_kb'] / 1024:,.0f} | {r['peak_kb'] / 1024:,.0f} | "
                     f"{r['step_kb'] / 1024:,.0f} |")
        rep.row("memory", n, "step_peak_mb", r["step_kb"] / 1024, "MB")
        rep.row("memory", n, "peak_rss_mb", r["peak_kb"] / 1024, "MB")
    if isinstance(hf_line, tuple):
        params, setup, peak = hf_line
        lines.append(f"| HF TransfoXL (worker) | {params:,} | {setup / 1024:,.0f} | {peak / 1024:,.0f} | "
                     f"{max(0, peak - setup) / 1024:,.0f} |")
    elif hf_line:
        lines.append(f"| HF TransfoXL | {hf_line} | | | |")
    del threads
    rep.section(title, lines)
    return {}
