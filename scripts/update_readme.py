"""README.md's "Reproduction at a glance" from results/summary.csv (`make readme`; standard library only).

The four verdicts in two lines, the forest plot results/claims.png, the counts, then one line per distinct
comparison (kind `claim`: a comparison that several tables hold is shown once, in its home table; who makes it:
`paper`, or `ours` for a check the papers do not state for that table, such as their general claim on a table they
did not report; paper value, ours, scale, verdict with its 95 % interval, the Holm verdict within the table's family,
delta, link to the table), the paper's claims first, then one line per floor of the cpu scale (a study's parts,
rows with `part_of`, left out). results/summary.csv is written by `make tables` (highway_repro.report's
write_summary), which also writes results/claims.png and the index page results/README.md.
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


VERDICTS = ("HELD", "DID NOT HOLD", "NO DIFFERENCE", "NOT RESOLVED")
EXPLAINED = ("A verdict comes from the 95 % interval of what a claim compares: **HELD** = wholly on the claim's side, "
             "**DID NOT HOLD** = wholly on the other side,\n**NO DIFFERENCE** = it contains 0 and lies within +-delta "
             "(the metric's equivalence margin, `papers.MARGINS`), **NOT RESOLVED** = none of these: too few runs to "
             "tell.")


def _verdict(r: dict) -> str:
    ci = (f" [{_num(r['ci_low'])}, {_num(r['ci_high'])}]" if r["ci_low"] else
          f" ({r['detail']})" if r["detail"].startswith("not testable") else " (no interval)")  # report.spec.UNTESTED
    need = f"; a decision needs ~{r['seeds_needed']} seeds per row" if r.get("seeds_needed") else ""
    return f"**{r['verdict']}**{ci}{need}"


def counts(claims: list[dict]) -> str:
    """The distinct comparisons, the paper's among them, and the verdicts (raw and Holm) of each set."""
    def tally(rs, key):
        return ", ".join(f"{sum((r[key] or r['verdict']) == v for r in rs)} {v}" for v in VERDICTS)

    paper = [r for r in claims if r["paper_claim"] == "yes"]
    open_ = sum(r["verdict"] == "NOT RESOLVED" for r in paper)
    share = f"{100 * open_ / len(paper):.0f} %" if paper else "—"
    return (f"{len(claims)} distinct comparisons: {tally(claims, 'verdict')} (Holm within each table: "
            f"{tally(claims, 'holm_verdict')}). Of them {len(paper)} are the papers' claims: {tally(paper, 'verdict')} "
            f"(Holm: {tally(paper, 'holm_verdict')}); NOT RESOLVED: {share}.")


def _scale(r: dict) -> str:
    """The scale, and for a table whose grid is not all trained yet: how much of it is."""
    n, planned = r.get("runs") or "", r.get("runs_planned") or ""
    partial = n.isdigit() and planned.isdigit() and int(planned) > int(n)
    return f"{r['scale']}, **partial: {n} of {planned} runs**" if partial else r["scale"]


def glance(rows: list[dict]) -> str:
    claims = sorted((r for r in rows if r["kind"] == "claim"), key=lambda r: r["paper_claim"] != "yes")  # stable
    floors = [r for r in rows if r["kind"] == "floor" and not r.get("part_of")]  # parts: in the combined table
    lines = [EXPLAINED, "", "![every distinct comparison: difference, 95 % interval, +-delta, the paper's effect]"
             "(results/claims.png)", "", counts(claims), "",
             "| table | claim | by | paper | ours | vs | scale | verdict, 95 % CI of what is tested | Holm (family) "
             "| delta | results |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in claims:
        by = "paper" if r["paper_claim"] == "yes" else "ours"
        holm = f"{r['holm_verdict']} ({r['family_size']})" if r.get("holm_verdict") else "—"
        lines.append(f"| {r['table']} | {r['row']} {r['claim']} | {by} | {_num(r['paper'])} | {_num(r['mean'])} "
                     f"({r['metric']}, {r['split']}, n {r['n_seeds']}) | {r['compared_with']} "
                     f"{_num(r['compared_mean']) if r['compared_mean'] else ''} | {_scale(r)} | {_verdict(r)} | "
                     f"{holm} | {_num(r.get('delta') or '')} | [{r['file']}](results/{r['file']}) |")
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
    print(f"README.md: {counts([r for r in rows if r['kind'] == 'claim'])} "
          f"{sum(r['kind'] == 'floor' and not r.get('part_of') for r in rows)} floors.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
