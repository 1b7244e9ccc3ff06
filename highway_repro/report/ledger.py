"""The preregistration ledger: when each definition a verdict rests on was fixed (`definitions`), and how many of the
runs it compares were kept before then. `results/preregistration.json` is append-only (`scripts/build_ledger.py
--append`); `make tables` writes it out as `results/preregistration.md`. An entry: `id`, `kind`, `table`, `definition`
(null: removed), `commit` and `date` (the commit that holds the definition as it stands), `runs_before` (the kept
cpu-scale runs it compares, committed by then), `after_data` (runs_before > 0) and `reason` (required after the data).
A `rule` entry states a reading rule in words: shown, not compared with the code."""

from __future__ import annotations

import hashlib
import inspect
import itertools
import math
import re
from pathlib import Path

from highway_repro import files
from highway_repro.grids import REPEAT_KEYS, SWEEP_DIR, dirname_items, kept_folders, params_of, sweep_files, values_of
from highway_repro.report import papers, stats
from highway_repro.report.claims_list import EARLIER_INVALID
from highway_repro.report.prose import prose
from highway_repro.targets import TARGETS

LEDGER = "preregistration.json"
SCALE = "cpu"  # the kept runs' scale: the one the ledger counts
SECOND_LOOK_FILE = f"{SCALE}-second_look.yaml"
PAIRED_RULE = "rule: paired by seed"


def row_label(params: dict) -> str:
    """A grid row as Hydra names a job, less its seed or trial: `model.depth=10,model.kind=plain`."""
    return ",".join(f"{k}={params[k]}" for k in sorted(params) if k not in REPEAT_KEYS)


def grid(param_sets) -> dict[str, list[str]]:
    """The union of grids (each a sweep file's `hydra.sweeper.params`): row label -> its seeds or trials, sorted."""
    out: dict[str, set] = {}
    for spec in param_sets:
        params = values_of(spec)
        keys = [k for k in params if k not in REPEAT_KEYS]
        seeds = next((params[k] for k in REPEAT_KEYS if k in params), [""])
        for values in itertools.product(*(params[k] for k in keys)):
            out.setdefault(row_label(dict(zip(keys, values))), set()).update(seeds)
    return {row: sorted(s, key=lambda x: (len(x), x)) for row, s in sorted(out.items())}


def compact(seeds: list[str]) -> str:
    """`["0", "1", "2", "7"]` -> `"0-2,7"`."""
    out = []
    for n in sorted(int(s) for s in seeds):
        if out and n == out[-1][1] + 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in out)


def expand(text: str) -> set[str]:
    """The inverse of `compact`."""
    out = set()
    for part in filter(None, text.split(",")):
        a, _, b = part.partition("-")
        out.update(str(i) for i in range(int(a), int(b or a) + 1))
    return out


def sweep_params(table: str, second_look: bool = False) -> list[dict]:
    return [params_of(p) for p in sweep_files(table, SCALE) if (p.name == SECOND_LOOK_FILE) == second_look]


def claim_id(c) -> str:
    """A paper claim's id (a number it is compared with is its threshold, part of its definition, not of its id)."""
    against = "/".join(c.against) if isinstance(c.against, tuple) else "a number"
    return f"claim {c.table} {'/'.join(c.row)} vs {against} on {c.statistic}"


def claim_entry(c) -> dict:
    """A paper claim's entry: its test as strings, and the rows it compares (`rows`, for counting its runs)."""
    number = not isinstance(c.against, tuple)
    factor = re.search(r" x([0-9.e+]+)$", c.statistic)
    threshold = f"{c.against:g}" if number else f"{-math.log10(float(factor[1])):g}" if factor else "0"
    sides = [c.row] + ([] if number else [c.against])
    return {"id": claim_id(c), "kind": "claim", "table": c.table, "rows": [list(s) for s in sides],
            "definition": {"statistic": c.statistic, "side": c.side,
                           "against": f"{c.against:g}" if number else "/".join(c.against), "threshold": threshold}}


