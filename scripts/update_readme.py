"""README.md's "Reproduction at a glance" from results/summary.csv (`make readme`; standard library only).

One line per claim (who makes it: `paper`, or `ours` for a check the papers do not state for that table, such as
their general claim on a table they did not report; paper value, ours, scale, verdict with its 95 % interval, link
to the table), the paper's claims first, then one line per floor of the cpu scale; a study's parts (rows with
`part_of`) are left out, since the study's combined table holds them. results/summary.csv is written
by `make tables` (highway_repro.report's write_summary), which also writes the index page results/README.md.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- glance:begin -->", "<!-- glance:end -->"


def _num(x: str) -> str:
    try:
        v = float(x)
    except ValueError:
        return x or "—"
    return f"{v:.4g}"


def _verdict(r: dict) -> str:
    ci = (f" [{_num(r['ci_low'])}, {_num(r['ci_high'])}]" if r["ci_low"] else
          f" ({r['detail']})" if r["detail"].startswith("not testable") else " (no interval)")  # report.spec.UNTESTED
    return f"**{r['verdict']}**{ci}"


def _scale(r: dict) -> str:
    """The scale, and for a table whose grid is not all trained yet: how much of it is."""
    n, planned = r.get("runs") or "", r.get("runs_planned") or ""
    partial = n.isdigit() and planned.isdigit() and int(planned) > int(n)
    return f"{r['scale']}, **partial: {n} of {planned} runs**" if partial else r["scale"]


def glance(rows: list[dict]) -> str:
    rows = [r for r in rows if not r.get("part_of")]  # a study's parts: their rows are in its combined table
    claims = sorted((r for r in rows if r["kind"] == "claim"), key=lambda r: r["paper_claim"] != "yes")  # stable
    floors = [r for r in rows if r["kind"] == "floor"]
    lines = ["| table | claim | by | paper | ours | vs | scale | verdict, 95 % CI of what is tested | results |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in claims:
        by = "paper" if r["paper_claim"] == "yes" else "ours"
        lines.append(f"| {r['table']} | {r['row']} {r['claim']} | {by} | {_num(r['paper'])} | {_num(r['mean'])} "
                     f"({r['metric']}, {r['split']}, n {r['n_seeds']}) | {r['compared_with']} "
                     f"{_num(r['compared_mean']) if r['compared_mean'] else ''} | {_scale(r)} | {_verdict(r)} | "
                     f"[{r['file']}](results/{r['file']}) |")
    lines += ["", "| table | row | floor | ours | met | scale | results |", "|---|---|---|---|---|---|---|"]
    for r in floors:
        lines.append(f"| {r['table']} | {r['row']} | {r['claim'].replace('reaches the floor ', '')} | "
                     f"{_num(r['mean'])} (n {r['n_seeds']}) | {r['floor_met']} | {_scale(r)} | "
                     f"[{r['file']}](results/{r['file']}) |")
    return "\n".join(lines)


def main(root: Path = ROOT) -> int:
    readme, summary = root / "README.md", root / "results" / "summary.csv"
    rows = []
    if summary.exists():
        with open(summary, newline="") as fh:
            rows = list(csv.DictReader(fh))
    body = glance(rows) if rows else ("_results/summary.csv has no claims yet: `make tables` builds it from the run "
                                      "folders of the tables._")
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        print(f"README.md has no {BEGIN} ... {END} markers", file=sys.stderr)
        return 1
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    readme.write_text(head + BEGIN + "\n" + body + "\n" + END + tail)
    rows = [r for r in rows if not r.get("part_of")]
    print(f"README.md: {sum(r['kind'] == 'claim' and r['paper_claim'] == 'yes' for r in rows)} paper claims, "
          f"{sum(r['kind'] == 'claim' and r['paper_claim'] != 'yes' for r in rows)} of ours, "
          f"{sum(r['kind'] == 'floor' for r in rows)} floors")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
