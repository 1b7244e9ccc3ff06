"""`<out>.claims.json` beside each table: an entry per table row (kind `row`), claim and floor, what
`results/summary.csv` is made of; `comparisons_elsewhere` finds the table that holds a comparison already."""

from __future__ import annotations

import json
import math
from pathlib import Path

from highway_repro import files
from highway_repro.files import KeptFileError
from highway_repro.report import stats
from highway_repro.report.claims import LAST_LOOK
from highway_repro.report.spec import Rendered, floor_met


def _num(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else float(f"{x:.6g}")


def _ends(name: str, ci: tuple | None) -> dict:
    return {f"{name}_low": _num(ci[0]) if ci else None, f"{name}_high": _num(ci[1]) if ci else None}


def claim_rows(name: str, t: Rendered, scale: str | None) -> list[dict]:
    spec, m, best = t.spec, t.spec.primary, t.spec.primary_pick == "best"
    floors = {r.claim.row: r for r in t.results if r.claim.kind == "floor"}
    out = []
    for row in t.rows:
        vals = [v for v, _ in row.ranked(m)][:1 if best else None]
        mean, std = stats.mean_std(vals)
        ci = None if best else stats.mean_interval(vals)
        f = floors.get(row.id)
        out.append({"table": name, "row": row.name, "kind": "row", "metric": m.metric + (" (best run)" if best else ""),
                    "split": m.split, "n_seeds": len(row.done), "mean": _num(mean), "std": None if best else _num(std),
                    **_ends("ci", ci), "level": stats.LEVEL if ci else None,
                    "paper": _num(spec.paper_of(row.id, m.split)) if spec.paper_of else None,
                    "floor": f.claim.against if f else None, "floor_met": floor_met(f) if f else None,
                    "claim": "", "verdict": "", "scale": scale})
    for r in t.results:
        c, effect = r.claim, r.paper_effect or (None, None)
        two_rows = isinstance(c.against, tuple)
        against = (r.other_label or "/".join(map(str, c.against))).replace("`", "") if two_rows else c.against
        out.append({"table": name, "row": r.label.replace("`", ""), "kind": c.kind, "metric": c.measure.metric,
                    "split": c.measure.split, "n_seeds": r.n, "mean": _num(r.mean),
                    "std": None if c.pick == "best" else _num(r.std), **_ends("ci", r.ci),
                    **_ends("ci_unpaired", r.ci_unpaired), "level": r.level if r.ci else None,
                    "paper": _num(c.paper_value), "floor": c.against if c.kind == "floor" else None,
                    "floor_met": floor_met(r) if c.kind == "floor" else None, "claim": c.text + c.paper_note,
                    "verdict": r.verdict, "compared_with": against, "compared_mean": _num(r.other_mean),
                    "diff": _num(r.diff), "paper_claim": r.paper, "claim_type": r.claim_type,
                    "detail": (r.detail or (LAST_LOOK if r.last_look else "")).replace("`", ""), "scale": scale,
                    "delta": _num(r.delta), "comparison": r.key, "experiment": r.experiment, "tests": r.tests,
                    "family_size": r.family_size, "holm_verdict": r.holm, "seeds_needed": r.seeds_needed,
                    "points_to": r.points_to or None, "same_as": same_as_line(r.same_as),
                    "paper_effect": _num(effect[0]), "paper_effect_rel": _num(effect[1]), "paper_claim_id": r.paper_id,
                    "threshold": c.threshold if two_rows else c.against, "side": c.side, "pick": c.pick,
                    "cpu_models": r.cpus})
    return out


def same_as_line(s: dict | None) -> str | None:
    return f"{s['file']}: {s['row']} {s['claim']}" if s else None


def home_rank(table: str, part_of: str | None, experiment: str) -> int:
    """A comparison's home among the tables that hold it: its runs' own experiment, else a table that is not part of a
    combined study table, else a part; ties go to the first file."""
    return 0 if table == experiment else 1 if not part_of else 2


# the fields of a claims file and of each kind of its rows that the readers need
CLAIMS_FIELDS = {"table", "title", "scale", "file", "runs", "runs_planned", "part_of", "rows"}
ROW_FIELDS = {"kind", "row", "table", "claim", "metric", "split", "scale", "verdict", "ci_low", "ci_high", "mean",
              "std", "n_seeds", "paper", "level", "floor", "floor_met"}
CLAIM_FIELDS = ROW_FIELDS | {"comparison", "same_as", "experiment", "claim_type", "paper_claim", "paper_claim_id",
                             "holm_verdict", "family_size", "detail", "delta", "diff", "seeds_needed", "tests"}


def read_claims(path: Path, root: Path) -> dict:
    """A table's claims file, a kept file below `root`: its fields, its rows' names text and no value an object but
    `tests`; else KeptFileError."""
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
    """`home(key, experiment)`: the line of another claims file beside `out` that is the comparison's home
    (`home_rank`), as {"table", "file", "row", "claim"}; None when this table is."""
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
                if rank < lines.get(r["comparison"], (3,))[0]:  # the best home; ties: the first file
                    lines[r["comparison"]] = (rank, {"table": d["table"], "file": d["file"], "row": r["row"],
                                                     "claim": r["claim"]})

    def home(key: str, experiment: str) -> dict | None:
        found = lines.get(key)
        return found[1] if found and found[0] < home_rank(table, part_of, experiment) else None

    return home


def write_claims(name: str, t: Rendered, out: Path, meta: dict, runs: int | None = None) -> Path:
    """`<out>.claims.json`; runs: done, failed or missing; runs_planned: the runner's plan (None: unknown)."""
    out = Path(out)
    path = out.with_name(out.name + ".claims.json")
    return files.write_atomic(path, json.dumps({"table": name, "title": t.spec.title, "scale": meta.get("scale"),
                                                "file": out.name + ".md", "runs": runs,
                                                "runs_planned": meta.get("planned"), "part_of": meta.get("part_of"),
                                                "rows": claim_rows(name, t, meta.get("scale"))}, indent=1) + "\n")
