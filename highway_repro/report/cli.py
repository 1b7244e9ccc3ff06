"""The generic report: any sweep folder -> a Markdown + CSV table (mean ± std over seeds) and curves.

    python -m highway_repro.report runs/sweeps/x --group-by model.kind --metrics val/loss,test/acc \\
        --curve val/loss --out results/x
    python -m highway_repro.report runs/sweeps/hn_table1-cpu --table hn_table1 --out results/highway_networks/table1
    python -m highway_repro.report --summary results        # results/summary.csv + results/README.md

Failed jobs keep their row: the cell says why instead of being dropped.
"""

from __future__ import annotations

import argparse
import csv
import io
from pathlib import Path

from highway_repro.report import stats
from highway_repro.report.header import header
from highway_repro.report.plots import Panel, plot
from highway_repro.report.runs import Run, load_runs
from highway_repro.report.spec import mean_curve, mean_pm
from highway_repro.report.summary import write_summary
from highway_repro.report.tables import TABLES, build_table


def varying_keys(runs: list[Run]) -> list[str]:
    """Override keys whose value differs between runs (seed aside)."""
    keys = sorted({k for r in runs for k in r.overrides})
    return [k for k in keys if k != "seed" and len({r.overrides.get(k) for r in runs}) > 1]


def aggregate(runs: list[Run], group_by: list[str], metrics: list[str]) -> list[dict]:
    """One row per group: key, n finished, the failed runs' errors, and per metric (mean, std, values)."""
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        groups.setdefault(tuple(str(r.get(k, "")) for k in group_by), []).append(r)
    rows = []
    for key, members in groups.items():
        done = [r for r in members if r.done]
        row = {"key": dict(zip(group_by, key)), "n": len(done), "runs": members,
               "failed": [f"{r.path.name}: {r.error}" for r in members if not r.done]}
        for m in metrics:
            vals = [r.metric(m) for r in done if r.metric(m) == r.metric(m)]
            row[m] = (*stats.mean_std(vals), vals)
        rows.append(row)
    return rows


def to_markdown(rows: list[dict], group_by: list[str], metrics: list[str], digits: int = 4) -> str:
    head = [*group_by, "n", *metrics, "failed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["key"][k] for k in group_by] + [str(row["n"])]
        cells += [mean_pm(row[m][2], digits) for m in metrics]
        cells.append("; ".join(row["failed"]).replace("|", "/"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def to_csv(rows: list[dict], group_by: list[str], metrics: list[str]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow([*group_by, "n", *[f"{m}_{s}" for m in metrics for s in ("mean", "std")], "failed"])
    for row in rows:
        w.writerow([row["key"][k] for k in group_by] + [row["n"]]
                   + [v for m in metrics for v in row[m][:2]] + ["; ".join(row["failed"])])
    return buf.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m highway_repro.report", description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="*", help="sweep or run folders")
    ap.add_argument("--table", choices=sorted(TABLES), help="a paper table (paper values, claims, floors)")
    ap.add_argument("--group-by", default=None, help="comma-separated config keys (default: the overrides that "
                                                      "vary, seed aside)")
    ap.add_argument("--metrics", default="val/loss,test/loss", help="comma-separated metrics.json keys")
    ap.add_argument("--curve", default=None, help="metrics.jsonl key to plot against step")
    ap.add_argument("--out", default=None, help="output prefix: writes PREFIX.md, PREFIX.csv (+ PREFIX.png)")
    ap.add_argument("--command", action="append", default=None,
                    help="a command that produced the runs (written into the header; repeatable)")
    ap.add_argument("--wall-s", type=float, default=None, help="wall time of the command(s) in seconds")
    ap.add_argument("--scale", default=None)
    ap.add_argument("--summary", default=None, metavar="RESULTS",
                    help="write RESULTS/summary.csv and RESULTS/README.md from every *.claims.json below RESULTS")
    args = ap.parse_args(argv)
    if args.summary and not args.runs:
        print(f"wrote {write_summary(Path(args.summary))}")
        return 0
    runs = [r for root in args.runs for r in load_runs(Path(root))]
    if not runs:
        ap.error(f"no run folders (with metrics.json or .hydra/) under {', '.join(args.runs) or '(none given)'}")
    meta = {"commands": args.command or [], "scale": args.scale, "wall_s": args.wall_s}
    if args.table:
        if not args.out:
            ap.error("--table needs --out")
        print(build_table(args.table, runs, Path(args.out), meta))
    else:
        group_by = args.group_by.split(",") if args.group_by else varying_keys(runs)
        metrics = args.metrics.split(",")
        rows = aggregate(runs, group_by, metrics)
        md = to_markdown(rows, group_by, metrics)
        print(md)
        if args.out:
            out = Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.with_name(out.name + ".md").write_text(header("Report", runs, meta) + md)
            out.with_name(out.name + ".csv").write_text(to_csv(rows, group_by, metrics))
            if args.curve:
                series = {}
                for row in rows:
                    xs, ys = mean_curve(row["runs"], args.curve)
                    if xs:
                        series[", ".join(f"{k.split('.')[-1]}={v}" for k, v in row["key"].items()) or "run"] = (xs, ys)
                plot(out.with_name(out.name + ".png"), [Panel("", series, args.curve)])
    if args.summary:
        write_summary(Path(args.summary))
    return 0
