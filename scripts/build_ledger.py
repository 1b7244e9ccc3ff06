"""Appends entries to the preregistration ledger (`results/preregistration.json`, `highway_repro/report/ledger.py`).

    python scripts/build_ledger.py --append [--reason R] # an entry for each definition that differs from its newest
    python scripts/build_ledger.py --append --rule "NAME: what the rule now says" --reason R   # a reading rule

An entry names the commit that holds the change, with that commit's date (so commit the change first: `--append`
refuses while the package or the configs have changes not committed), and counts every run kept now as before it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from highway_repro import files  # noqa: E402
from highway_repro.report import ledger  # noqa: E402

RESULTS = ROOT / "results"


def git(*args: str) -> str:
    """A git command's output in the checkout (an error stops the script)."""
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def make_entry(d: dict, commit: str, before_value=None, reason: str = "", previous=None) -> dict:
    """A ledger entry for definition `d` made at `commit`, every run kept now counted as before it; `previous`: the
    definition its newest entry holds."""
    full, iso = git("log", "-1", "--format=%H %cI", commit).split()
    before = len(ledger.compared(d, RESULTS, previous))
    if before_value is not None and d["kind"] != "rule":
        reason += f"{'; ' if reason else ''}before it: {ledger.describe({**d, 'definition': before_value})}"
    e = {k: d[k] for k in ("id", "kind", "table", "rows", "second_look") if k in d}
    e.update(definition=d["definition"], commit=full, date=iso, runs_before=before, after_data=before > 0,
             reason=reason)  # the runs after it: counted when the page is written (ledger.runs_after)
    return e


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
    made = [make_entry(d, head, old, reason, old) for d, old in new]
    missing = [e["id"] for e in made if e["after_data"] and not reason]
    if missing:
        raise SystemExit("after the data (runs kept), give --reason: " + "; ".join(missing))
    return entries + made


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--append", action="store_true", required=True, help="append an entry for each changed definition")
    ap.add_argument("--reason", default="", help="what changed and why (required after the data)")
    ap.add_argument("--rule", help='a reading rule, "NAME: what it now says"')
    args = ap.parse_args(argv)
    if git("status", "--porcelain", "--", "highway_repro", "configs").strip():
        print("error: highway_repro/ or configs/ has changes not committed (valid: commit the change first; an entry "
              "names the commit that holds it, with that commit's date)", file=sys.stderr)
        return 2
    entries = append(args.reason, args.rule)
    path = files.write_atomic(RESULTS / ledger.LEDGER, json.dumps({"entries": entries}, indent=1) + "\n", RESULTS)
    ledger.write_ledger(RESULTS)
    print(f"wrote {path.relative_to(ROOT)} ({len(entries)} entries) and its page", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
