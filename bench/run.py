"""`python -m bench --out results/bench`: the speed benchmarks (see __init__.py); one file per section in
bench/sections/, the report in bench/report.py."""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

import torch

from bench import timing
from bench.peers import HF_PYTHON_DEFAULT, HF_VERSION
from bench.report import REPO, Budget, Report, machine, write
from bench.sections import SECTIONS
from bench.sections.torch_compile import section_compile
from highway_repro.runtime import keep_freed_memory


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m bench", description="Speed benchmarks.")
    ap.add_argument("--out", default="results/bench", help="writes OUT.md and OUT.csv")
    ap.add_argument("--compile", action="store_true", help="also measure every group under torch.compile")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    ap.add_argument("--budget-min", type=float, default=10.5,
                    help="wall-clock budget of the timed sections; it sets their rounds (memory comes on top)")
    ap.add_argument("--min-rounds", type=int, default=3)
    ap.add_argument("--max-rounds", type=int, default=9)
    ap.add_argument("--data-repeats", type=int, default=5)
    ap.add_argument("--gate-models", default="tlm,rt,txl")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads (0: all cores on an idle machine, 1 on a busy one)")
    ap.add_argument("--clock", choices=("auto", "wall", "cpu"), default="auto",
                    help="auto: process CPU time with 1 thread on a busy machine, else wall time")
    ap.add_argument("--hf-python", default=None, help=f"python with transformers=={HF_VERSION} "
                                                      f"(default: {HF_PYTHON_DEFAULT.relative_to(REPO)})")
    ap.add_argument("--compile-timeout", type=int, default=600)
    ap.add_argument("--compile-rounds", type=int, default=5)
    ap.add_argument("--precision-steps", type=int, default=30,
                    help="training steps per model and precision in the precision section (default: %(default)s)")
    args = ap.parse_args(argv)
    args.argv = argv
    args.gate_models = args.gate_models.split(",")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    busy = load > 0.5 * cores
    threads = args.threads or (1 if busy else cores)
    torch.set_num_threads(threads)
    kept = keep_freed_memory()  # as every training run: the peers in the same process share it
    clock = args.clock if args.clock != "auto" else ("cpu" if busy and threads == 1 else "wall")
    timing.set_clock(clock)
    t0 = time.perf_counter()
    info = machine()
    info["timing"] = (f"{'process CPU time' if clock == 'cpu' else 'wall clock'}, {threads} torch thread(s)"
                      + ("; freed memory kept in the process (highway_repro.runtime.keep_freed_memory)" if kept else "")
                      + (f" (the machine was busy, load {load:.1f} on {cores} cores: one thread per contender "
                         "does not wait in thread barriers for descheduled threads, and CPU time leaves out the "
                         "time other jobs held the core; tokens/s are per CPU-second)" if busy else ""))
    rep = Report()
    budget = Budget(args.budget_min * 60)
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    for name in wanted:
        if name not in SECTIONS:
            ap.error(f"unknown section {name!r} (valid: {', '.join(SECTIONS)})")
    for name in wanted:
        t1 = time.perf_counter()
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        try:
            SECTIONS[name](rep, budget, args)
        except Exception as e:  # noqa: BLE001  (a failed section is reported, the others still run)
            traceback.print_exc()
            rep.section(f"{name}: FAILED", [f"`{type(e).__name__}: {e}`"])
        print(f"[bench] {name} done in {time.perf_counter() - t1:.0f} s", file=sys.stderr, flush=True)
    if args.compile:
        section_compile(rep, budget, args)
    write(rep, info, Path(args.out), args, time.perf_counter() - t0)
    print(Path(args.out).with_suffix(".md").read_text())
    return 0
