"""The full claims list of `results/README.md`, and the counts of verdicts, from summary.csv's rows (standard
library only: `scripts/update_readme.py` loads this file without the package).

One line per distinct comparison (kind `claim`: a comparison that several tables hold is shown once, in its home
table; who makes it: `paper`, or `ours` for a check the papers do not state for that table, such as their general
claim on a table they did not report; paper value, ours, scale, verdict with its 95 % interval, the Holm verdict
within the table's family, delta, link to the table), the paper's claims first, then one line per floor of the cpu
scale (a study's parts, rows with `part_of`, left out). Rows are summary.csv's: every value a string.
"""

from __future__ import annotations

VERDICTS = ("HELD", "DID NOT HOLD", "NO DIFFERENCE", "NOT RESOLVED")
EXPLAINED = ("A verdict comes from the 95 % interval of what a claim compares: **HELD** = wholly on the claim's side, "
             "**DID NOT HOLD** = wholly on the other side,\n**NO DIFFERENCE** = it contains 0 and lies within +-delta "
             "(the metric's equivalence margin, `papers.MARGINS`), **NOT RESOLVED** = none of these: too few runs to "
             "tell.\nRuns added after a comparison's first verdict are read at a 99 % interval, the second look "
             "(`stats.SECOND_LOOK`: the two looks err at most 6 %); the seeds a decision needs are counted at 99 %.")


def num(x: str) -> str:
    """A cell's number in 4 significant digits; a non-number as it is, an empty cell as a dash."""
    try:
        v = float(x)
    except ValueError:
        return x or "—"
    return f"{v:.4g}"


def _verdict(r: dict) -> str:
    second = " at 99 %, the second look" if float(r.get("level") or 0.95) > 0.95 else ""  # stats.SECOND_LOOK
    ci = (f" [{num(r['ci_low'])}, {num(r['ci_high'])}]{second}" if r["ci_low"] else
          f" ({r['detail']})" if r["detail"].startswith("not testable") else " (no interval)")  # report.spec.UNTESTED
    # runs per row: seeds of a trained row, trials of a random search (its table's line says which)
    need = (f"; a decision needs ~{r['seeds_needed']} runs per row" if r.get("seeds_needed") else
            "; its second look was the last" if _last_look(r) else "")
    return f"**{r['verdict']}**{ci}{need}"


def _last_look(r: dict) -> bool:
    return r["verdict"] == "NOT RESOLVED" and r["detail"].startswith("its second look")  # report.claims.LAST_LOOK


def tally(rows: list[dict], key: str = "verdict") -> str:
    """'3 HELD, 1 DID NOT HOLD, ...': each verdict's count (`key` holm_verdict: the Holm one where there is one)."""
    return ", ".join(f"{sum((r[key] or r['verdict']) == v for r in rows)} {v}" for v in VERDICTS)


def counts(claims: list[dict]) -> str:
    """The distinct comparisons, the paper's among them, and the verdicts (raw and Holm) of each set."""
    paper = [r for r in claims if r["paper_claim"] == "yes"]
    open_ = sum(r["verdict"] == "NOT RESOLVED" for r in paper)
    share = f"{100 * open_ / len(paper):.0f} %" if paper else "—"
    named = sum(r["verdict"] == "NOT RESOLVED" and bool(r.get("seeds_needed")) for r in paper)
    last = sum(_last_look(r) for r in paper)
    if open_:
        share += f", {named} of the {open_} naming the seeds or trials a decision would need"
    if last:
        share += f", {last} at the end of their second look (no look follows)"
    return (f"{len(claims)} distinct comparisons: {tally(claims)} (Holm within each table: "
            f"{tally(claims, 'holm_verdict')}). Of them {len(paper)} are the papers' claims: {tally(paper)} "
            f"(Holm: {tally(paper, 'holm_verdict')}); NOT RESOLVED: {share}.")


def scale(r: dict) -> str:
    """The scale, and for a table whose grid is not all trained yet: how much of it is."""
    n, planned = r.get("runs") or "", r.get("runs_planned") or ""
    partial = n.isdigit() and planned.isdigit() and int(planned) > int(n)
    return f"{r['scale']}, **partial: {n} of {planned} runs**" if partial else r["scale"]


def claims_list(rows: list[dict], link: str = "") -> str:
    """Every distinct comparison and every floor, as two Markdown tables; `link` goes before each table's file."""
    claims = sorted((r for r in rows if r["kind"] == "claim"), key=lambda r: r["paper_claim"] != "yes")  # stable
    floors = [r for r in rows if r["kind"] == "floor" and not r.get("part_of")]  # parts: in the combined table
    lines = [counts(claims), "",
             "| table | claim | by | paper | ours | vs | scale | verdict, 95 % CI of what is tested | Holm (family) "
             "| delta | results |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in claims:
        by = "paper" if r["paper_claim"] == "yes" else "ours"
        holm = f"{r['holm_verdict']} ({r['family_size']})" if r.get("holm_verdict") else "—"
        lines.append(f"| {r['table']} | {r['row']} {r['claim']} | {by} | {num(r['paper'])} | {num(r['mean'])} "
                     f"({r['metric']}, {r['split']}, n {r['n_seeds']}) | {r['compared_with']} "
                     f"{num(r['compared_mean']) if r['compared_mean'] else ''} | {scale(r)} | {_verdict(r)} | "
                     f"{holm} | {num(r.get('delta') or '')} | [{r['file']}]({link}{r['file']}) |")
    lines += ["", "| table | row | floor | ours | met | scale | results |", "|---|---|---|---|---|---|---|"]
    for r in floors:
        lines.append(f"| {r['table']} | {r['row']} | {r['claim'].replace('reaches the floor ', '')} | "
                     f"{num(r['mean'])} (n {r['n_seeds']}) | {r['floor_met']} | {scale(r)} | "
                     f"[{r['file']}]({link}{r['file']}) |")
    return "\n".join(lines)