def rules_entry() -> dict:
    """The reading rules as one definition: each constant's value, and the sha256 of each rule function's source."""
    from highway_repro.report import claims, runs

    constants = {"LEVEL": stats.LEVEL, "SECOND_LOOK": stats.SECOND_LOOK, "FIG1_QUANTILE": papers.FIG1_QUANTILE,
                 "FIG1_HIGHWAY_FACTOR": papers.FIG1_HIGHWAY_FACTOR, "FIG1_PLAIN_BELOW": papers.FIG1_PLAIN_BELOW,
                 "FIG1_TRAINS_BELOW": papers.FIG1_TRAINS_BELOW, "TABLE1_CLAIM_STDS": papers.TABLE1_CLAIM_STDS,
                 "CIFAR_CLAIM_AT_LEAST": papers.CIFAR_CLAIM_AT_LEAST, "PAPER_EFFECT_SHARE": papers.PAPER_EFFECT_SHARE,
                 "NEGLIGIBLE_SHARE": papers.NEGLIGIBLE_SHARE}
    code = {"verdict": stats.verdict, "t test": stats.t_test, "quantile test": stats.quantile_test,
            "Holm verdicts": stats.holm_verdicts, "second look p": stats.second_look_p,
            "paired by seed": claims.seed_pairs,
            "one device": runs.one_device, "margin": papers.margin, "paper effect": papers.paper_effect,
            "claim type": papers.PaperClaim.claim_type.fget, "trials": claims.trials, "claim test": claims.test_claim,
            "quantile claim": claims.quantile_claim, "two rows claim": claims.two_rows_claim,
            "best run claim": claims.best_run_claim, "one sample claim": claims.one_sample_claim}
    return {"id": "rules", "kind": "rules", "table": None, "definition": {
        "constants": {k: f"{v:g}" for k, v in constants.items()},
        "code": {k: hashlib.sha256(inspect.getsource(f).encode()).hexdigest()[:12] for k, f in code.items()}}}


def margin_entry(table: str, results: Path) -> dict | None:
    """The margins of the table's comparisons that have one (its claims file's, none before it is made), and the
    paper-effect share where a paper claim of the table has a paper effect."""
    path = results / f"{TARGETS[table].results}.claims.json"
    rows = (files.read_json(path, results, kind=dict) or {}).get("rows") or []
    metrics = {r["metric"] for r in rows if r.get("kind") == "claim" and r.get("delta") is not None}
    if not metrics:
        return None
    m = papers.MARGINS
    d = {k: f"{m[k].value:g} {'relative' if m[k].relative else 'absolute'}" if k in m else "none"
         for k in sorted({papers.margin_key(x) or x for x in metrics})}
    if any(c.table == table and papers.paper_effect(c) for c in papers.PAPER_CLAIMS):
        d["paper effect share"] = f"{papers.PAPER_EFFECT_SHARE:g}"
    return {"id": f"margin {table}", "kind": "margin", "table": table, "definition": d}


def sweep_tables() -> list[str]:
    return [t for t in TARGETS if t != "demo" and (SWEEP_DIR / t / f"{SCALE}.yaml").exists()]


def definitions(results: Path) -> list[dict]:
    """Every definition the ledger checks, as the code and configs now give it (a look: each row's seeds or trials)."""
    types = {claim_id(c): c.claim_type for c in papers.PAPER_CLAIMS}
    out = [claim_entry(c) for c in papers.PAPER_CLAIMS]
    out += [{"id": "claim types", "kind": "claim types", "table": None, "definition": types}, rules_entry()]
    out += [m for t in TARGETS if t != "demo" and (m := margin_entry(t, results))]
    for t in sweep_tables():
        out.append({"id": f"seeds {t}", "kind": "seeds", "table": t,
                    "definition": {row: compact(s) for row, s in grid(sweep_params(t)).items()}})
        if (look := sweep_params(t, True)):
            out.append({"id": f"second look {t}", "kind": "look", "table": t, "definition": {
                "grid": {row: compact(s) for row, s in grid(look).items()}, "level": f"{stats.SECOND_LOOK:g}",
                "claims": sorted(claim_id(c) for c in papers.SECOND_LOOK_CLAIMS if c.table == t)}})
    return out


