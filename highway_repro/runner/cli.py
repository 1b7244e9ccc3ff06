"""`python -m highway_repro.runner` (`make reproduce-<table>`, `make estimate-<table>`, `make tables`): train what is
missing of one or more tables in one queue (`--jobs` at a time, locally or on SLURM), then build their reports."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from highway_repro import files
from highway_repro.train.config import check_group_choices
from highway_repro.errors import ArgumentParser, BusyError, HighwayError, make_folder
from highway_repro.lock import take
from highway_repro.report.header import duration
from highway_repro.grids import kept_folders
from highway_repro.runner.estimate import MARGIN, run_seconds, wall_s
from highway_repro.runner.keep import other_recipe, read_record, table_runs, wall_of
from highway_repro.runner.plan import grid_names
from highway_repro.runner.queue import FOLLOW_UPS, exit_code, run_queue
from highway_repro.runner.table import TablePlan, plan_table
from highway_repro.targets import (CONFIG_DIR, PAPER_TABLES, REPORTS, ROOT, SCALES, TARGETS, make_target,
                                   runs_folder, scale_files)

CPU_BUDGET_JOBS = 2  # the cpu scale's budgets (4.5 h a table, 3 h a study) are for 2 jobs x 1 thread


def report_table(name: str, scale: str, runs_root: Path, results: Path, echo: bool = True) -> int:
    """Build the table from the kept runs (plus failed or unfinished ones of the local sweep folder); a target
    with `parts` reads the runs of its parts. `echo`: print the table (not for `make tables`: every report)."""
    t = TARGETS[name]
    sweep_dir, kept = runs_root / f"{name}-{scale}", results / runs_folder(name, scale)
    records = [read_record(results / runs_folder(part, scale), False) for part in t.parts or (name,)]
    meta = {"commands": (not t.parts and records[0]["commands"]) or [f"make {make_target(name)} SCALE={scale}"],
            "scale": scale, "wall_s": wall_of(records) or None,  # commands that overlapped count once
            "planned": sum(len(grid_names(p, scale)) for p in t.parts or (name,)),
            "part_of": next((n for n, x in TARGETS.items() if name in x.parts), None),
            "scale_files": scale_files(name, scale)}
    from highway_repro.report import build_table, findings_path

    if t.after and not (sweep_dir / "ckpt").is_dir():  # the follow-up step needs the run with its checkpoint
        found = findings_path(results / t.results)
        if not found.exists():
            print(f"[{name}] no run folder with a checkpoint at {sweep_dir} and no kept findings ({found}): "
                  "no report", file=sys.stderr)
            return 0
        meta["findings"] = files.read_bytes(found, results).decode(errors="replace")  # rebuilt from files
    elif t.after:
        cmd = [sys.executable, "-m", t.after, str(sweep_dir), "--out", str(results / t.results), "--scale", scale]
        cmd += [a for c in meta["commands"] for a in ("--command", c)]
        cmd += ["--wall-s", str(meta["wall_s"])] if meta["wall_s"] else []
        proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True)  # a stopped queue stops it too
        FOLLOW_UPS.add(proc)
        try:
            return exit_code(proc.wait())
        finally:
            FOLLOW_UPS.discard(proc)

    runs, own, meta["other_recipe"] = [], [], {}
    for part in t.parts or (name,):
        part_runs = table_runs(part, scale, runs_root, results)
        other = other_recipe(part, scale, [r.path for r in part_runs])
        runs += [r for r in part_runs if r.path.name not in other]
        meta["other_recipe"].update({(f"{part}/{k}" if t.parts else k): v for k, v in other.items()})
        reused = {results / runs_folder(o, scale) for o in TARGETS[part].reuse}  # not the runs of those tables
        own += [r.path for r in part_runs if r.path.name not in other and r.path.parent not in reused]
    if scale == "cpu":  # the budget's measure: the runs' CPU time per thread, on 2 jobs in grid order (CPU runs)
        secs = run_seconds(own, gpu=False)
        meta["budget"] = (wall_s(secs, CPU_BUDGET_JOBS), len(secs), CPU_BUDGET_JOBS) if secs else None
    if not runs:
        print(f"[{name}] no runs under {kept} or {sweep_dir}", file=sys.stderr)
        return 1
    out = results / t.results
    make_folder(out.parent)
    text = build_table(name, runs, out=out, meta=meta)
    if echo:
        print(text)
    print(f"wrote {out}.md", file=sys.stderr)
    return 0


def _damaged(results: Path, scale: str, allowed: bool) -> int:
    """Name each kept run of `scale` with a damaged file (left out of the reports); 1 if one is, unless `allowed`."""
    from highway_repro.report.runs import load_run

    runs = [load_run(p.parent, results) for kept in (f"*-{scale}", f"*-{scale}-gpu")
            for p in sorted(results.glob(f"*/runs/{kept}/*/metrics.json"))]
    damaged = [r for r in runs if r.status == "damaged"]
    for r in damaged:
        print(f"{'warning' if allowed else 'error'}: {r.error}: counted as damaged, left out of the statistics",
              file=sys.stderr)
    return int(bool(damaged) and not allowed)


def _safely(step, prefix: str = "", after_bug: str | None = None) -> int:
    """step()'s status (None: 0), or 1: a user error in one line (`error: <prefix><error>`), a bug its traceback."""
    try:
        return step() or 0
    except HighwayError as e:
        print(f"error: {prefix}{e}", file=sys.stderr)
    except Exception:
        import traceback

        traceback.print_exc()
        if after_bug:
            print(after_bug, file=sys.stderr)
    return 1


