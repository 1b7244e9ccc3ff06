"""Claim rows: `<out>.claims.json` beside each table, `results/summary.csv` over all of them, and the index
page `results/README.md` (issue 12 item 7), which also names the expected tables not made yet.

A claims file holds one entry per table row (kind `row`: the table's main number, its 95 % interval, the paper's
number, the floor and whether it is met) and one per claim or floor (kind `claim` / `floor`: the tested
interval and the verdict).
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from pathlib import Path

from highway_repro.report import stats
from highway_repro.report.spec import UNTESTED, Rendered, floor_met

COLUMNS = ["table", "row", "kind", "metric", "split", "n_seeds", "mean", "std", "ci_low", "ci_high", "paper",
           "floor", "floor_met", "claim", "verdict", "compared_with", "compared_mean", "diff", "paper_claim",
           "detail", "scale", "runs", "runs_planned", "part_of", "file"]
# runs, runs_planned: the table's (partial: fewer); part_of: the study whose combined table also holds these rows
# (README.md's glance shows that one only)


def _num(x):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    return float(f"{x:.6g}")


def claim_rows(name: str, t: Rendered, scale: str | None) -> list[dict]:
    spec, m = t.spec, t.spec.primary
    floors = {r["claim"].row: r for r in t.results if r["claim"].kind == "floor"}
    out = []
    for row in t.rows:
        ranked = [v for v, _ in row.ranked(m)]
        vals = ranked[:1] if spec.primary_pick == "best" else ranked
        mean, std = stats.mean_std(vals)
        ci = None if spec.primary_pick == "best" else stats.mean_interval(vals)
        f = floors.get(row.id)
        out.append({"table": name, "row": row.name, "kind": "row", "metric": m.metric + (
            " (best run)" if spec.primary_pick == "best" else ""), "split": m.split, "n_seeds": len(row.done),
            "mean": _num(mean), "std": _num(std) if spec.primary_pick != "best" else None,
            "ci_low": _num(ci[0]) if ci else None, "ci_high": _num(ci[1]) if ci else None,
            "paper": _num(spec.paper_of(row.id, m.split)) if spec.paper_of else None,
            "floor": f["claim"].against if f else None, "floor_met": floor_met(f) if f else None,
            "claim": "", "verdict": "", "scale": scale})
    for r in t.results:
        c = r["claim"]
        ci = r["ci"]
        against = (t.by_id[c.against].name if c.against in t.by_id else "/".join(c.against)) \
            if isinstance(c.against, tuple) else c.against
        out.append({"table": name, "row": r["label"].replace("`", ""), "kind": c.kind, "metric": c.measure.metric,
                    "split": c.measure.split, "n_seeds": r["n"], "mean": _num(r["mean"]),
                    "std": _num(r["std"]) if c.pick != "best" else None,
                    "ci_low": _num(ci[0]) if ci else None, "ci_high": _num(ci[1]) if ci else None,
                    "paper": _num(c.paper_value), "floor": c.against if c.kind == "floor" else None,
                    "floor_met": floor_met(r) if c.kind == "floor" else None,
                    "claim": c.text + c.paper_note, "verdict": r["verdict"], "compared_with": against,
                    "compared_mean": _num(r["other_mean"]), "diff": _num(r["diff"]), "paper_claim": c.paper,
                    "detail": r["detail"].replace("`", ""), "scale": scale})
    return out


def write_claims(name: str, t: Rendered, out: Path, meta: dict, runs: int | None = None) -> Path:
    """`<out>.claims.json`: {table, title, scale, file (the table's .md, relative to this file), runs (the runs
    of the table: done, failed or missing), runs_planned (the runs of its grid, from the runner's plan; None
    when unknown), part_of (the target whose combined table reads this one's runs, or None), rows}."""
    out = Path(out)
    path = out.with_name(out.name + ".claims.json")
    path.write_text(json.dumps({"table": name, "title": t.spec.title, "scale": meta.get("scale"),
                                "file": out.name + ".md", "runs": runs,
                                "runs_planned": meta.get("planned"), "part_of": meta.get("part_of"),
                                "rows": claim_rows(name, t, meta.get("scale"))},
                               indent=1) + "\n")
    return path


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)


ARCHIVE = "archive"  # results/archive/: tables and runs of superseded recipes


def write_summary(results_root: Path, expected: dict | None = None) -> Path:
    """`<results_root>/summary.csv` from every `*.claims.json` below it but for `archive/` (tables of superseded
    recipes, kept for the record: indexed, not summarised), and the index `<results_root>/README.md`.
    `expected`: table name -> how to make it (the runner passes every report it knows); the index names those
    without a claims file."""
    root = Path(results_root)
    files = sorted(f for f in root.rglob("*.claims.json") if f.relative_to(root).parts[0] != ARCHIVE)
    tables, rows = [], []
    for f in files:
        d = json.loads(f.read_text())
        rel = (f.parent / d["file"]).relative_to(root).as_posix()
        tables.append((d, rel))
        rows += [{**r, "file": rel, "runs": d.get("runs"), "runs_planned": d.get("runs_planned"),
                  "part_of": d.get("part_of")} for r in d["rows"]]
    root.mkdir(parents=True, exist_ok=True)
    path = root / "summary.csv"
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows({k: _cell(r.get(k)) for k in COLUMNS} for r in rows)
    lines = ["# Results", "",
             "Every table of the two papers as reproduced here; each file names the command that made it, the scale, "
             "seeds, wall time, CPU-hours and machine. `summary.csv` has one line per table row, claim and floor "
             "(written by `make tables`).", "",
             "| table | scale | runs | claims held / did not hold / not resolved (not testable yet) | floors met |",
             "|---|---|---|---|---|"]
    for d, rel in tables:
        v = Counter(r["verdict"] for r in d["rows"] if r["kind"] == "claim")
        untested = sum(1 for r in d["rows"] if r["kind"] == "claim" and r.get("detail", "").startswith(UNTESTED))
        fl = [r["floor_met"] for r in d["rows"] if r["kind"] == "floor"]
        n, planned = d.get("runs"), d.get("runs_planned")
        runs = "not recorded" if n is None else f"{n} of {planned} (partial)" if planned and planned > n else str(n)
        lines.append(f"| [{d['title']}]({rel}) | {d.get('scale') or '?'} | {runs} | {v[stats.HELD]} / "
                     f"{v[stats.NOT_HELD]} / {v[stats.NOT_RESOLVED]}{f' ({untested})' if untested else ''} | "
                     f"{f'{sum(fl)} of {len(fl)}' if fl else '—'} |")
    made = {d["table"] for d, _ in tables}
    missing = [how for n, how in (expected or {}).items() if n not in made]
    if missing:
        lines += ["", "Not made yet (no kept run, so no table file): " + "; ".join(missing) + "."]
    listed = {rel for _, rel in tables} | {"README.md"}
    others = [p.relative_to(root).as_posix() for p in sorted(root.rglob("*.md"))]
    others = [o for o in others if o not in listed]
    archived = [o for o in others if o.startswith(ARCHIVE + "/")]
    others = [o for o in others if o not in archived]
    if others:
        lines += ["", "Other reports (benchmarks, or tables written before claims files existed): "
                  + ", ".join(f"[{o}]({o})" for o in others) + "."]
    if archived:
        lines += ["", "Superseded (tables of earlier recipes, kept for the record; not in `summary.csv`): "
                  + ", ".join(f"[{o}]({o})" for o in archived) + "."]
    (root / "README.md").write_text("\n".join(lines) + "\n")
    return path
