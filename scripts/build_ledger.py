"""The preregistration ledger (`results/preregistration.json`, `highway_repro/report/ledger.py`) from the git history,
and its later entries.

    python scripts/build_ledger.py                       # derive every entry from the history, print it (JSON)
    python scripts/build_ledger.py --write               # ... and write the ledger (only where there is none)
    python scripts/build_ledger.py --append [--reason R] # an entry for each definition that differs from its newest
    python scripts/build_ledger.py --append --rule "NAME: what the rule now says" --reason R   # a reading rule

The derivation: for each definition the ledger checks (`ledger.definitions`), the first commit of the last
unbroken stretch of commits whose files give it as it stands now (papers.yaml at each of its versions, read by
today's papers.py; before papers.yaml, papers.py at each of its versions; the sweep
files at each commit that touched them, before `configs/sweep/<table>/` the scale files' seeds and extra grids; the
second look's file, `stats.SECOND_LOOK` and `papers.SECOND_LOOK_CLAIMS`); the claims papers.py no longer holds, when
they came and went; the reading rules, at the commit that added their code. Each kept run's time is the commit that
added its metrics.json under results/, following moves (one `git log` pass). An entry appended with `--append` names
the commit that holds the change, with that commit's date (so commit the change first: `--append` refuses while the
package or the configs have changes not committed), and counts every run kept now as before it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from highway_repro import files  # noqa: E402
from highway_repro.report import ledger, papers  # noqa: E402
from highway_repro.report.grids import params_of  # noqa: E402
from highway_repro.targets import TARGETS  # noqa: E402

RESULTS = ROOT / "results"
PAPERS = "highway_repro/report/papers.py"
PAPERS_DATA = "highway_repro/report/papers.yaml"
STATS = "highway_repro/report/stats.py"
OLD_GRID = {"ht_zoo_char_ptb": "ht_gate_zoo", "ht_zoo_char_ptb_rt": "ht_gate_zoo", "ht_zoo_enwik8_l6": "ht_gate_zoo"}
# the reading rules: (id, what it says, the file and a string its code or docstring has held since it came)
RULES = [("rule: Holm verdicts", "a Holm verdict is NO DIFFERENCE only where the raw interval contains the threshold",
          STATS, "keeps the raw definition"),
         ("rule: one device per comparison", "a table compares the runs of one device; runs made on a GPU at the cpu "
          "scale are kept apart (`<table>-cpu-gpu`) and not compared", "highway_repro/report/runs.py",
          "def one_device")]
# why a definition came after its data, by the commit that fixed it and the definition's id or kind: from the
# commit's message and its change (NOTES: the same for a definition fixed before its data)
REASONS = {
    ("faf8662", "claim"): "the papers' comparisons are written into papers.PAPER_CLAIMS after runs of their rows were "
    "kept and their verdicts published (the first seeds, 0-1 or 0-2; Fig. 1: all 26 trials a row); the commit's "
    "'fixed before the runs that decide them' holds for the runs added since (seeds 2-4, the second looks) only",
    ("faf8662", "margin"): "the equivalence margins (papers.MARGINS, each with its reason) are set after the table's "
    "first runs were kept and their verdicts published; they come before the runs added since only",
    ("faf8662", "seeds"): "5 seeds for every row a paper claim compares, 2 elsewhere (the scale files' extra grids), "
    "set after the rows' first seeds were kept and their verdicts published; the seeds it adds (2-4) ran after it",
    ("db926e6", "seeds"): "a study takes the third seed its table adds to the rows the two share (the extra grids cut "
    "to the study's rows), after both tables' runs were kept: the study then reads the same runs, with the same "
    "verdicts, as its table; no run trained for it",
    ("cacc18d", "claim"): "Fig. 1's claims move from a percentile bootstrap of the best trial and of the top-10 mean "
    "to an exact order-statistic test on the 20 % quantile of each row's trials (failures included), after every "
    "Fig. 1 trial was kept and read: the best of a row's trials has no valid interval",
    ("cacc18d", "claim types"): "claim types (trend, level, own, artifact) are introduced after every table's runs "
    "were kept and read: a level claim at a reduced scale is shown as paper scale only and counted in no verdict, "
    "Fig. 1 at depth 50 and the placement scan count as the project's own claims, the paper's 'layers 3-6' as an "
    "artifact of the official code",
    ("cacc18d", "margin"): "a paper claim's equivalence margin becomes at most half the paper's own effect "
    "(papers.PAPER_EFFECT_SHARE), after the table's runs were kept and read, so that NO DIFFERENCE never covers an "
    "effect of the paper's size",
    ("cacc18d", "look"): "the claims decided at the second look become the 20 % quantile test (they were the best "
    "trial and the top-10 mean) after all 148 of its trials were kept and read; its grid and its 99 % level stand "
    "as committed before its runs",
    ("cacc18d", "rule: Holm verdicts"): "a Holm verdict is NO DIFFERENCE only where the raw interval contains the "
    "threshold (it was wherever the adjusted equivalence test passed), set after the runs were kept and read, so "
    "that a difference the raw interval shows is never called no difference once the family widens it",
    ("cacc18d", "rule: one device per comparison"): "the 46 runs made on a GPU at the cpu scale move to "
    "`<table>-cpu-gpu` and a table compares the runs of the device most of its runs were made on, after those runs "
    "were kept and read: a GPU-made run differs from its CPU twin by more than the effects the cpu-scale tables "
    "test (docs/gpu.md)",
}
NOTES = {
    ("3b84a26", "seeds"): "26 trials a row, the budget, set with the recipe change, before the recipe's runs",
    ("403541b", "look"): "committed before its runs: layer 1 vs layer 6 to 9 seeds a row, read at 99 %",
}


def git(*args: str) -> str:
    """A git command's output in the checkout (an error stops the script)."""
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