def _report(name: str, scale: str, runs_root: Path, results: Path, echo: bool = True) -> int:
    """report_table, its failure its own (a user error one line naming the table, a bug its traceback); 1 if failed."""
    return _safely(lambda: report_table(name, scale, runs_root, results, echo), f"[{name}] not reported: ",
                   f"[{name}] the report failed (above); its runs are kept")


def hold_tables(tables, scale: str, runs_root: Path) -> ExitStack:
    """The runner's lock of each table at `scale` (`<runs>/.locks/<table>-<scale>.lock`), all or none (BusyError)."""
    with ExitStack() as held:  # a lock that cannot be taken releases those taken before it
        for t in dict.fromkeys(tables):
            held.enter_context(take(runs_root / ".locks" / f"{t}-{scale}.lock", f"table {t} at scale {scale}",
                                    "one runner per table and scale"))
        return held.pop_all()


def train(names: list[str], args, results: Path, runs_root: Path) -> int:
    """Train what is missing of the tables `names` (a target with parts: each part) in one queue under their locks,
    each table's report as soon as its runs end; a study that reuses the runs of another table named here is planned
    once that table has ended (its runs of one folder name restored, not trained twice)."""
    tables = list(dict.fromkeys(p for n in names for p in TARGETS[n].parts or (n,)))
    args.backend = None
    if args.cluster == "slurm" and not args.estimate:  # no SLURM, an unknown partition: one line, nothing planned
        from highway_repro.runner.slurm import Cluster

        args.backend = Cluster(args.partition, args.preset, runs_root / ".slurm", args.jobs, args.detach, args.request)
    with ExitStack() if args.estimate else hold_tables(tables, args.scale, runs_root):
        first = [n for n in tables if not set(TARGETS[n].reuse) & set(tables)]
        stages = [first, [n for n in tables if n not in first]]

        def plans_of(stage: list[str], estimate: bool, pending: dict) -> list[TablePlan]:
            return [plan_table(n, args.scale, args.jobs, args.extra, runs_root, results, args.fresh, estimate,
                               {r for o in TARGETS[n].reuse for r in pending.get(o, ())},
                               args.group or TARGETS[n].group, split=args.cluster is not None) for n in stage]

        plans = plans_of(stages[0], args.estimate, {})
        pending = {p.name: set(p.todo) for p in plans}  # what the first stage trains (an estimate counts it as reused)
        later = plans_of(stages[1], True, pending) if stages[1] else []  # the second stage's plan, as it will be
        every = plans + later
        if len(every) > 1:
            cpu_s = sum(s * p.threads for p in every for s in p.secs)
            wall = wall_s([s for p in every for s in p.secs], args.jobs)
            unknown = [p.name for p in every if p.todo and not p.secs]
            print(f"[{'all' if args.all else 'queue'}] scale={args.scale}: estimated {cpu_s / 3600:.1f} CPU-hours, "
                  f"{duration(wall)} wall with {args.jobs} job(s) ± {MARGIN * 100:.0f} % across machines, the runs of "
                  "every table in one queue"
                  + (f" (without {', '.join(unknown)}: no estimate)" if unknown else ""), flush=True)
        if args.estimate:
            return 0
        status, reports = 0, []
        with ThreadPoolExecutor(max_workers=1) as reporter:  # one report at a time, while the queue goes on
            def report(name: str) -> None:
                reports.append(reporter.submit(_report, name, args.scale, runs_root, results))

            try:
                for i, stage in enumerate(s for s in stages if s):
                    if i:
                        print(f"[queue] {', '.join(stage)}: the tables whose runs they reuse have ended", flush=True)
                        plans = plans_of(stage, False, {})
                    for p in [p for p in plans if not p.commands]:  # nothing to train: reported at once
                        report(p.name)
                    status = run_queue(plans, args.jobs, lambda p: report(p.name), args.backend) or status
                    if args.detach:  # the tables that reuse their runs wait for the command that follows them
                        break
            except SystemExit:  # stopped: the reports not yet begun are dropped
                reporter.shutdown(wait=False, cancel_futures=True)
                raise
            for name in [n for n in names if TARGETS[n].parts]:  # the whole, once its parts are reported
                report(name)
            for r in reports:
                status = status or r.result()
        return status


