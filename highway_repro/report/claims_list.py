"""The claims list of `results/README.md` and the counts of verdicts, from summary.csv's rows (every value a string).
Standard library only: `scripts/update_readme.py` loads this file without the package."""

from __future__ import annotations

VERDICTS = ("HELD", "DID NOT HOLD", "NO DIFFERENCE", "NOT RESOLVED")
CLAIM_TYPES = ("trend", "level", "artifact", "negligible", "own")  # papers.CLAIM_TYPES, in the list's order
PAPER_SCALE = "paper"  # the scale of the papers' models, budgets and data (configs/scale/paper.yaml)
PAPER_SCALE_ONLY = "paper scale only"
NO_CLAIM = "no claim"  # a negligible paper difference (papers.NEGLIGIBLE_SHARE)
EARLIER_INVALID = "no valid verdict"  # ledger.EARLIER_INVALID: the rule in force before could not decide validly


def num(x: str) -> str:
    try:
        v = float(x)
    except ValueError:
        return x or "—"
    return f"{v:.4g}"


def uncounted(r: dict) -> str | None:
    """Why a claim line's verdict counts in no tally (shown, counted apart); None: it counts."""
    return (NO_CLAIM if r.get("claim_type") == "negligible" else
            PAPER_SCALE_ONLY if r.get("claim_type") == "level" and r.get("scale") != PAPER_SCALE else None)


def counted(r: dict) -> bool:
    return uncounted(r) is None


def apart(claims: list[dict]) -> str:
    """'2 paper scale only, 1 no claim': the claim lines counted apart, by why ('' for none)."""
    whys = [uncounted(r) for r in claims]
    return ", ".join(f"{whys.count(w)} {w}" for w in (PAPER_SCALE_ONLY, NO_CLAIM) if w in whys)


def _verdict(r: dict) -> str:
    second = " at 99 %, the second look" if float(r.get("level") or 0.95) > 0.95 else ""  # stats.SECOND_LOOK
    second += ", paired by seed" if r.get("ci_unpaired_low") else ""
    ci = (f" [{num(r['ci_low'])}, {num(r['ci_high'])}]{second}" if r["ci_low"] else
          f" ({r['detail']})" if r["detail"].startswith("not testable") else " (no interval)")  # report.claims.UNTESTED
    if not counted(r):  # its numbers, for information
        return f"{uncounted(r)}{ci}"
    need = (f"; a decision needs ~{r['seeds_needed']} runs per row" if r.get("seeds_needed") else
            "; its second look was the last" if _last_look(r) else "")
    need += f", pointing to {r['points_to']}" if r.get("points_to") and r["verdict"] == "NOT RESOLVED" else ""
    before = r.get("verdict_before_rules") or r["verdict"]
    before = f"; under the rules in force before those fixed after the data: {before}" if before != r["verdict"] else ""
    return f"**{r['verdict']}**{ci}{need}{before}"


def _last_look(r: dict) -> bool:
    return r["verdict"] == "NOT RESOLVED" and r["detail"].startswith("its second look")  # report.claims.LAST_LOOK


def tally(rows: list[dict], key: str = "verdict") -> str:
    """'3 HELD, 1 DID NOT HOLD, ...' by `key` where a line has it, else by its verdict."""
    got = [r.get(key) or r["verdict"] for r in rows]
    invalid = got.count(EARLIER_INVALID)
    return ", ".join(f"{got.count(v)} {v}" for v in VERDICTS) + (f", {invalid} {EARLIER_INVALID}" if invalid else "")


def earlier(rows: list[dict]) -> str:
    """The tally under the reading rules in force before those fixed after the data, where they change a verdict."""
    changed = sum((r.get("verdict_before_rules") or r["verdict"]) != r["verdict"] for r in rows)
    lines = "line changes" if changed == 1 else "lines change"
    return (f"; under the reading rules in force before those fixed after the data: "
            f"{tally(rows, 'verdict_before_rules')} ({changed} {lines})" if changed else "")


