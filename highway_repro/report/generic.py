"""The generic report: any sweep folder -> a Markdown + CSV table (mean ± std over seeds) and curves.

    python -m highway_repro.report runs/sweeps/x --group-by model.kind --metrics val/loss,test/acc --out results/x
    python -m highway_repro.report runs/sweeps/hn_table1-cpu --table hn_table1 --out results/highway_networks/table1
"""

from __future__ import annotations

import sys
from pathlib import Path

from highway_repro import files
from highway_repro.errors import ArgumentParser, HighwayError, make_folder

from highway_repro.report.header import header
from highway_repro.report.plots import curve_panel, plot
from highway_repro.report.runs import load_runs
from highway_repro.report.measures import Measure, count, stat
from highway_repro.report.spec import TableSpec, render
from highway_repro.report.tables import build_table, registry


def main(argv=None) -> int:
    try:
        return _main(argv)
    except HighwayError as e:  # a run folder's file that is not plain data, say: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2


def _main(argv=None) -> int:
    ap = ArgumentParser(prog="python -m highway_repro.report", description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="*", help="sweep or run folders")
    ap.add_argument("--table", choices=sorted(registry()), help="a paper table (paper values, claims, floors)")
    ap.add_argument("--group-by", help="comma-separated config keys (default: the overrides that vary, seed aside)")
    ap.add_argument("--metrics", default="val/loss,test/loss", help="comma-separated metrics.json keys")
    ap.add_argument("--curve", help="metrics.jsonl key to plot against step")
    ap.add_argument("--out", help="output prefix: writes PREFIX.md, PREFIX.csv (+ PREFIX.png)")
    ap.add_argument("--command", action="append", help="a command that produced the runs (repeatable)")
    ap.add_argument("--wall-s", type=float, help="wall time of the command(s) in seconds")
    ap.add_argument("--scale")
    args = ap.parse_args(argv)
    runs = [r for root in args.runs for r in load_runs(Path(root))]
    if not runs:
        ap.error(f"no run folders (with metrics.json or .hydra/) under {', '.join(args.runs) or '(none given)'}")
    scales = {str(r.get("scale_name")) for r in runs if r.get("scale_name") is not None}
    meta = {"commands": args.command or [], "scale": args.scale or ", ".join(sorted(scales)) or None,
            "wall_s": args.wall_s}
    if args.table:
        if not args.out:
            ap.error("--table needs --out")
        print(build_table(args.table, runs, Path(args.out), meta))
    else:
        varying = [k for k in sorted({k for r in runs for k in r.overrides})
                   if k != "seed" and len({r.overrides.get(k) for r in runs}) > 1]
        group_by = args.group_by.split(",") if args.group_by else varying
        metrics = args.metrics.split(",")
        damaged = [r for r in runs if r.status == "damaged"]
        if damaged and all(r.status in ("damaged", "missing") for r in runs):  # nothing to report: say which file
            ap.error(f"{len(damaged)} run folder(s) hold a damaged file, no run a readable one: {damaged[0].error}")
        for key in [k for k in group_by if all(r.get(k) is None for r in runs)]:  # a typo would pool every run
            ap.error(f"--group-by {key}: no run has this config key (e.g. model.kind, model.depth, variant)")
        for key in [k for k in metrics if all(k not in r.final for r in runs)]:
            known = sorted({k for r in runs for k in r.final if "/" in k})
            ap.error(f"--metrics {key}: no run's metrics.json has it (valid: {', '.join(known)})")
        if args.curve and not any(r.history_values(args.curve) for r in runs):
            ap.error(f"--curve {args.curve}: no run's metrics.jsonl has it")
        measures = [Measure(m, m) for m in metrics]
        spec = TableSpec("Report", keys=tuple(group_by), columns=(count(), *map(stat, measures)), primary=measures[0])
        t, md, csv_text = render(spec, runs)
        print(md)
        if args.out:
            out = Path(args.out)
            make_folder(out.parent)
            files.write_atomic(out.with_name(out.name + ".md"), header("Report", runs, meta) + md)
            files.write_atomic(out.with_name(out.name + ".csv"), csv_text)
            if args.curve:
                plot(out.with_name(out.name + ".png"), [curve_panel(t.rows, args.curve, "")])
    return 0