@cache
def show(commit: str, path: str) -> str | None:
    """A file's text at `commit`; None where it did not exist."""
    r = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


@cache
def commit_info(commit: str) -> tuple[str, int, str]:
    """(full hash, committer time, ISO date)."""
    full, t, iso = git("log", "-1", "--format=%H %ct %cI", commit).split()
    return full, int(t), iso


def touching(*paths: str) -> list[str]:
    """The commits that changed any of `paths`, oldest first."""
    return git("log", "--reverse", "--format=%H", "--", *paths).split()


@cache
def papers_at(commit: str):
    """The papers' numbers and claims at `commit`: its papers.yaml read by today's papers.py (a module of its own, the
    file beside it); before papers.yaml, papers.py as it read then (a standalone module: the standard library only)."""
    data = show(commit, PAPERS_DATA)
    if data is not None:
        with tempfile.TemporaryDirectory() as folder:
            (Path(folder) / "papers.yaml").write_text(data)
            (Path(folder) / "papers.py").write_text((ROOT / PAPERS).read_text())
            spec = importlib.util.spec_from_file_location(f"papers_{commit[:7]}", Path(folder) / "papers.py")
            module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # (its dataclasses look it up)
            spec.loader.exec_module(module)
            return module
    src = show(commit, PAPERS)
    if src is None:
        return None
    ns = {"__name__": f"papers_{commit[:7]}"}
    exec(compile(src, PAPERS, "exec"), ns)
    return SimpleNamespace(**ns)


def kept_run_times() -> dict[str, int]:
    """Results-relative run folder -> the time of the commit that added its metrics.json (moves followed)."""
    out, when = {}, 0
    log = git("log", "--reverse", "-M", "--name-status", "--format=@@%ct", "--", ":(glob)results/**/metrics.json")
    for line in log.splitlines():
        if line.startswith("@@"):
            when = int(line[2:])
            continue
        parts = line.split("\t")
        if not parts[0]:
            continue
        status, paths = parts[0][0], [p.removeprefix("results/").removesuffix("/metrics.json") for p in parts[1:]]
        if status == "A":
            out[paths[0]] = when
        elif status == "R":
            out[paths[1]] = out.pop(paths[0], when)
        elif status == "D":
            out.pop(paths[0], None)
    return out


# ------------------------------------------------------------ each definition at a commit
def claims_at(commit: str) -> dict[str, dict]:
    """The paper claims' entries at `commit`, by id."""
    pp = papers_at(commit)
    return {ledger.claim_id(c): ledger.claim_entry(c) for c in getattr(pp, "PAPER_CLAIMS", [])}


def types_at(commit: str) -> dict | None:
    """The paper claims' types at `commit` (None before papers.PaperClaim had them)."""
    pp = papers_at(commit)
    claims = getattr(pp, "PAPER_CLAIMS", [])
    return ledger.types_entry(claims)["definition"] if claims and hasattr(claims[0], "claim_type") else None


