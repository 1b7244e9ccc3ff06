"""The command line: the options, the module check, the time guard, and the phases in their order."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .cases import CASE_BY_KEY, CASES
from .compiled import run_compiled
from .common import GPU_CACHE, GPU_MIRROR, REPO, elapsed, preflight, restart_clock, say, setup_paths
from .cuda_tests import cuda_tests
from .curve import curve_need, curve_run, curves_png, plot_curves
from .data import data_check, prepare
from .distributed import ddp_check, ddp_worker
from .grouped import grouped_phase
from .machine import machine, matmul_peak
from .nan import nan_check
from .peers import run_peers
from .phases import Ctx, phase, start_guard
from .report import Report
from .tables import tables_section
from .throughput import run_throughput

DESCRIPTION = "`make gpu-check`: one prepared run that proves the paper-scale configs on one GPU."


def parse(argv):
    ap = argparse.ArgumentParser(prog="python scripts/gpu_check.py", description=DESCRIPTION,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="CPU, smoke sizes, a few steps: the same code path")
    ap.add_argument("--data", help="mirror-layout data folder (default: $HIGHWAY_DATA_MIRROR, else data/gpu_mirror)")
    ap.add_argument("--out", help="report path without suffix (default results/gpu_check; dry run: "
                                  "runs/gpu_check_dry/gpu_check)")
    ap.add_argument("--runs", default=None, help="run folders (default runs/gpu_check[_dry])")
    ap.add_argument("--budget-s", type=float, default=None, help="stop starting phases after this many seconds from "
                    "the start (default 420; the time guard exits at budget + 30 s)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps per speed run (default 10; dry 1)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per speed run (default 30; dry 2)")
    ap.add_argument("--curve-steps", type=int, default=None, help="learning-curve steps (default 400; dry 4)")
    ap.add_argument("--cases", default="", help="only these speed cases, comma-separated: "
                    + ",".join(c.key for c in CASES))
    ap.add_argument("--skip", default="", help="phases to skip, comma-separated: peak,nan,throughput,peers,curve,ddp,"
                                                "tests,grouped,tables,compiled")
    ap.add_argument("--compiled", action="store_true", help="run phase `compiled` too (eager vs inductor vs CUDA "
                    "graphs: on a GPU a call of its own, `make gpu-check-compiled`; the dry run always runs it)")
    ap.add_argument("--prepare", action="store_true", help="write data/gpu_mirror, data/gpu_cache, .gpu_deps and "
                                                           ".gpu_peers here (CPU), then exit")
    ap.add_argument("--from", dest="prepare_from", help="--prepare: the full offline mirror (default "
                                                        "$HIGHWAY_DATA_MIRROR, else /work/shared/data)")
    ap.add_argument("--test-deps", action="store_true", help="--prepare: carry yaml, pytest and their helpers too "
                                                               "(for a Python that lacks them)")
    ap.add_argument("--peers", action=argparse.BooleanOptionalAction, default=True,
                    help="--prepare: download the peers' wheels into .gpu_peers (default; --no-peers: leave them out)")
    ap.add_argument("--cifar-train", type=int, default=3000)
    ap.add_argument("--cifar-test", type=int, default=1000)
    ap.add_argument("--plot", metavar="CURVES_CSV", help="draw <name>.png from a curves CSV, then exit")
    ap.add_argument("--ddp-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    dry = args.dry_run
    args.budget_s = args.budget_s if args.budget_s is not None else (900.0 if dry else 420.0)
    args.warmup = args.warmup if args.warmup is not None else (1 if dry else 10)
    args.steps = args.steps if args.steps is not None else (2 if dry else 30)
    args.curve_steps = args.curve_steps if args.curve_steps is not None else (4 if dry else 400)
    args.out = args.out or str(REPO / ("runs/gpu_check_dry/gpu_check" if dry else "results/gpu_check"))
    args.runs = args.runs or str(REPO / ("runs/gpu_check_dry" if dry else "runs/gpu_check"))
    args.cases = [c for c in args.cases.split(",") if c]
    args.skip = {s for s in args.skip.split(",") if s} | (set() if args.compiled or dry else {"compiled"})
    unknown = [c for c in args.cases if c not in CASE_BY_KEY]
    if unknown:
        ap.error(f"--cases {','.join(unknown)}: not known (valid: {', '.join(CASE_BY_KEY)})")
    if args.warmup < 1 or args.steps < 1 or args.curve_steps < 1:
        ap.error("--warmup, --steps and --curve-steps must be >= 1")
    return args


def main(argv=None) -> int:
    restart_clock()
    args = parse(argv)
    found = setup_paths()
    if args.prepare:  # before the default below points HIGHWAY_DATA_MIRROR at the folder --prepare rewrites
        return prepare(args)
    if args.data:
        os.environ["HIGHWAY_DATA_MIRROR"] = str(Path(args.data).resolve())
    elif not os.environ.get("HIGHWAY_DATA_MIRROR") and GPU_MIRROR.is_dir():
        os.environ["HIGHWAY_DATA_MIRROR"] = str(GPU_MIRROR)
    mirror = os.environ.get("HIGHWAY_DATA_MIRROR")
    if mirror and Path(mirror).resolve() == GPU_MIRROR.resolve() and GPU_CACHE.is_dir():
        os.environ.setdefault("HIGHWAY_DATA_DIR", str(GPU_CACHE))  # the CIFAR-10 cut --prepare made beside that mirror
    os.environ.setdefault("HIGHWAY_DATA_OFFLINE", "1")  # no network on the GPU machine: never wait for a download
    # inductor's cache in the check's runs folder: no compile shares files with another process's (a test suite's)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(args.runs).resolve() / "inductor_cache"))
    if args.ddp_worker:
        return ddp_worker(args)
    if args.plot:
        csv_path = Path(args.plot)
        print(plot_curves(csv_path, csv_path.with_suffix(".png")))
        return 0

    missing, optional = preflight(found)
    command = "python scripts/gpu_check.py " + " ".join(argv if argv is not None else sys.argv[1:])
    rep = Report(Path(args.out), args.dry_run, command.strip())
    if missing:
        msg = (f"missing: {', '.join(missing)}. The check needs a Python with torch (a CUDA build) and numpy; "
               "hydra-core and omegaconf come from .gpu_deps (`python scripts/gpu_check.py --prepare` on a machine "
               "that has them, then carry .gpu_deps).")
        say(msg)
        rep.problem("preflight", msg)
        rep.finished = True
        rep.write()
        return 2
    ctx = Ctx(args, rep)
    ctx.configs_ok = all(found.get(m) for m in ("hydra", "omegaconf", "yaml", "antlr4"))
    if not ctx.configs_ok:
        rep.problem("preflight", "hydra-core / omegaconf / yaml / antlr4 missing: every phase that composes the "
                                 "project's configs is skipped; carry .gpu_deps (made by `--prepare`)")
    if optional:
        rep.row("machine", "", "", "", "missing_optional_modules", " ".join(optional))
    guard = start_guard(ctx, grace=30.0)
    say(f"{'DRY RUN on CPU' if ctx.dry else 'GPU check'}: budget {ctx.deadline:.0f} s; report {rep.out}.md; "
        f"mirror {os.environ.get('HIGHWAY_DATA_MIRROR', 'not set')}")
    try:
        import torch  # seconds: after the module check above
    except Exception as e:  # a torch that is there but does not load (a missing CUDA library, ...)
        rep.problem("preflight", f"import torch failed: {type(e).__name__}: {e}"[:600])
        say(f"import torch failed: {type(e).__name__}: {e}")
        guard.cancel()
        rep.finished = True
        rep.write()
        return 2
    threads = torch.get_num_threads()
    if ctx.dry:
        torch.set_num_threads(1)  # tiny models: one thread is fastest and leaves the other cores alone
    try:
        return check(ctx, args)
    finally:
        guard.cancel()
        torch.set_num_threads(threads)


def check(ctx: Ctx, args) -> int:
    import torch

    rep = ctx.rep
    say(f"torch {torch.__version__} imported; CUDA available: {torch.cuda.is_available()}")
    facts = phase(ctx, "machine", 0, machine)
    if facts is None and not ctx.dry:
        rep.finished = True
        rep.write()
        return 2
    on = lambda name: name not in args.skip  # noqa: E731
    if ctx.configs_ok:
        phase(ctx, "data", 0, data_check)
    if on("peak"):
        phase(ctx, "matmul peak", 5, matmul_peak)
    if ctx.configs_ok:
        if on("nan"):
            phase(ctx, "nan policy", 20, nan_check)
        if on("throughput"):
            run_throughput(ctx, "A")
            if on("peers"):
                run_peers(ctx)  # eager, beside the cases above: HF Transformer-XL, x-transformers
        if on("curve"):
            for variant in ("baseline", "sdu_tanh"):
                phase(ctx, f"curve {variant}", curve_need(ctx, variant), curve_run, variant)
            if ctx.curves:
                phase(ctx, "curve png", 2, curves_png)
        if on("ddp"):
            phase(ctx, "torchrun nccl", 25 if ctx.dry else 45, ddp_check)
    if on("tests"):
        phase(ctx, "cuda tests", 15 if ctx.dry else 40, cuda_tests)
    if ctx.configs_ok:
        if on("throughput"):
            run_throughput(ctx, "BC", reserve=0 if ctx.dry else 8)  # the table times come after
        if on("grouped"):
            phase(ctx, "grouped", 60 if ctx.dry else 120, grouped_phase)
        if on("tables"):
            phase(ctx, "table times", 3, tables_section)
        if on("compiled"):
            run_compiled(ctx)
    rep.finished = True
    rep.write()
    say(f"done in {elapsed():.0f} s: {rep.out.with_suffix('.md')}, {rep.out.with_suffix('.csv')}; "
        f"{len(rep.problems)} problem(s)")
    for p, m in rep.problems:
        say(f"  {p}: {m}")
    return 0
