"""The preregistration ledger (results/preregistration.json, report/ledger.py): the code's definitions (the paper
claims' tests, margins, seeds, looks) match their newest entries; a change after the data needs an entry that says
so, with its reason; the page names every such entry; the ledger only grows."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import replace

import pytest

from conftest import REPO, load_script
from highway_repro import grids
from highway_repro.report import claims, ledger, papers, runs, stats

RESULTS = REPO / "results"


@pytest.fixture(scope="module")
def entries() -> list[dict]:
    return ledger.load(RESULTS)


def _script():
    return load_script("build_ledger")


def test_every_definition_matches_its_newest_ledger_entry(entries):
    """The check `make test` runs: a claim's test, a table's margins, seeds or second look that differ from the
    ledger's newest entry for them (or have none) fail here until an entry is appended
    (`python scripts/build_ledger.py --append [--reason ...]`)."""
    assert entries, "results/preregistration.json is missing (it is committed with the kept runs)"
    problems = ledger.problems(entries, RESULTS)
    assert not problems, "\n".join(problems)


def test_a_change_after_the_data_fails_until_an_entry_says_why(entries, monkeypatch):
    """Turning a claim's side, a margin's share or a table's seeds is caught, with the runs it compares counted; an
    appended entry that marks the change after the data, with its reason, clears it; a new claim on rows without
    runs needs an entry too (its first), but no reason."""
    claim = next(c for c in papers.PAPER_CLAIMS if c.table == "ht_char_ptb")
    turned = replace(claim, side="higher")
    new = papers.PaperClaim("ht_char_ptb", ("new_row",), ("other_new_row",), "test/bpc", "lower", "", "none")
    monkeypatch.setattr(papers, "PAPER_CLAIMS", [turned if c is claim else c for c in papers.PAPER_CLAIMS] + [new])
    monkeypatch.setattr(papers, "PAPER_EFFECT_SHARE", 0.25)
    found = ledger.problems(entries, RESULTS)
    by_id = {p.split(":")[0]: p for p in found}
    assert set(by_id) == {ledger.claim_id(claim), ledger.claim_id(new), "margin ht_char_ptb", "margin ht_word_ptb",
                          "margin ht_enwik8_l6", "margin ht_enwik8_l12", "margin ht_paper_anchor", "claim types",
                          "rules"}, found
    turned_text = by_id[ledger.claim_id(claim)]
    assert "differs from its ledger entry (10 of its runs kept: an entry after the data" in turned_text
    assert "not in the ledger (0 of its runs kept;" in by_id[ledger.claim_id(new)]
    assert "differs from its ledger entry (0 of its runs kept;" in by_id["claim types"]  # only the new claim's type
    appended = [{**d, "commit": "0" * 40, "date": "2100-01-01T00:00:00+00:00", "runs_before": 1, "runs_after": 0,
                 "after_data": True, "reason": "why"} for d in ledger.definitions(RESULTS)
                if d["id"] in by_id]
    assert ledger.problems(entries + appended, RESULTS) == []


def test_a_changed_seed_list_is_caught(entries, tmp_path, monkeypatch):
    shutil.copytree(REPO / "configs" / "sweep", tmp_path / "sweep")
    extra = tmp_path / "sweep" / "ht_char_ptb" / "cpu-extra_seeds.yaml"
    extra.write_text(extra.read_text().replace("seed: 2,3,4", "seed: 2,3,4,5"))
    monkeypatch.setattr(grids, "SWEEP_DIR", tmp_path / "sweep")
    assert [p.split(":")[0] for p in ledger.problems(entries, RESULTS)] == ["seeds ht_char_ptb"]


def test_append_adds_an_entry_after_the_data_only_with_a_reason(entries, monkeypatch):
    """How a contributor records a change: `build_ledger.py --append --reason ...` appends an entry for each
    definition that differs, made on the current commit, every kept run counted as before it."""
    if not (REPO / ".git").exists():
        pytest.skip("no git history here")
    build = _script()
    claim = next(c for c in papers.PAPER_CLAIMS if c.table == "ht_word_ptb")
    monkeypatch.setattr(papers, "PAPER_CLAIMS", [replace(claim, side="higher") if c is claim else c
                                                 for c in papers.PAPER_CLAIMS])
    with pytest.raises(SystemExit, match="give --reason"):
        build.append("", None)
    grown = build.append("the paper's side read again", None)
    assert grown[:len(entries)] == entries and len(grown) == len(entries) + 1
    new = grown[-1]
    kept = [p for p in (RESULTS / "highway_transformer" / "runs").glob("ht_word_ptb-cpu*/*/metrics.json")
            if any(f"variant={v}" in p.parent.name for v in (*claim.row, *claim.against))]  # either device
    assert new["id"] == ledger.claim_id(claim) and new["after_data"] and new["runs_before"] == len(kept) >= 10
    assert new["reason"] == "the paper's side read again; before it: lower, threshold 0"
    assert re.fullmatch(r"[0-9a-f]{40}", new["commit"])
    assert ledger.problems(grown, RESULTS) == []


def test_the_page_names_every_after_the_data_entry_with_its_reason(entries):
    page = ledger.render(entries, ledger.runs_after(entries, RESULTS))
    lines = {line.split(" | ")[0].removeprefix("| "): line for line in page.splitlines() if line.startswith("| ")}
    after = [e for e in entries if e["after_data"]]
    assert after and f"{len(entries)} entries, {len(after)} of them after the data." in page
    for e in after:
        assert f"**after the data**: {e['reason'].replace('|', '/')}" in page, e["id"]
        assert e["id"] in lines
    assert page.count("**after the data**:") == len(after)
    assert (RESULTS / "preregistration.md").read_text() == page, "results/preregistration.md is stale: make tables"


def test_the_ledger_only_grows(entries):
    """Append-only: every entry names a commit of the history and a date, dates never go back, an entry after the
    data says why, and the committed ledger is the start of the current one."""
    assert all(re.fullmatch(r"[0-9a-f]{40}", e["commit"]) and e["date"] for e in entries)
    dates = [e["date"] for e in entries]
    assert dates == sorted(dates), "entries are appended in the order they were made"
    for e in entries:
        assert e["after_data"] == (e["runs_before"] > 0) and (e["reason"] or not e["after_data"]), e["id"]
        assert e["kind"] in ("claim", "claim types", "margin", "seeds", "look", "rule", "rules"), e["id"]
    if not (REPO / ".git").exists():
        pytest.skip("no git history here")
    known = subprocess.run(["git", "cat-file", "--batch-check"], cwd=REPO, capture_output=True, text=True,
                           input="\n".join(sorted({e["commit"] for e in entries})) + "\n").stdout
    assert "missing" not in known, known
    committed = subprocess.run(["git", "show", f"HEAD:results/{ledger.LEDGER}"], cwd=REPO, capture_output=True,
                               text=True)
    if committed.returncode == 0:
        before = json.loads(committed.stdout)["entries"]
        assert entries[:len(before)] == before, "an entry of the committed ledger was changed or removed"


def _holm_without_the_raw_interval_rule(tests, alpha=0.05):
    return stats.holm_verdicts(tests, alpha)


def _quantile_test_without_bonferroni(xs, q, threshold, side, ys=None, level=stats.LEVEL):
    return stats.quantile_test(xs, q, threshold, side, ys, 1 - 2 * (1 - level) if ys is not None else level)


# Each rule or constant that decides a verdict, changed once (as a contributor's edit would change it): the six that
# the claims' own entries cannot see first (Fig. 1's factor would turn its paper claims into own ones).
RULE_CHANGES = {
    "Fig. 1's 100x factor": (papers, "FIG1_HIGHWAY_FACTOR", 1000.0),
    "the confidence level": (stats, "LEVEL", 0.9),
    "the pairing rule": (claims, "seed_pairs", lambda row, other, m: None),
    "the one-device rule": (runs, "one_device", lambda kept: (kept, [])),
    "the quantile test's Bonferroni": (stats, "quantile_test", _quantile_test_without_bonferroni),
    "Holm's NO DIFFERENCE rule": (stats, "holm_verdicts", _holm_without_the_raw_interval_rule),
    "the second look's level": (stats, "SECOND_LOOK", 0.95),
    "the paper-effect share": (papers, "PAPER_EFFECT_SHARE", 0.25),
    "the negligible share": (papers, "NEGLIGIBLE_SHARE", 0.01),
    "Table 1's threshold": (papers, "TABLE1_CLAIM_STDS", 3.0),
    "the margins": (papers, "margin", lambda metric, baseline_mean, effect=None: None),
    "the verdict": (stats, "verdict", lambda interval, side, threshold=0.0, delta=None: stats.NOT_RESOLVED),
    "the claim types' rule": (papers.PaperClaim, "claim_type", property(lambda self: "trend")),
    "the test of two rows": (claims, "two_rows_claim", lambda res, row, other, used, table_rows: None),
    "the test of one sample": (claims, "one_sample_claim", lambda res, row: None),
}


@pytest.mark.parametrize("change", list(RULE_CHANGES))
def test_a_changed_reading_rule_or_constant_needs_an_entry(entries, monkeypatch, change):
    """The ledger's `rules` entry holds every constant that decides a verdict and a fingerprint of the code of every
    rule: any change differs from its newest entry, so the check above fails until an entry is appended."""
    newest = ledger.latest(entries)["rules"]["definition"]
    assert ledger.rules_entry()["definition"] == newest
    monkeypatch.setattr(*RULE_CHANGES[change])
    assert ledger.rules_entry()["definition"] != newest, change


def _claim(table, against_number=False):
    return next(c for c in papers.PAPER_CLAIMS if c.table == table and isinstance(c.against, tuple) != against_number)


def _replace(monkeypatch, claim, **change):
    monkeypatch.setattr(papers, "PAPER_CLAIMS", [replace(claim, **change) if c is claim else c
                                                 for c in papers.PAPER_CLAIMS])


DEFINITION_CHANGES = {  # each definition a verdict rests on, changed once: (the change, the ids it must name)
    "a claim's side": (lambda mp: _replace(mp, _claim("ht_word_ptb"), side="higher"),
                       {ledger.claim_id(_claim("ht_word_ptb"))}),
    "a claim's threshold": (lambda mp: _replace(mp, _claim("hn_cifar", True), against=91.0),
                            {"claim hn_cifar highway vs a number on test/acc"}),
    "a claim's type": (lambda mp: _replace(mp, _claim("ht_char_ptb"), stated="none"), {"claim types"}),
    "a margin": (lambda mp: mp.setattr(papers, "MARGINS", {**papers.MARGINS, "acc": papers.Margin(0.3, False, "")}),
                 {"margin hn_cifar"}),
    "a second look's claims": (lambda mp: mp.setattr(papers, "SECOND_LOOK_CLAIMS", papers.SECOND_LOOK_CLAIMS[:1]),
                               {"second look ht_placement_scan"}),
}


@pytest.mark.parametrize("change", list(DEFINITION_CHANGES))
def test_a_changed_definition_is_named_until_an_entry_records_it(entries, monkeypatch, change):
    mutate, named = DEFINITION_CHANGES[change]
    mutate(monkeypatch)
    assert {p.split(":")[0] for p in ledger.problems(entries, RESULTS)} == named


def test_grids_and_seed_lists():
    g = ledger.grid([{"variant": "a,b", "seed": "0,1"}, {"variant": "b", "seed": "2,3,4"},
                     {"model.depth": 10, "model.kind": "plain", "trial": "range(0,3)"}])
    assert g == {"model.depth=10,model.kind=plain": ["0", "1", "2"], "variant=a": ["0", "1"],
                 "variant=b": ["0", "1", "2", "3", "4"]}
    assert ledger.compact(["0", "1", "2", "7", "1111"]) == "0-2,7,1111"
    assert ledger.expand("0-2,7,1111") == {"0", "1", "2", "7", "1111"}