def old_layout(table: str, commit: str) -> list[dict]:
    """The grid of a table before `configs/sweep/<table>/`: the rows of `configs/sweep/<grid>.yaml` with the
    seeds of its experiment's cpu scale file for every row, and that file's extra grids for the rows they share."""
    rows_text = show(commit, f"configs/sweep/{OLD_GRID.get(table, table)}.yaml")
    scale_text = show(commit, f"configs/experiment_scale/{TARGETS[table].experiment}/cpu.yaml")
    if rows_text is None or scale_text is None:
        return []
    rows = params_of(rows_text)
    scale = yaml.safe_load(scale_text) or {}
    seeds = ((scale.get("hydra") or {}).get("sweeper") or {}).get("params") or {}
    main = {**rows, **seeds}
    keys = {k: set(ledger.swept(v)) for k, v in rows.items() if k not in ledger.REPEAT_KEYS}
    out = [main]
    for extra in scale.get("extra_grids") or []:
        shared = {k: ",".join(sorted(keys[k] & set(ledger.swept(v)))) if k in keys else v for k, v in extra.items()}
        if all(shared.values()):
            out.append({**main, **shared})
    return out


def seeds_at(table: str, commit: str, look: bool = False) -> dict | None:
    """The table's first look (or second look) at `commit`: each row's seeds; None where it had none."""
    folder = f"configs/sweep/{table}/"
    files = git("ls-tree", "--name-only", commit, folder).split()
    names = [n for n in files if n.startswith(f"{folder}{ledger.SCALE}")
             and n.endswith(ledger.SECOND_LOOK_FILE) == look]
    if f"{folder}{ledger.SCALE}.yaml" in files:
        params = [params_of(show(commit, n)) for n in names]
    else:
        params = [] if look else old_layout(table, commit)
    return ledger.seeds_entry(table, params)["definition"] if params else None


def look_at(table: str, commit: str) -> dict | None:
    """The table's second look at `commit`: its grid, `stats.SECOND_LOOK` and the claims it decides."""
    level = next((float(line.split("=")[1].split("#")[0]) for line in (show(commit, STATS) or "").splitlines()
                  if line.startswith("SECOND_LOOK =")), None)
    grid = seeds_at(table, commit, look=True)
    pp = papers_at(commit)
    if grid is None:
        return None
    return {"grid": grid, "level": f"{level:g}" if level else "none",
            "claims": sorted(ledger.claim_id(c) for c in getattr(pp, "SECOND_LOOK_CLAIMS", []) if c.table == table)}


def history(d: dict) -> tuple[list[str], Callable]:
    """The commits that may change definition `d`, and its value at a commit."""
    kind, table = d["kind"], d["table"]
    if kind == "claim":
        return touching(PAPERS, PAPERS_DATA), lambda c: (claims_at(c).get(d["id"]) or {}).get("definition")
    if kind == "claim types":
        return touching(PAPERS, PAPERS_DATA), types_at
    if kind == "margin":
        metrics = ledger.table_metrics(table, RESULTS)
        return touching(PAPERS, PAPERS_DATA), lambda c: papers_at(c) and ledger.margin_entry(
            table, papers_at(c), metrics)["definition"]
    old = [f"configs/sweep/{OLD_GRID.get(table, table)}.yaml",
           f"configs/experiment_scale/{TARGETS[table].experiment}/cpu.yaml"]
    if kind == "seeds":
        return touching(f"configs/sweep/{table}", *old), lambda c: seeds_at(table, c)
    return touching(f"configs/sweep/{table}", PAPERS, PAPERS_DATA, STATS), lambda c: look_at(table, c)


def fixed(d: dict) -> tuple[str, object]:
    """The first commit of the last stretch that gives `d` as it stands, and the value before that stretch."""
    commits, value = history(d)
    first, before = None, None
    for c in reversed(commits):
        v = value(c)
        if v != d["definition"]:
            before = v
            break
        first = c
    if first is None:
        raise SystemExit(f"{d['id']}: the code's definition is in no commit yet (commit it, or use --append)")
    return first, before


# ------------------------------------------------------------ entries
def make_entry(d: dict, commit: str, times: dict | None, before_value=None, reason: str = "", previous=None) -> dict:
    """A ledger entry for definition `d` fixed at `commit`; `times`: the kept runs' commit times (None: every run
    kept now is before it, as for a change not yet committed); `previous`: the definition its newest entry holds."""
    full, t, iso = commit_info(commit)
    runs = ledger.compared(d, RESULTS, previous)
    before = len(runs) if times is None else sum(times.get(r, float("inf")) <= t for r in runs)
    why = REASONS if before else NOTES
    reason = reason or why.get((full[:7], d["id"]), why.get((full[:7], d["kind"]), ""))
    if before_value is not None and d["kind"] != "rule":
        reason += f"{'; ' if reason else ''}before it: {ledger.describe({**d, 'definition': before_value})}"
    e = {k: d[k] for k in ("id", "kind", "table", "rows", "second_look") if k in d}
    e.update(definition=d["definition"], commit=full, date=iso, runs_before=before, after_data=before > 0,
             reason=reason)  # the runs after it: counted when the page is written (ledger.runs_after)
    return e