def _job(name: str) -> tuple[dict, str]:
    """A kept run's folder name -> (its row's overrides, its seed or trial)."""
    params = dict(p.split("=", 1) for p in dirname_items(name) if "=" in p)
    return {k: v for k, v in params.items() if k not in REPEAT_KEYS}, next(
        (params[k] for k in REPEAT_KEYS if k in params), "")


def kept_runs(table: str, results: Path) -> list[str]:
    """The kept run folders of a table (results-relative) at the ledger's scale: `grids.kept_folders`, on either device
    (the report compares one device's, `report.runs.one_device`; the ledger counts both, since either was read)."""
    return sorted(p.relative_to(results).as_posix() for p in kept_folders(table, SCALE, results))


def compared(entry: dict, results: Path, previous: dict | None = None) -> list[str]:
    """The kept runs that a definition compares; the claim types': of the claims whose type differs from `previous`."""
    from highway_repro.report.tables import registry

    kind, table = entry["kind"], entry["table"]
    if kind == "claim types":
        changed = {k for k, v in entry["definition"].items() if (previous or {}).get(k) != v}
        claims = [claim_entry(c) for c in papers.PAPER_CLAIMS if claim_id(c) in changed]
        return sorted({r for c in claims for r in compared(c, results)})
    if table is None:  # a reading rule: every table
        return sorted({r for t in sweep_tables() for r in kept_runs(t, results)})
    runs = [(r, *_job(r.rsplit("/", 1)[-1])) for r in kept_runs(table, results)]
    if kind == "margin":
        return [r for r, _, _ in runs]
    if kind in ("seeds", "look"):
        cells = entry["definition"]["grid"] if kind == "look" else entry["definition"]
        return [r for r, job, seed in runs if seed in expand(cells.get(row_label(job), ""))]
    keys = registry()[table].keys
    rows = [[v] for side in entry["rows"] for v in side] if len(keys) == 1 else entry["rows"]
    look = {row: set(s) for row, s in grid(sweep_params(table, True)).items()}
    decided = entry.get("second_look") or entry["id"] in {claim_id(c) for c in papers.SECOND_LOOK_CLAIMS}
    # a key the job does not set (Table 1's kind) is the config's and matches
    return [r for r, job, seed in runs if any(all(job.get(k, v) == v for k, v in zip(keys, row)) for row in rows)
            and (decided or seed not in look.get(row_label(job), ()))]


def earlier_verdict(r: dict, entries: list[dict]) -> str | None:
    """A summary claim line's verdict under the rules in force before those fixed after the data (a rule dated after
    any table's data counts for every line): Welch's interval, no margin, or EARLIER_INVALID for a quantile claim (its
    earlier test, a bootstrap of the best trial, errs about twice its level); None where no such rule applies."""
    first = {e["id"]: e for e in reversed(entries)}  # the oldest entry of each id
    last = latest(entries)
    if r.get("kind") != "claim" or not r.get("side"):
        return None
    if r.get("pick") == "quantile":
        pc = r.get("paper_claim_id")
        e = last.get(claim_id(papers.PAPER_CLAIMS[int(pc)])) if pc is not None else None
        return EARLIER_INVALID if e and e["after_data"] else None
    paired = r.get("ci_unpaired_low") is not None and (last.get(PAIRED_RULE) or {}).get("after_data")
    margin = r.get("delta") is not None and (first.get(f"margin {r['table']}") or {}).get("after_data")
    if not (paired or margin):
        return None
    ci = (r["ci_unpaired_low"], r["ci_unpaired_high"]) if paired else (r["ci_low"], r["ci_high"])
    if None in ci:
        return stats.NOT_RESOLVED
    return stats.verdict(ci, r["side"], float(r.get("threshold") or 0.0), None if margin else r.get("delta"))


def load(results: Path) -> list[dict]:
    """The ledger's entries, in the order they were made ([] where there is none)."""
    path = Path(results) / LEDGER
    entries = (files.read_json(path, results, kind=dict) or {}).get("entries", [])
    kinds = {"id": str, "kind": str, "commit": str, "date": str, "reason": str, "runs_before": int, "after_data": bool}
    if not isinstance(entries, list) or not all(
            isinstance(e, dict) and "definition" in e and all(isinstance(e.get(k), t) for k, t in kinds.items())
            for e in entries):
        raise files.KeptFileError(f"{path}: entries is not a list of the ledger's entries (valid: objects with "
                                  f"definition and {', '.join(f'{k} ({t.__name__})' for k, t in kinds.items())})")
    return entries


