"""`results/summary.csv` over every table's `<out>.claims.json`, each distinct comparison one `claim` line in its home
table (`claims_file.home_rank`; another table's line on it: kind `same`), and the index `results/README.md`."""

from __future__ import annotations

import csv
import io
import sys
from collections import Counter
from pathlib import Path

from highway_repro import files
from highway_repro.errors import make_folder
from highway_repro.files import KeptFileError
from highway_repro.report import ledger, papers, stats
from highway_repro.report.claims_list import NO_CLAIM, PAPER_SCALE_ONLY, apart, claims_list, counted
from highway_repro.report.forest import forest
from highway_repro.report.prose import prose
from highway_repro.report.claims_file import same_as_line, read_claims
from highway_repro.report.claims import UNTESTED

# ci_unpaired_*: a comparison paired by seed, its Welch interval; papers_family_*: Holm over all the papers' trend
# claims (`papers_family`); verdict_before_rules: the verdict under the reading rules in force before those the ledger
# marks as fixed after the data (`ledger.earlier_verdict`); part_of: the study whose combined table also holds a row
COLUMNS = ["table", "row", "kind", "metric", "split", "n_seeds", "mean", "std", "ci_low", "ci_high", "ci_unpaired_low",
           "ci_unpaired_high", "level", "paper", "floor", "floor_met", "claim", "verdict", "delta", "family_size",
           "holm_verdict", "papers_family_size", "papers_family_verdict", "verdict_before_rules", "compared_with",
           "compared_mean", "diff", "paper_effect", "paper_claim", "claim_type", "seeds_needed", "points_to", "same_as",
           "detail", "cpu_models", "scale", "runs", "runs_planned", "part_of", "file"]
ARCHIVE = "archive"  # results/archive/: tables and runs of superseded recipes, out of the tree
ARCHIVE_COMMIT = "3b84a2689132d00462605e95dd0e34f464c9f369"  # the last change of results/archive/ (in its tree)


def _cell(v) -> str:
    return "" if v is None else ("yes" if v else "no") if isinstance(v, bool) else str(v)


def distinct(rows: list[dict]) -> list[str]:
    """Each comparison once: a line whose comparison another table holds (`same_as`) becomes kind `same` and gives its
    home the paper claim it tests; families stay the tables' own. Returns where the tables disagree (built out of
    order)."""
    homes: dict[str, list[dict]] = {}
    for r in rows:
        if r["kind"] == "claim" and r.get("comparison") and not r.get("same_as"):
            homes.setdefault(r["comparison"], []).append(r)
    problems = [f"{' and '.join(h['file'] for h in hs)} both hold `{hs[0]['row']} {hs[0]['claim']}`"
                for hs in homes.values() if len(hs) > 1]
    for r in rows:
        if r["kind"] == "claim" and r.get("same_as"):
            r["kind"] = "same"
            home = homes.get(r.get("comparison"), [None])[0]
            if home is None:
                problems.append(f"{r['file']}: `{r['row']} {r['claim']}` names a comparison no table holds now")
                continue
            r["same_as"] = same_as_line(home)  # the home's file from the results root
            if r["paper_claim"] and not home["paper_claim"]:
                home["claim_type"] = r.get("claim_type")
            home["paper_claim"] = home["paper_claim"] or r["paper_claim"]
    return problems


def papers_family(rows: list[dict]) -> int:
    """The papers' distinct trend claims as one Holm family (a claim without a test: NOT RESOLVED, not adjusted for);
    sets `papers_family_verdict` and `papers_family_size`, returns that size."""
    trend = [r for r in rows if r["kind"] == "claim" and r.get("claim_type") == "trend" and counted(r)]
    size = sum(r.get("tests") is not None for r in trend)
    for r, v in zip(trend, stats.holm_verdicts([r.get("tests") for r in trend])):
        r["papers_family_verdict"], r["papers_family_size"] = v, size
    return size


