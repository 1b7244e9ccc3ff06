"""`<out>.claims.json` beside each table (an entry per table row, kind `row`, and per claim or floor, kinds `claim` /
`floor`), `results/summary.csv` over all of them, where each distinct comparison (the same runs on each side, the
same statistic) is one `claim` line in its home table (`home_rank`; another table's line on it: kind `same`), and
the index `results/README.md`, ending with the full claims list (`claims_list.py`) and `results/claims.png`
(`forest.py`).
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from collections import Counter
from pathlib import Path

from highway_repro import files
from highway_repro.errors import make_folder
from highway_repro.files import KeptFileError
from highway_repro.report import papers, stats
from highway_repro.report.claims_list import PAPER_SCALE_ONLY, claims_list, counted
from highway_repro.report.forest import forest
from highway_repro.report.spec import LAST_LOOK, UNTESTED, Rendered, floor_met

COLUMNS = ["table", "row", "kind", "metric", "split", "n_seeds", "mean", "std", "ci_low", "ci_high",
           "ci_unpaired_low", "ci_unpaired_high", "level", "paper",
           "floor", "floor_met", "claim", "verdict", "delta", "family_size", "holm_verdict", "compared_with",
           "compared_mean", "diff", "paper_effect", "paper_claim", "claim_type", "seeds_needed", "same_as", "detail",
           "scale", "runs", "runs_planned", "part_of", "file"]
# ci_unpaired_low, ci_unpaired_high: a comparison tested paired by seed (ci_*: the paired interval), its Welch
# interval at the same level (empty for every other line);
# runs, runs_planned: the table's (partial: fewer); part_of: the study whose combined table also holds these rows
# (README.md's glance shows that one only); claim_type: papers.CLAIM_TYPES (a level claim is counted at the paper's
# scale only, claims_list.counted)


def _num(x):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    return float(f"{x:.6g}")


def _ends(name: str, ci: tuple | None) -> dict:
    """`<name>_low`, `<name>_high`: an interval's ends (None without one)."""
    return {f"{name}_low": _num(ci[0]) if ci else None, f"{name}_high": _num(ci[1]) if ci else None}


def claim_rows(name: str, t: Rendered, scale: str | None) -> list[dict]:
    spec, m = t.spec, t.spec.primary
    floors = {r.claim.row: r for r in t.results if r.claim.kind == "floor"}
    out = []
    for row in t.rows:
        ranked = [v for v, _ in row.ranked(m)]
        vals = ranked[:1] if spec.primary_pick == "best" else ranked
        mean, std = stats.mean_std(vals)
        ci = None if spec.primary_pick == "best" else stats.mean_interval(vals)
        f = floors.get(row.id)
        out.append({"table": name, "row": row.name, "kind": "row", "metric": m.metric + (
            " (best run)" if spec.primary_pick == "best" else ""), "split": m.split, "n_seeds": len(row.done),
            "mean": _num(mean), "std": _num(std) if spec.primary_pick != "best" else None, **_ends("ci", ci),
            "level": stats.LEVEL if ci else None,
            "paper": _num(spec.paper_of(row.id, m.split)) if spec.paper_of else None,
            "floor": f.claim.against if f else None, "floor_met": floor_met(f) if f else None,
            "claim": "", "verdict": "", "scale": scale})
    for r in t.results:
        c = r.claim
        against = (r.other_label or "/".join(map(str, c.against))).replace("`", "") \
            if isinstance(c.against, tuple) else c.against
        out.append({"table": name, "row": r.label.replace("`", ""), "kind": c.kind, "metric": c.measure.metric,
                    "split": c.measure.split, "n_seeds": r.n, "mean": _num(r.mean),
                    "std": _num(r.std) if c.pick != "best" else None,
                    **_ends("ci", r.ci), **_ends("ci_unpaired", r.ci_unpaired),
                    "level": r.level if r.ci else None, "paper": _num(c.paper_value),
                    "floor": c.against if c.kind == "floor" else None,
                    "floor_met": floor_met(r) if c.kind == "floor" else None,
                    "claim": c.text + c.paper_note, "verdict": r.verdict, "compared_with": against,
                    "compared_mean": _num(r.other_mean), "diff": _num(r.diff), "paper_claim": r.paper,
                    "claim_type": r.claim_type,
                    "detail": (r.detail or (LAST_LOOK if r.last_look else "")).replace("`", ""),
                    "scale": scale, "delta": _num(r.delta),
                    "comparison": r.key, "experiment": r.experiment, "tests": r.tests,
                    "family_size": r.family_size, "holm_verdict": r.holm,
                    "seeds_needed": r.seeds_needed, "same_as": _same_as(r.same_as),
                    "paper_effect": _num((r.paper_effect or (None, None))[0]),
                    "paper_effect_rel": _num((r.paper_effect or (None, None))[1]), "paper_claim_id": r.paper_id,
                    "threshold": c.threshold if isinstance(c.against, tuple) else c.against})
    return out


