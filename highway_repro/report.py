"""Run folders -> tables (Markdown + CSV, mean ± std over seeds) and curves (PNG).

Reads only run folders: `<job>/.hydra/overrides.yaml`, `<job>/metrics.json`,
`<job>/metrics.jsonl`. Never a web API.

    python -m highway_repro.report multirun/hn_table1/2026-11-29_10-00-00 \
        --group-by model.width,model.kind --metrics test/acc,test/loss --curve val/loss --out results/x

Jobs that failed keep their row: the cell says `failed: <error>` instead of
being dropped. Paper-specific tables (`--table NAME`) add the paper's numbers,
the relative change against the baseline and whether the claim held; their
specs live in `highway_repro/tables.py`.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import yaml

SEED_KEYS = ("seed",)


@dataclass
class Run:
    path: Path
    overrides: dict
    final: dict
    status: str
    error: str | None = None
    _history: list | None = field(default=None, repr=False)

    @property
    def history(self) -> list[dict]:
        if self._history is None:
            self._history = []
            p = self.path / "metrics.jsonl"
            if p.exists():
                for line in p.read_text().splitlines():
                    try:
                        self._history.append(json.loads(line))
                    except json.JSONDecodeError:
                        continue
        return self._history

    def key(self, group_by) -> tuple:
        return tuple(self.overrides.get(k, "") for k in group_by)


def _parse_overrides(lines) -> dict:
    out = {}
    for item in lines or []:
        k, _, v = str(item).partition("=")
        out[k.lstrip("+~")] = v
    return out


def load_runs(root: Path) -> list[Run]:
    """Every job folder under `root` (a sweep folder or a single run folder)."""
    root = Path(root)
    runs = []
    for ov in sorted(root.rglob(".hydra/overrides.yaml")):
        job = ov.parent.parent
        overrides = _parse_overrides(yaml.safe_load(ov.read_text()))
        m = job / "metrics.json"
        if m.exists():
            final = json.loads(m.read_text())
            status = final.get("status", "unknown")
        else:
            final, status = {}, "missing"
        error = final.get("error")
        if error is None and status == "missing":
            error = "no metrics.json (job died or still running)"
        elif error is None and status != "done":
            error = f"status {status} at step {final.get('step')}"
        runs.append(Run(job, overrides, final, status, error))
    return runs


def _varying_keys(runs: list[Run]) -> list[str]:
    keys = sorted({k for r in runs for k in r.overrides})
    return [k for k in keys if k not in SEED_KEYS and len({r.overrides.get(k) for r in runs}) > 1]


def mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def aggregate(runs: list[Run], group_by: list[str], metrics: list[str]) -> list[dict]:
    """One row per group: n done, n failed, errors, and per metric (mean, std, values)."""
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        groups.setdefault(r.key(group_by), []).append(r)
    rows = []
    for key, members in groups.items():
        done = [r for r in members if r.status == "done"]
        row = {"key": dict(zip(group_by, key)), "n": len(done), "runs": members,
               "failed": [f"{r.path.name}: {r.error}" for r in members if r.status != "done"]}
        for m in metrics:
            vals = [float(r.final[m]) for r in done if isinstance(r.final.get(m), (int, float))]
            row[m] = (*mean_std(vals), vals)
        rows.append(row)
    return rows


def fmt(mean: float, std: float, n: int, digits: int = 4) -> str:
    if n == 0 or math.isnan(mean):
        return "—"
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if n > 1 else f"{mean:.{digits}f}"


def to_markdown(rows: list[dict], group_by: list[str], metrics: list[str], digits: int = 4) -> str:
    head = [*group_by, "n", *metrics, "failed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [str(row["key"][k]) for k in group_by] + [str(row["n"])]
        cells += [fmt(*row[m][:2], row["n"], digits) for m in metrics]
        cells.append("; ".join(row["failed"]).replace("|", "/") if row["failed"] else "")
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


def curves(rows: list[dict], metric: str, group_by: list[str]) -> dict[str, tuple[list, list]]:
    """Per group: (steps, mean of `metric` over the group's finished runs at each step)."""
    out = {}
    for row in rows:
        by_step: dict[int, list[float]] = {}
        for r in row["runs"]:
            for rec in r.history:
                v = rec.get(metric)
                if isinstance(v, (int, float)):
                    by_step.setdefault(rec["step"], []).append(float(v))
        if by_step:
            steps = sorted(by_step)
            label = ", ".join(f"{k.split('.')[-1]}={row['key'][k]}" for k in group_by) or "run"
            out[label] = (steps, [statistics.fmean(by_step[s]) for s in steps])
    return out


def plot_curves(series: dict, metric: str, path: Path, title: str = "", logy: bool = False,
                reference: dict | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, label=label, lw=1.5)
    for label, (xs, ys) in (reference or {}).items():
        ax.plot(xs, ys, "--", marker="o", ms=3, label=label, alpha=0.7)
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    if logy:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m highway_repro.report", description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="sweep or run folders")
    ap.add_argument("--table", help="a paper table spec from highway_repro/tables.py (adds paper values and claims)")
    ap.add_argument("--group-by", default=None, help="comma-separated override keys (default: those that vary, but seed)")
    ap.add_argument("--metrics", default="val/loss,test/loss", help="comma-separated metrics.json keys")
    ap.add_argument("--curve", default=None, help="metrics.jsonl key to plot against step")
    ap.add_argument("--out", default=None, help="output prefix: writes PREFIX.md, PREFIX.csv (+ PREFIX.png)")
    ap.add_argument("--command", default=None, help="the command that produced the runs (written into the table)")
    ap.add_argument("--wall-s", type=float, default=None, help="wall time of that command in seconds")
    ap.add_argument("--scale", default=None)
    args = ap.parse_args(argv)

    runs = [r for root in args.runs for r in load_runs(Path(root))]
    if not runs:
        ap.error(f"no run folders (with .hydra/overrides.yaml) under {', '.join(args.runs)}")
    if args.table:
        from highway_repro.tables import build_table

        text = build_table(args.table, runs, out=args.out, command=args.command, wall_s=args.wall_s,
                           scale=args.scale)
        print(text)
        return 0
    group_by = args.group_by.split(",") if args.group_by else _varying_keys(runs)
    metrics = args.metrics.split(",")
    rows = aggregate(runs, group_by, metrics)
    md = to_markdown(rows, group_by, metrics)
    print(md)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        header = ""
        if args.command:
            header += f"Command: `{args.command}`\n\n"
        if args.wall_s is not None:
            header += f"Wall time: {args.wall_s:.0f} s\n\n"
        out.with_suffix(".md").write_text(header + md)
        out.with_suffix(".csv").write_text(to_csv(rows, group_by, metrics))
        if args.curve:
            plot_curves(curves(rows, args.curve, group_by), args.curve, out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
