"""Run one paper table's sweep and build its report: what `make reproduce-<table>` calls.

    python -m highway_repro.reproduce hn_table1 --scale cpu [--jobs 2] [--fresh]

The sweep runs in `runs/sweeps/<table>-<scale>/` with `resume=auto`, so running
the same command again continues unfinished jobs and skips finished ones
(`--fresh` starts over). The report goes to `results/<paper>/<name>.md/.csv/.png`
(for `--scale smoke` to `runs/smoke_results/` unless `--results` says otherwise),
with the command, scale, seeds and wall time written into it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Target:
    out: str  # results/<out>.md
    experiment: str
    sweep: str | None = None  # configs/sweep/<sweep>.yaml; None = a single run
    overrides: dict = field(default_factory=dict)  # scale -> extra command-line overrides
    after: str | None = None  # module run on the run folder afterwards (analysis)


TARGETS = {
    "demo": Target("demo/demo", "demo", "demo"),
    "hn_fig1": Target("highway_networks/fig1", "hn_fig1", "hn_fig1",
                      {"paper": ["trial=range(0,100)"], "smoke": ["trial=0", "model.depth=4"]}),
    "hn_table1": Target("highway_networks/table1", "hn_table1", "hn_table1",
                        {"paper": ["seed=0,1,2,3,4"], "smoke": ["seed=0", "model.width=4"]}),
    "hn_cifar": Target("highway_networks/cifar", "hn_cifar", "hn_cifar",
                       {"paper": ["seed=0,1,2,3,4"], "smoke": ["seed=0"]}),
    "hn_analysis": Target("highway_networks/analysis", "hn_analysis", None, after="highway_repro.analysis.run"),
}
_PTB = {"paper": ["seed=1111"], "smoke": ["seed=0"]}  # cpu: the sweep's seeds 0,1,2
_ENWIK8 = {"paper": ["seed=1111"], "cpu": ["seed=0"], "smoke": ["seed=0"]}  # cpu: one seed
TARGETS.update({
    "ht_char_ptb": Target("highway_transformer/char_ptb_l3", "ht_char_ptb", "ht_char_ptb", _PTB),
    "ht_word_ptb": Target("highway_transformer/word_ptb_rt", "ht_word_ptb", "ht_word_ptb", _PTB),
    "ht_char_ptb_rt": Target("highway_transformer/char_ptb_rt", "ht_char_ptb_rt", "ht_char_ptb_rt", _PTB),
    "ht_word_ptb_l3": Target("highway_transformer/word_ptb_l3", "ht_word_ptb_l3", "ht_word_ptb_l3", _PTB),
    "ht_enwik8_l6": Target("highway_transformer/enwik8_l6", "ht_enwik8_l6", "ht_enwik8_l6", _ENWIK8),
    "ht_enwik8_l12": Target("highway_transformer/enwik8_l12", "ht_enwik8_l12", "ht_enwik8_l12", _ENWIK8),
})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m highway_repro.reproduce", description=__doc__.split("\n")[0])
    ap.add_argument("table", choices=sorted(TARGETS))
    ap.add_argument("--scale", default="cpu", choices=("paper", "cpu", "smoke"))
    ap.add_argument("--jobs", type=int, default=1, help="parallel jobs (joblib launcher); threads are split between them")
    ap.add_argument("--fresh", action="store_true", help="delete the sweep folder first")
    ap.add_argument("--results", default=None, help="results root (default: results/, or runs/smoke_results for smoke)")
    ap.add_argument("--runs", default="runs/sweeps", help="where sweep folders go")
    ap.add_argument("--report-only", action="store_true", help="only rebuild the report from finished runs")
    ap.add_argument("extra", nargs="*", help="more Hydra overrides")
    args = ap.parse_intermixed_args(argv)

    t = TARGETS[args.table]
    sweep_dir = Path(args.runs) / f"{args.table}-{args.scale}"
    results = Path(args.results or ("runs/smoke_results" if args.scale == "smoke" else "results"))
    shown = "make demo" if args.table == "demo" else f"make reproduce-{args.table.replace('_', '-')} SCALE={args.scale}"
    if args.extra:  # overrides given by hand are part of the command
        shown = shlex.join([sys.executable.rsplit("/", 1)[-1], "-m", "highway_repro.reproduce", args.table,
                            "--scale", args.scale, *args.extra])
    status, wall = 0, None
    if not args.report_only:
        if args.fresh and sweep_dir.exists():
            shutil.rmtree(sweep_dir)
        cmd = [sys.executable, "-m", "highway_repro.train", f"experiment={t.experiment}", f"scale={args.scale}",
               "resume=auto", "trainer.progress=false"]
        if t.sweep:
            cmd[3:3] = ["-m", f"sweep={t.sweep}"]
            cmd += [f"hydra.sweep.dir={sweep_dir}"]
            if args.jobs > 1:
                threads = max(1, (os.cpu_count() or 1) // args.jobs)
                cmd += ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={args.jobs}", f"threads={threads}"]
        else:
            cmd += [f"hydra.run.dir={sweep_dir}"]
        cmd += t.overrides.get(args.scale, []) + args.extra
        print("+", shlex.join(cmd), flush=True)
        start = time.time()
        status = subprocess.call(cmd, cwd=ROOT)
        wall = time.time() - start
        sweep_dir.mkdir(parents=True, exist_ok=True)
        record = sweep_dir / "reproduce.json"  # wall time and commands add up over invocations (resumes)
        prev = json.loads(record.read_text()) if record.exists() and not args.fresh else {}
        commands = prev.get("commands", [prev["command"]] if "command" in prev else []) + [shown]
        wall += prev.get("wall_s", 0.0)
        record.write_text(json.dumps({"commands": commands, "wall_s": wall, "status": status}))
        shown = list(dict.fromkeys(commands))
        if status:
            print(f"the sweep exited with status {status}; building the report from the jobs that finished",
                  file=sys.stderr)
    elif (sweep_dir / "reproduce.json").exists():
        record = json.loads((sweep_dir / "reproduce.json").read_text())
        wall = record.get("wall_s")
        shown = list(dict.fromkeys(record.get("commands", [record.get("command", shown)])))
    commands = shown if isinstance(shown, list) else [shown]
    from highway_repro.report import build_table, load_runs, write_summary

    if t.after:
        cmd = [sys.executable, "-m", t.after, str(sweep_dir), "--out", str(results / t.out), "--scale", args.scale]
        cmd += [a for c in commands for a in ("--command", c)] + (["--wall-s", str(wall)] if wall else [])
        status = subprocess.call(cmd, cwd=ROOT) or status
        write_summary(results)
        return status
    runs = load_runs(sweep_dir)
    if not runs:
        print(f"no runs under {sweep_dir}", file=sys.stderr)
        return status or 1
    meta = {"commands": commands, "scale": args.scale, "wall_s": wall}
    print(build_table(args.table, runs, results / t.out, meta))
    print(f"wrote {results / t.out}.md and {write_summary(results)}", file=sys.stderr)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