def _same_as(s: dict | None) -> str | None:
    return f"{s['file']}: {s['row']} {s['claim']}" if s else None


def home_rank(table: str, part_of: str | None, experiment: str) -> int:
    """Which table is a comparison's home when several hold it: the table of the runs' own experiment (0), else a
    table that is not a part of a combined study table (1), else a part (2); ties go to the first file."""
    return 0 if table == experiment else 1 if not part_of else 2


# The fields every claims file and each kind of its rows has (`write_claims`, `claim_rows`), those the readers need
CLAIMS_FIELDS = {"table", "title", "scale", "file", "runs", "runs_planned", "part_of", "rows"}
ROW_FIELDS = {"kind", "row", "table", "claim", "metric", "split", "scale", "verdict", "ci_low", "ci_high", "mean",
              "std", "n_seeds", "paper", "level", "floor", "floor_met"}
CLAIM_FIELDS = ROW_FIELDS | {"comparison", "same_as", "experiment", "claim_type", "paper_claim", "paper_claim_id",
                             "holm_verdict", "family_size", "detail", "delta", "diff", "seeds_needed", "tests"}


def read_claims(path: Path, root: Path) -> dict:
    """A table's `<out>.claims.json` (`files.read_json` below `root`): an object with the fields `write_claims`
    writes, `file` a name, rows of kind row, claim or floor, each with its kind's fields, its names text and no
    value an object but its `tests`; else KeptFileError naming it."""
    d = files.read_json(path, root, kind=dict)
    rows = d.get("rows")
    ok = CLAIMS_FIELDS <= set(d) and isinstance(d["table"], str) and isinstance(rows, list) and all(
        isinstance(r, dict) and r.get("kind") in ("row", "claim", "floor")
        and (ROW_FIELDS if r["kind"] == "row" else CLAIM_FIELDS) <= set(r)
        and all(isinstance(r[k], str) for k in ("kind", "row", "claim", "verdict"))
        and not any(isinstance(v, dict) for k, v in r.items() if k != "tests") for r in rows)
    if not ok:
        raise KeptFileError(f"{path} is not a table's claims file (valid: the fields write_claims writes; rows of kind "
                            "row, claim or floor with their fields)")
    files.plain_name(d["file"], f"{path}: file")
    return d


def comparisons_elsewhere(out: Path, table: str, part_of: str | None):
    """`home(key, experiment)` for a table about to be written to `out`: the line of another table's claims file
    beside it that holds the same comparison and is its home (`home_rank`), as {"table", "file", "row", "claim"};
    None when this table is the home. (A study is reported after the tables whose runs it reuses.)"""
    out = Path(out)
    lines = {}
    for f in sorted(out.parent.glob("*.claims.json")):
        if f.name == out.name + ".claims.json":
            continue
        try:
            d = read_claims(f, out.parent)
        except KeptFileError:  # named by the summary, which leaves it out too
            continue
        for r in d["rows"]:
            if r["kind"] == "claim" and r.get("comparison") and not r.get("same_as"):
                rank = home_rank(d["table"], d.get("part_of"), r.get("experiment", ""))
                lines.setdefault(r["comparison"], (rank, {"table": d["table"], "file": d["file"], "row": r["row"],
                                                         "claim": r["claim"]}))

    def home(key: str, experiment: str) -> dict | None:
        found = lines.get(key)
        return found[1] if found and found[0] < home_rank(table, part_of, experiment) else None

    return home