def main(argv=None) -> int:
    ap = ArgumentParser(prog="python -m highway_repro.runner", description=__doc__.split("\n")[0])
    ap.add_argument("args", nargs="*", metavar="table | key=value",
                    help="one or more tables (see --list; their runs share one queue), then Hydra overrides for all")
    ap.add_argument("--all", action="store_true", help="every paper table, in order")
    ap.add_argument("--list", action="store_true", help="list the tables")
    ap.add_argument("--scale", default="cpu", choices=SCALES)
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (with --cluster: SLURM jobs in flight)")
    ap.add_argument("--group", default=None, help="runs of a row trained together: auto, a size, or 1 (alone)")
    ap.add_argument("--fresh", action="store_true", help="delete the sweep folder and ignore the kept runs")
    ap.add_argument("--results", default=None, help="results root (default: results/, or runs/smoke_results for smoke)")
    ap.add_argument("--runs", default="runs/sweeps", help="where sweep folders go")
    ap.add_argument("--report-only", action="store_true", help="only rebuild the report(s) from the kept runs")
    ap.add_argument("--allow-damaged", action="store_true", help="with --report-only: exit 0 beside damaged runs")
    ap.add_argument("--estimate", action="store_true", help="print the plan and its cost; train nothing")
    ap.add_argument("--cluster", choices=["slurm"], default=None, help="each run a SLURM job (docs/cluster.md)")
    ap.add_argument("--detach", action="store_true", help="with --cluster: return once the jobs are submitted")
    ap.add_argument("--partition", default=None, help="with --cluster slurm: the partition")
    ap.add_argument("--preset", choices=["cpu", "gpu"], default="cpu", help="with --cluster slurm: the job request")
    args = ap.parse_intermixed_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs={args.jobs}: runs at once, at least 1")
    if args.group not in (None, "auto") and not (args.group.isdigit() and int(args.group) >= 1):
        ap.error(f"--group={args.group}: runs trained together (valid: auto, or an integer >= 1)")
    if args.detach and args.cluster is None:
        ap.error("--detach: only with --cluster slurm (local runs end with the runner)")
    if args.list:
        print(f"  {'table':<20} {'make target':<30} what")
        for n, t in TARGETS.items():
            print(f"  {n:<20} {make_target(n):<30} {t.help}")
        return 0
    tables = list(dict.fromkeys(a for a in args.args if a in TARGETS))
    args.request = [a for a in args.args if args.cluster and a.startswith("hydra.launcher.")]  # the job request's
    args.extra = [a for a in args.args if a not in TARGETS and a not in args.request]
    for a in args.extra:
        if "=" not in a and not a.startswith("~"):
            ap.error(f"table={a!r} is not a table (valid: {', '.join(sorted(TARGETS))}) nor an override key=value")
    if launcher := [a for a in args.extra if a.startswith("hydra/launcher=")]:  # the user's launcher runs each job
        if args.group not in (None, "1"):
            ap.error(f"{launcher[-1]} with --group={args.group}: runs trained together go by hydra/launcher=grouped "
                     "(valid: --group 1, or no hydra/launcher)")
        args.group = "1"
    if bool(tables) == args.all:
        ap.error("name one or more tables (see --list) or give --all, not both")
    names = (REPORTS if args.report_only else PAPER_TABLES) if args.all else tables
    results = Path(args.results or ("runs/smoke_results" if args.scale == "smoke" else "results"))
    try:
        check_group_choices(args.extra, CONFIG_DIR)
        return _run(names, args, results, Path(args.runs))
    except HighwayError as e:  # a user mistake (a run folder's file, a config, a data file): one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2


def _run(names: list[str], args, results: Path, runs_root: Path) -> int:
    """The reports (--report-only), or the training of the tables, their reports, then results/summary.csv."""
    status = 0
    if args.report_only:
        make_folder(results)  # a --results under a file: one line before any report
        for name in names:
            parts = TARGETS[name].parts
            if args.all and not kept_folders(name, args.scale, results):
                continue  # make tables: only the tables that have kept runs (not only the record of a stopped start)
            try:  # the report's files are written in place, as the runner holding the table writes them at its end
                held = hold_tables(parts or (name,), args.scale, runs_root)
            except BusyError as e:  # that runner writes this report from the same files: the others go on
                print(f"warning: [{name}] not reported now: {e}", file=sys.stderr)
                continue
            with held:
                for part in parts if not args.all else ():  # (--all reports the parts under their own names)
                    status = _report(part, args.scale, runs_root, results) or status
                status = _report(name, args.scale, runs_root, results, echo=not args.all) or status
        status = _damaged(results, args.scale, args.allow_damaged) or status
    else:
        status = train(names, args, results, runs_root)
    if not args.estimate:
        from highway_repro.report import write_summary
        from highway_repro.report.ledger import write_ledger

        expected = {n: f"{TARGETS[n].help} (`make {make_target(n)}`)" for n in REPORTS}
        for write in (lambda: write_summary(results, expected), lambda: write_ledger(results)):
            # a damaged claims file is left out of the summary; a damaged ledger is named; a bug: the reports stand
            failed = _safely(lambda: print(f"wrote {w}", file=sys.stderr) if (w := write()) is not None else None)
            status = status or failed
    return status


if __name__ == "__main__":
    raise SystemExit(main())