def latest(entries: list[dict]) -> dict[str, dict]:
    """The newest entry of each id (entries are in the order they were made)."""
    return {e["id"]: e for e in entries}


def problems(entries: list[dict], results: Path) -> list[str]:
    """Each definition that differs from its newest entry, has none, or is gone while its entry stands."""
    last, out = latest(entries), []
    current = {d["id"]: d for d in definitions(results)}
    for key, d in current.items():
        e = last.get(key)
        if e is None or e["definition"] != d["definition"]:
            n = len(compared(d, results, e and e["definition"]))
            out.append(f"{key}: {'not in the ledger' if e is None else 'differs from its ledger entry'} ({n} of its "
                       f"runs kept{': an entry after the data, with its reason' if n else ''}; append one with "
                       "`python scripts/build_ledger.py --append" + (' --reason "..."`)' if n else "`)"))
    for key, e in last.items():
        if key not in current and e["kind"] != "rule" and e["definition"] is not None:
            out.append(f"{key}: in the ledger, no longer in the code (append its removal with "
                       "`python scripts/build_ledger.py --append --reason \"...\"`)")
    return out


def describe(e: dict) -> str:
    d, kind = e["definition"], e["kind"]
    if d is None:
        return "removed"
    if kind == "claim":
        return f"{d['side']}, threshold {d['threshold']}"
    if kind == "claim types":
        return ", ".join(f"{n} {t}" for t in papers.CLAIM_TYPES if (n := list(d.values()).count(t)))
    if kind == "margin":
        return "; ".join(f"{k} {v}" for k, v in d.items())
    if kind == "rule":
        return d
    if kind == "rules":
        return (", ".join(f"{k} {v}" for k, v in d["constants"].items()) + f"; the code of {len(d['code'])} rules "
                "(by fingerprint): " + ", ".join(d["code"]))
    cells = d["grid"] if kind == "look" else d
    by_seeds: dict[str, list] = {}
    for row, s in cells.items():
        by_seeds.setdefault(s, []).append("/".join(p.split("=", 1)[-1] for p in row.split(",")) or "the run")
    named = {s: ", ".join(rows) if len(rows) <= 8 else f"{len(rows)} rows" for s, rows in by_seeds.items()}
    text = "; ".join(f"{rows}: {s}" for s, rows in named.items())
    return text + (f"; at {d['level']}, deciding {len(d['claims'])} claim(s)" if kind == "look" else "")


def runs_after(entries: list[dict], results: Path) -> list[int]:
    """Each entry's kept runs after it, counted now: the runs its definition compares less its `runs_before`."""
    previous, out = {}, []
    for e in entries:
        before = previous.get(e["id"])
        now = len(compared(e, results, before and before["definition"])) if e["definition"] is not None else 0
        out.append(max(0, now - e["runs_before"]))
        previous[e["id"]] = e
    return out


def render(entries: list[dict], after_counts: list[int]) -> str:
    after = [e for e in entries if e.get("after_data")]
    lines = ["# Preregistration ledger", "", prose("ledger intro"), "",
             f"{len(entries)} entries, {len(after)} of them after the data.", "",
             "| what | definition | commit | date | runs before / after | after the data |", "|" + "---|" * 6]
    for e, n_after in zip(entries, after_counts):
        note = f"; {e['reason']}" if e.get("reason") else ""
        flag = f"**after the data**: {e['reason']}" if e.get("after_data") else f"no{note}"
        lines.append(f"| {e['id']} | {describe(e)} | {e['commit'][:7]} | {e['date'][:16].replace('T', ' ')} | "
                     f"{e['runs_before']} / {n_after} | {flag.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def write_ledger(results: Path) -> Path | None:
    entries = load(results)
    if not entries:
        return None
    return files.write_atomic(Path(results) / "preregistration.md", render(entries, runs_after(entries, results)))