def write_claims(name: str, t: Rendered, out: Path, meta: dict, runs: int | None = None) -> Path:
    """`<out>.claims.json`: {table, title, scale, file (the table's .md), runs (done, failed or missing),
    runs_planned (the runner's plan; None: unknown), part_of (the study whose combined table reads them), rows}."""
    out = Path(out)
    path = out.with_name(out.name + ".claims.json")
    return files.write_atomic(path, json.dumps({"table": name, "title": t.spec.title, "scale": meta.get("scale"),
                                                "file": out.name + ".md", "runs": runs,
                                                "runs_planned": meta.get("planned"), "part_of": meta.get("part_of"),
                                                "rows": claim_rows(name, t, meta.get("scale"))}, indent=1) + "\n")


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)


ARCHIVE = "archive"  # results/archive/: tables and runs of superseded recipes, out of the tree
ARCHIVE_COMMIT = "3b84a2689132d00462605e95dd0e34f464c9f369"  # the last change of results/archive/ (in its tree)


def distinct(rows: list[dict]) -> list[str]:
    """Each comparison once, as the tables marked it (`claims.family`): a table's line on a comparison that another
    table holds (`same_as`) becomes kind `same` and gives its home the paper claim it tests; family sizes and Holm
    verdicts stay the tables' own, so that summary.csv says what each table says. Returns where the tables disagree
    (a comparison two tables hold, a line naming a comparison no table holds): tables built out of order, or one
    rebuilt without the tables it reuses; `make tables` rebuilds them in order."""
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
            r["same_as"] = _same_as(home)  # the home's file from the results root
            if r["paper_claim"] and not home["paper_claim"]:
                home["claim_type"] = r.get("claim_type")
            home["paper_claim"] = home["paper_claim"] or r["paper_claim"]
    return problems


def missing_paper_claims(rows: list[dict]) -> list[papers.PaperClaim]:
    """The claims of papers.PAPER_CLAIMS that no claim line tests (their table is not made, or lacks the rows)."""
    tested = {r.get("paper_claim_id") for r in rows if r["kind"] in ("claim", "same")}
    return [c for i, c in enumerate(papers.PAPER_CLAIMS) if i not in tested]