def write_summary(results_root: Path, expected: dict | None = None) -> Path:
    """`summary.csv` from every `*.claims.json` below `results_root` but `archive/`, and the index `README.md`, which
    names each table of `expected` (name -> how to make it) not made yet."""
    root = Path(results_root)
    tables, rows, damaged = [], [], []
    for f in sorted(f for f in root.rglob("*.claims.json") if f.relative_to(root).parts[0] != ARCHIVE):
        try:
            d = read_claims(f, root)
        except KeptFileError as e:
            print(f"error: {e}", file=sys.stderr)
            damaged.append(str(e))
            continue
        rel = (f.parent / d["file"]).relative_to(root).as_posix()
        tables.append((d, rel))
        rows += [{**r, "file": rel, "runs": d.get("runs"), "runs_planned": d.get("runs_planned"),
                  "part_of": d.get("part_of")} for r in d["rows"]]
    problems = distinct(rows)
    papers_family(rows)
    try:
        entries = ledger.load(root)
    except KeptFileError as e:  # the ledger step names it; the lines show no earlier verdict
        print(f"error: {e}", file=sys.stderr)
        entries = []
    for r in rows:
        r["verdict_before_rules"] = ledger.earlier_verdict(r, entries)
    make_folder(root)
    forest(rows, root / "claims.png")
    path = root / "summary.csv"
    flat = [{k: _cell(r.get(k)) for k in COLUMNS} for r in rows]  # summary.csv's rows, as the claims list reads them
    fh = io.StringIO(newline="")
    w = csv.DictWriter(fh, fieldnames=COLUMNS)
    w.writeheader()
    w.writerows(flat)
    files.write_atomic(path, fh.getvalue())
    lines = ["# Results", "",
             prose("results intro", verdicts=prose("verdicts"), paper_scale_only=PAPER_SCALE_ONLY,
                   types="; ".join(f"**{k}** = {v}" for k, v in papers.CLAIM_TYPES.items()), no_claim=NO_CLAIM,
                   rule=papers.CLAIM_TYPE_RULE),
             "", prose("results index header"), "|---|---|---|---|---|---|---|---|"]
    for d, rel in tables:
        mine = [r for r in rows if r["file"] == rel]
        claims = [r for r in mine if r["kind"] == "claim" and counted(r)]
        aside = apart([r for r in mine if r["kind"] == "claim"])
        v, h = Counter(r["verdict"] for r in claims), Counter(r["holm_verdict"] or r["verdict"] for r in claims)
        untested = sum(r.get("detail", "").startswith(UNTESTED) for r in claims)
        fl = [r["floor_met"] for r in mine if r["kind"] == "floor"]
        n, planned = d.get("runs"), d.get("runs_planned")
        runs = "not recorded" if n is None else f"{n} of {planned} (partial)" if planned and planned > n else str(n)
        size = next((r["family_size"] for r in mine if r["kind"] == "claim" and r.get("family_size")), 0)
        lines.append(f"| [{d['title']}]({rel}) | {d.get('scale') or '?'} | {runs} | "
                     + " / ".join(str(v[k]) for k in stats.VERDICTS) + f"{f' ({untested})' if untested else ''}"
                     + f"{f'; {aside}' if aside else ''} | "
                     + " / ".join(str(h[k]) for k in stats.VERDICTS) + f" | {size} | "
                     f"{sum(r['kind'] == 'same' for r in mine)} | {f'{sum(fl)} of {len(fl)}' if fl else '—'} |")
    if problems:
        lines += ["", prose("results disagree", n=len(problems), problems="; ".join(problems))]
        print(f"warning: results/README.md: the tables disagree on {len(problems)} comparison(s) ({problems[0]}); "
              "`make tables` rebuilds them in order", file=sys.stderr)
    tested = {r.get("paper_claim_id") for r in rows if r["kind"] in ("claim", "same")}
    missing = [c for i, c in enumerate(papers.PAPER_CLAIMS) if i not in tested]  # their table not made, or rows lacking
    if missing:
        per_table = ", ".join(f"{t} {n}" for t, n in Counter(c.table for c in missing).items())
        lines += ["", prose("results missing", n=len(missing), tables=per_table)]
    made = {d["table"] for d, _ in tables}
    if not_made := [how for n, how in (expected or {}).items() if n not in made]:
        lines += ["", "Not made yet (no kept run, so no table file): " + "; ".join(not_made) + "."]
    listed = {rel for _, rel in tables} | {"README.md"}
    others = [o for p in sorted(root.rglob("*.md")) if (o := p.relative_to(root).as_posix()) not in listed]
    archived = [o for o in others if o.startswith(ARCHIVE + "/")]
    others = [o for o in others if o not in archived]
    if others:
        lines += ["", prose("results others", links=", ".join(f"[{o}]({o})" for o in others))]
    lines += ["", prose("results archive", commit=ARCHIVE_COMMIT[:12],
                        archived=": " + ", ".join(f"[{o}]({o})" for o in archived) if archived else ""),
              "", "## Every comparison", "", prose("results figure"), "", claims_list(flat)]
    files.write_atomic(root / "README.md", "\n".join(lines) + "\n")
    if damaged:
        raise KeptFileError(f"{len(damaged)} claims file(s) left out of {path} (make tables rebuilds them): "
                            f"{damaged[0]}")
    return path