def removed_claims() -> list[tuple[dict, str, str]]:
    """(the last definition, the commit that fixed it, the commit that removed it) of each claim papers.py held
    and holds no more."""
    commits = [c for c in touching(PAPERS, PAPERS_DATA) if papers_at(c) is not None]
    now, out = {ledger.claim_id(c) for c in papers.PAPER_CLAIMS}, []
    gone = {key for c in commits for key in claims_at(c)} - now
    for key in sorted(gone):
        present = [i for i, c in enumerate(commits) if key in claims_at(c)]
        last = present[-1]
        d = claims_at(commits[last])[key]
        first = last
        while first > 0 and claims_at(commits[first - 1]).get(key) == d:
            first -= 1
        look = {ledger.claim_id(c) for c in getattr(papers_at(commits[last]), "SECOND_LOOK_CLAIMS", [])}
        d = {**d, **({"second_look": True} if key in look else {})}
        out.append((d, commits[first], commits[last + 1]))
    return out


def derive() -> list[dict]:
    times = kept_run_times()
    entries = []
    for d in ledger.definitions(RESULTS):
        commit, before = fixed(d)
        entries.append(make_entry(d, commit, times, before))
    for d, first, gone in removed_claims():
        entries.append(make_entry(d, first, times))
        entries.append(make_entry({**d, "definition": None}, gone, times))
    for key, what, path, marker in RULES:
        commit = git("log", "--reverse", "--format=%H", "-S", marker, "--", path).split()[0]
        entries.append(make_entry({"id": key, "kind": "rule", "table": None, "definition": what}, commit, times))
    order = ("claim", "claim types", "margin", "seeds", "look", "rule")
    return sorted(entries, key=lambda e: (commit_info(e["commit"])[1], order.index(e["kind"]), e["id"]))


def append(reason: str, rule: str | None) -> list[dict]:
    """Entries for the definitions that differ from their newest ledger entry (or have none, or are gone), made on
    the current commit; every run kept now counts as before them."""
    entries, head = ledger.load(RESULTS), git("rev-parse", "HEAD").strip()
    last, new = ledger.latest(entries), []
    current = {d["id"]: d for d in ledger.definitions(RESULTS)}
    for key, d in current.items():
        if key not in last or last[key]["definition"] != d["definition"]:
            new.append((d, last.get(key, {}).get("definition")))
    for key, e in last.items():
        if key not in current and e["kind"] != "rule" and e["definition"] is not None:
            new.append(({**e, "definition": None}, None))
    if rule:
        name, _, what = rule.partition(":")
        new.append(({"id": f"rule: {name.strip()}", "kind": "rule", "table": None, "definition": what.strip()}, None))
    made = [make_entry(d, head, None, old, reason, old) for d, old in new]  # the commit's own date
    missing = [e["id"] for e in made if e["after_data"] and not reason]
    if missing:
        raise SystemExit("after the data (runs kept), give --reason: " + "; ".join(missing))
    return entries + made


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="write the derived ledger (only where there is none)")
    ap.add_argument("--append", action="store_true", help="append an entry for each changed definition")
    ap.add_argument("--reason", default="", help="what changed and why (required after the data)")
    ap.add_argument("--rule", help='with --append: a reading rule, "NAME: what it now says"')
    args = ap.parse_args(argv)
    path = RESULTS / ledger.LEDGER
    if args.append and git("status", "--porcelain", "--", "highway_repro", "configs").strip():
        print("error: highway_repro/ or configs/ has changes not committed (valid: commit the change first; an entry "
              "names the commit that holds it, with that commit's date)", file=sys.stderr)
        return 2
    entries = append(args.reason, args.rule) if args.append else derive()
    text = json.dumps({"entries": entries}, indent=1) + "\n"
    if args.append or args.write:
        if args.write and path.exists():
            raise SystemExit(f"{path} exists: the ledger is built once; later changes are appended (--append)")
        files.write_atomic(path, text, RESULTS)
        ledger.write_ledger(RESULTS)
        print(f"wrote {path.relative_to(ROOT)} ({len(entries)} entries) and its page", file=sys.stderr)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