def write_summary(results_root: Path, expected: dict | None = None) -> Path:
    """`<results_root>/summary.csv` from every `*.claims.json` below it but `archive/` (superseded recipes: indexed,
    not summarised), and the index `README.md`, which names each table of `expected` (name -> how to make it) not
    made yet."""
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
    make_folder(root)
    forest(rows, root / "claims.png")
    path = root / "summary.csv"
    flat = [{k: _cell(r.get(k)) for k in COLUMNS} for r in rows]  # summary.csv's rows, as the claims list reads them
    fh = io.StringIO(newline="")
    w = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
    w.writeheader()
    w.writerows(flat)
    files.write_atomic(path, fh.getvalue())
    lines = ["# Results", "",
             "Every table of the two papers as reproduced here; each file names the command that made it, the scale, "
             "seeds, wall time, CPU-hours and machine. `summary.csv` has one line per table row, distinct comparison "
             "(kind `claim`; a table's line on a comparison that another table holds: kind `same`) and floor "
             f"(written by `make tables`); `claims.png` draws every distinct comparison. Verdicts: "
             f"{stats.VERDICTS_EXPLAINED}. Each comparison has a type (`claim_type`): "
             + "; ".join(f"**{k}** = {v}" for k, v in papers.CLAIM_TYPES.items())
             + f"; a level claim at another scale is shown, marked {PAPER_SCALE_ONLY}, and counted in no verdict.",
             "",
             "| table | scale | runs | claims held / did not hold / no difference / not resolved (not testable yet) "
             "| Holm | family | linked to another table | floors met |",
             "|---|---|---|---|---|---|---|---|"]
    for d, rel in tables:
        mine = [r for r in rows if r["file"] == rel]
        claims = [r for r in mine if r["kind"] == "claim" and counted(r)]
        paper_scale = sum(r["kind"] == "claim" and not counted(r) for r in mine)
        v = Counter(r["verdict"] for r in claims)
        h = Counter(r["holm_verdict"] or r["verdict"] for r in claims)
        untested = sum(1 for r in claims if r.get("detail", "").startswith(UNTESTED))
        fl = [r["floor_met"] for r in mine if r["kind"] == "floor"]
        n, planned = d.get("runs"), d.get("runs_planned")
        runs = "not recorded" if n is None else f"{n} of {planned} (partial)" if planned and planned > n else str(n)
        size = next((r["family_size"] for r in mine if r["kind"] == "claim" and r.get("family_size")), 0)
        lines.append(f"| [{d['title']}]({rel}) | {d.get('scale') or '?'} | {runs} | "
                     + " / ".join(str(v[k]) for k in stats.VERDICTS) + f"{f' ({untested})' if untested else ''}"
                     + f"{f'; {paper_scale} {PAPER_SCALE_ONLY}' if paper_scale else ''} | "
                     + " / ".join(str(h[k]) for k in stats.VERDICTS) + f" | {size} | "
                     f"{sum(r['kind'] == 'same' for r in mine)} | {f'{sum(fl)} of {len(fl)}' if fl else '—'} |")
    if problems:
        lines += ["", f"**The tables disagree on {len(problems)} comparison(s), so their counts here are not one "
                  "comparison each: `make tables` rebuilds every table in order.** " + "; ".join(problems) + "."]
        print(f"warning: results/README.md: the tables disagree on {len(problems)} comparison(s) ({problems[0]}); "
              "`make tables` rebuilds them in order", file=sys.stderr)
    missing = missing_paper_claims(rows)
    if missing:
        per_table = Counter(c.table for c in missing)
        lines += ["", f"Paper claims (`papers.PAPER_CLAIMS`) with no claim line yet, their table not made or its rows "
                  f"not trained: {len(missing)} (" + ", ".join(f"{t} {n}" for t, n in per_table.items()) + ")."]
    made = {d["table"] for d, _ in tables}
    not_made = [how for n, how in (expected or {}).items() if n not in made]
    if not_made:
        lines += ["", "Not made yet (no kept run, so no table file): " + "; ".join(not_made) + "."]
    listed = {rel for _, rel in tables} | {"README.md"}
    others = [p.relative_to(root).as_posix() for p in sorted(root.rglob("*.md"))]
    others = [o for o in others if o not in listed]
    archived = [o for o in others if o.startswith(ARCHIVE + "/")]
    others = [o for o in others if o not in archived]
    if others:
        lines += ["", "Other reports (benchmarks, the ledger of what was fixed when, or tables written before claims "
                  "files existed): " + ", ".join(f"[{o}]({o})" for o in others) + "."]
    lines += ["", "Superseded recipes (their tables and kept runs, `archive/`: `cpu-v1` the first, much shorter cpu "
              "scale; `cpu-v2` runs of recipes sized for a slower machine; `cpu-v3` a char-PTB run with the paper's "
              "dropout; `cpu-v4` the CIFAR table at 6,000 steps; `cpu-v5` Fig. 1 with the decay every epoch; the "
              "pilots behind each change: docs/pilots.md) are out of the tree: "
              f"`git checkout {ARCHIVE_COMMIT[:12]} -- results/archive` brings them back, indexed here, not summarised"
              + (": " + ", ".join(f"[{o}]({o})" for o in archived) if archived else "") + "."]
    lines += ["", "## Every comparison", "", "![every distinct comparison: difference, 95 % interval (99 % at a "
              "second look), +-delta, the paper's effect](claims.png)", "", claims_list(flat)]
    files.write_atomic(root / "README.md", "\n".join(lines) + "\n")
    if damaged:
        raise KeptFileError(f"{len(damaged)} claims file(s) left out of {path} (make tables rebuilds them): "
                            f"{damaged[0]}")
    return path