def counts(claims: list[dict]) -> str:
    """The distinct comparisons and their verdicts (raw and Holm), then each claim type apart."""
    of = {t: [r for r in claims if r.get("claim_type") == t] for t in CLAIM_TYPES}
    tested, trend = [r for r in claims if counted(r)], of["trend"]
    open_ = sum(r["verdict"] == "NOT RESOLVED" for r in trend)
    named = sum(r["verdict"] == "NOT RESOLVED" and bool(r.get("seeds_needed")) for r in trend)
    last = sum(_last_look(r) for r in trend)
    share = ((f"{100 * open_ / len(trend):.0f} %" if trend else "—")
             + (f", {named} of the {open_} naming the seeds or trials a decision would need" if open_ else "")
             + (f", {last} at the end of their second look (no look follows)" if last else ""))
    others = []
    if of["level"]:
        at_paper = [r for r in of["level"] if counted(r)]
        rest = len(of["level"]) - len(at_paper)
        others.append(f"{_are(of['level'])} the papers' level claims (absolute numbers)" + (
            f": {tally(at_paper)} at the paper's scale" + (f", {rest} {PAPER_SCALE_ONLY}" if rest else "")
            if at_paper else ", testable at the paper's scale only"))
    others.append(f"{_are(of['own'])} the project's own: {tally(of['own'])} (Holm: {tally(of['own'], 'holm_verdict')})")
    if of["artifact"]:
        others.append(f"{_are(of['artifact'])} on a paper number that is an artifact of the official code: "
                      f"{tally(of['artifact'])}")
    if of["negligible"]:
        others.append(f"{_are(of['negligible'])} an order the paper states by a difference under 0.1 % of its value: "
                      f"{NO_CLAIM}, no verdict")
    aside = apart(claims)
    size = next((r["papers_family_size"] for r in trend if r.get("papers_family_size")), 0)
    return (f"{len(claims)} distinct comparisons: {tally(tested)} (Holm within each table: "
            f"{tally(tested, 'holm_verdict')}{earlier(tested)})" + (f", and {aside}" if aside else "")
            + f". Of them {_are(trend)} the papers' trend claims: {tally(trend)} (Holm over the {size} of them with "
            f"a test as one family: {tally(trend, 'papers_family_verdict')}; Holm within each table: "
            f"{tally(trend, 'holm_verdict')}{earlier(trend)}); NOT RESOLVED: {share}. " + "; ".join(others) + ".")


def _are(rows: list) -> str:
    return f"{len(rows)} {'is' if len(rows) == 1 else 'are'}"


def scale(r: dict) -> str:
    n, planned = r.get("runs") or "", r.get("runs_planned") or ""
    partial = n.isdigit() and planned.isdigit() and int(planned) > int(n)
    return f"{r['scale']}, **partial: {n} of {planned} runs**" if partial else r["scale"]


def claims_list(rows: list[dict]) -> str:
    """Every distinct comparison and every floor as two Markdown tables."""
    order = {t: i for i, t in enumerate(CLAIM_TYPES)}
    claims = sorted((r for r in rows if r["kind"] == "claim"), key=lambda r: order.get(r.get("claim_type"), 0))
    floors = [r for r in rows if r["kind"] == "floor" and not r.get("part_of")]  # parts: in the combined table
    lines = [counts(claims), "",
             "| table | claim | by | type | paper | ours | vs | scale | verdict, 95 % CI of what is tested "
             "| Holm (family) | delta | results |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in claims:
        holm = f"{r['holm_verdict']} ({r['family_size']})" if r.get("holm_verdict") and counted(r) else "—"
        if r.get("papers_family_verdict"):
            holm += f"; the papers' trends: {r['papers_family_verdict']} ({r['papers_family_size']})"
        lines.append(f"| {r['table']} | {r['row']} {r['claim']} | {'paper' if r['paper_claim'] == 'yes' else 'ours'} | "
                     f"{r.get('claim_type') or '—'} | {num(r['paper'])} | {num(r['mean'])} "
                     f"({r['metric']}, {r['split']}, n {r['n_seeds']}) | {r['compared_with']} "
                     f"{num(r['compared_mean']) if r['compared_mean'] else ''} | {scale(r)} | {_verdict(r)} | "
                     f"{holm} | {num(r.get('delta') or '')} | [{r['file']}]({r['file']}) |")
    lines += ["", "| table | row | floor | ours | met | scale | results |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['table']} | {r['row']} | {r['claim'].replace('reaches the floor ', '')} | {num(r['mean'])} "
              f"(n {r['n_seeds']}) | {r['floor_met']} | {scale(r)} | [{r['file']}]({r['file']}) |" for r in floors]
    return "\n".join(lines)
