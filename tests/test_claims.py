"""The claim statistics beyond the interval: Holm's adjustment on a published example, the order-statistic interval
of a random search's quantile on a textbook example and its p-values at the interval's edge, the seeds and trials a
decision needs, each comparison counted once (a study reusing a table's runs links to the table), and two rows
trained on the same seeds tested paired (Student's sleep data)."""

from __future__ import annotations

import csv
import json
import math
import random

import pytest
from scipy.stats import t as student_t

from highway_repro.report import build_table, load_runs, stats, write_summary

from test_report import MACHINE, fake_run, welch_interval


def test_holm_adjusted_p_values_of_a_published_example():
    """The worked example of the Wikipedia article "Holm-Bonferroni method" (the procedure: Holm 1979, Scand. J.
    Statist. 6:65-70): four hypotheses with p = 0.01, 0.04, 0.03, 0.005 at alpha 0.05; H4 and H1 are rejected
    (0.005 < 0.05/4, 0.01 < 0.05/3), H3 is not (0.03 > 0.05/2), so neither is H2. The adjusted p-values of that
    step-down, max_j<=i min(1, (m - j + 1) p_(j)): 4 x 0.005 = 0.02, 3 x 0.01 = 0.03, 2 x 0.03 = 0.06, then
    max(0.06, 1 x 0.04) = 0.06; below 0.05 exactly for H1 and H4."""
    adjusted = stats.holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [p < 0.05 for p in adjusted] == [True, False, False, True]
    assert stats.holm([0.2]) == [0.2] and stats.holm([]) == []
    assert stats.holm([0.6, 0.5]) == [1.0, 1.0]  # capped at 1


def test_holm_verdicts_reduce_to_the_raw_ones_for_a_family_of_one_and_are_stricter_for_more():
    """One test: Holm changes nothing (the t-test's p agrees with its 95 % interval). Ten tests with p = 0.02 on the
    claim's side: each alone HELD (0.02 < 0.025), together none (10 x 0.02 > 0.025); a small p stays HELD."""
    a, b = [2.00, 2.01, 2.02], [2.10, 2.12, 2.11]
    ci = welch_interval(a, b)
    test = stats.t_test(a, b, "lower")["tests"]
    assert stats.holm_verdicts([test]) == [stats.verdict(ci, "lower")] == [stats.HELD]
    assert stats.holm_verdicts([test | {"p_side": test["p_other"], "p_other": test["p_side"]}]) == [stats.NOT_HELD]
    weak = {"p_side": 0.02, "p_other": 0.98, "p_equiv": None}
    assert stats.holm_verdicts([weak]) == [stats.HELD]
    assert stats.holm_verdicts([weak] * 10) == [stats.NOT_RESOLVED] * 10
    strong = {"p_side": 1e-4, "p_other": 1.0, "p_equiv": None}
    assert stats.holm_verdicts([strong] + [weak] * 9 + [None]) == [stats.HELD] + [stats.NOT_RESOLVED] * 10
    equal = {"p_side": 0.4, "p_other": 0.6, "p_equiv": 0.001}
    assert stats.holm_verdicts([equal, weak]) == [stats.NO_DIFFERENCE, stats.NOT_RESOLVED]
    small = {"p_side": 0.02, "p_other": 0.98, "p_equiv": 0.001}  # a small difference inside the margin
    assert stats.holm_verdicts([small]) == [stats.HELD]  # the raw verdict
    assert stats.holm_verdicts([small] * 10) == [stats.NOT_RESOLVED] * 10  # widened: never "no difference"


def test_order_statistic_interval_of_a_median_on_a_textbook_example():
    """The distribution-free 95 % interval of a median from n = 10 values is (x_(2), x_(9)): each end misses with
    P(B <= 1) = 11/1024 < 0.025, B ~ Binomial(10, 1/2), where (x_(3), x_(8)) would miss 56/1024 a side. At Fig. 1's
    quantile and 26 trials: (x_(2), x_(10)) alone at 95 %, (x_(1), x_(11)) at the Bonferroni level of a difference;
    100 trials at the second look's Bonferroni level: (x_(10), x_(33)). The lowest multiple of 5 % whose difference
    has a lower end with 26 trials is 20 %: (1 - q)^26 < 1.25 % needs q > 15.5 %."""
    assert stats.binom_cdf(10, 0.5)[1] == pytest.approx(11 / 1024) and stats.binom_cdf(10, 0.5)[2] == pytest.approx(
        56 / 1024)
    assert stats.binom_cdf(26, 0.2)[7] == pytest.approx(sum(math.comb(26, i) * 0.2 ** i * 0.8 ** (26 - i)
                                                            for i in range(8)))
    assert stats.quantile_ranks(10, 0.5, 0.025) == (2, 9)
    assert stats.quantile_ranks(26, 0.2, 0.025) == (2, 10) and stats.quantile_ranks(26, 0.2, 0.0125) == (1, 11)
    assert stats.quantile_ranks(100, 0.2, 0.0025) == (10, 33)
    assert [stats.quantile_ranks(26, q, 0.0125)[0] > 0 for q in (0.05, 0.1, 0.15, 0.2)] == [False] * 3 + [True]
    assert stats.quantile_ranks(3, 0.5, 0.025) == (0, 4)  # too few values: no end
    assert stats.quantile([5.0, 1.0, 4.0, 2.0, 3.0], 0.2) == 1.0 and stats.quantile(range(100), 0.2) == 19


def test_a_quantile_s_interval_ends_are_those_order_statistics():
    """The interval of `stats.quantile_test` ends at the order statistics above: the 26 trials 0..25 give (x_(2),
    x_(10)) = (1, 9) at 95 %, (0, 10) at the Bonferroni level; 3 values no end; and at every n up to 60 it is
    scipy.stats.quantile_test's interval at 1 - 2 x the miss of each end."""
    from scipy.stats import quantile_test

    assert stats.quantile_test([float(i) for i in range(26)], 0.2, 100.0, "lower")["ci"] == (1.0, 9.0)
    assert stats.quantile_test([float(i) for i in range(26)], 0.2, 0.0, "lower", [0.0] * 26)["ci"] == (0.0, 10.0)
    assert stats.quantile_test([1.0, 2.0, 3.0], 0.5, 0.0, "lower")["ci"] == (-math.inf, math.inf)
    for n in range(1, 61):
        for q, miss in ((0.2, 0.025), (0.2, 0.0025), (0.5, 0.0125)):
            ci = quantile_test([float(i) for i in range(1, n + 1)], p=q).confidence_interval(1.0 - 2.0 * miss)
            ends = (-math.inf if math.isnan(ci.low) else ci.low, math.inf if math.isnan(ci.high) else ci.high)
            assert stats._bounds([float(i) for i in range(1, n + 1)], q, miss) == ends, (n, q, miss)


@pytest.mark.parametrize("level", [stats.LEVEL, stats.SECOND_LOOK])
@pytest.mark.parametrize("side", ["lower", "higher"])
@pytest.mark.parametrize("two_rows", [False, True])
def test_a_quantile_p_value_agrees_with_its_interval_at_the_edge(level, side, two_rows):
    """A quantile of a random search's trials (with ties), alone or as a difference of two: at thresholds on each end
    of its interval, one step of a float either side, and at 200 differences of two trials, the p-values read at
    `level` (through a family of one, as the report reads them) give the interval's verdict."""
    rng = random.Random(3)
    n = 26 if level == stats.LEVEL else 100
    xs = [round(rng.gauss(-3.0, 1.0), 1) for _ in range(n)]
    ys = [round(rng.gauss(-1.0, 0.5), 1) for _ in range(n)] if two_rows else None
    lo, hi = stats.quantile_test(xs, 0.2, 0.0, side, ys, level)["ci"]
    edges = [e for e in (lo, hi) if math.isfinite(e)]
    thresholds = [f(e, d) for e in edges for f, d in ((math.nextafter, -math.inf), (lambda e, d: e, 0),
                                                     (math.nextafter, math.inf))]
    thresholds += [rng.choice(xs) - (rng.choice(ys) if ys else 0.0) for _ in range(200)]
    for t in thresholds:
        qt = stats.quantile_test(xs, 0.2, t, side, ys, level)
        raw = stats.verdict(qt["ci"], side, t)
        assert stats.holm_verdicts([stats.second_look_p(qt["tests"], level)]) == [raw], (t, qt)
    assert len(edges) == 2  # both ends exist at these sizes: HELD and DID NOT HOLD are both reachable


def test_seeds_needed_inverts_the_welch_half_width():
    """The smallest n per row at which (t at the level + t at the power) Welch standard errors fall below
    |difference| (or below delta - |difference|); power 1/2 is the half-width alone. Checked against the interval n
    values would give, and by simulation: normal rows with those spreads and that difference, n seeds a row, decide
    by Welch's 95 % interval in about 80 % of 4,000 draws (the normal-shift approximation: 78-84 %)."""
    import numpy as np

    sa, sb, diff = 0.02, 0.03, -0.03

    def half(m, power):
        df = (m - 1) * (sa ** 2 + sb ** 2) ** 2 / (sa ** 4 + sb ** 4)
        return (student_t.ppf(0.975, df) + student_t.ppf(power, df)) * math.sqrt((sa ** 2 + sb ** 2) / m)

    for power in (0.5, 0.8):
        n = stats.seeds_needed(sa, sb, diff, None, power=power)
        assert half(n, power) < abs(diff) <= half(n - 1, power)
    assert stats.seeds_needed(sa, sb, diff, None) == n > stats.seeds_needed(sa, sb, diff, None, power=0.5)
    rng = np.random.default_rng(0)
    a, b = rng.normal(diff, sa, (4000, n)), rng.normal(0.0, sb, (4000, n))
    va, vb = a.var(axis=1, ddof=1) / n, b.var(axis=1, ddof=1) / n
    df = (va + vb) ** 2 / (va ** 2 / (n - 1) + vb ** 2 / (n - 1))
    upper = a.mean(axis=1) - b.mean(axis=1) + student_t.ppf(0.975, df) * np.sqrt(va + vb)
    assert 0.78 <= np.mean(upper < 0) <= 0.84
    assert stats.seeds_needed(sa, sb, -0.01, 0.05) < stats.seeds_needed(sa, sb, -0.01, None)  # equivalence is nearer
    assert stats.seeds_needed(0.0, 0.0, 0.1, None) is None
    assert [stats.points_to(-0.03, "lower"), stats.points_to(0.03, "lower"), stats.points_to(0.03, "higher"),
            stats.points_to(-0.01, "lower", delta=0.05), stats.points_to(-2.5, "lower", threshold=-2.0)] == [
        stats.HELD, stats.NOT_HELD, stats.HELD, stats.NO_DIFFERENCE, stats.HELD]


def test_decision_cost_counts_the_runs_to_add_against_the_table_budget():
    """27 seeds a row, from 3 and 2: 24 + 25 = 49 more runs of 1.5 h on 2 cores = 36.75 h, over the 8 h budget;
    a row already past the seeds needed adds nothing; the budget is the table's, its runs so far included."""
    assert stats.decision_cost(27, (3, 2), 5400.0) == (49, 36.75, 36.75, True)
    assert stats.decision_cost(6, (5, 7), 1800.0) == (1, 0.25, 0.25, False)
    assert stats.decision_cost(6, (5, 7), 1800.0, table_s=2 * 7.5 * 3600) == (1, 0.25, 7.75, False)
    assert stats.decision_cost(6, (5, 5), 1800.0, table_s=2 * 7.5 * 3600) == (2, 0.5, 8.0, False)
    assert stats.decision_cost(7, (5, 5), 1800.0, table_s=2 * 7.5 * 3600)[3]  # 7.5 + 0.75 h > 8 h


def test_an_unresolved_claim_says_what_a_decision_would_cost(tmp_path):
    """The seeds a decision needs, the runs that adds and their hours on 2 cores from the rows' own CPU time per
    thread; past the 8 h budget of a table the line says so."""
    from highway_repro.report.claims import Claim, claim_line, test_claim
    from highway_repro.report.measures import Measure, Row

    rows = {}
    for v, xs in {"a": (2.00, 2.04, 1.98), "b": (2.01, 2.05, 2.00)}.items():
        runs = []
        for seed, x in enumerate(xs):
            fake_run(tmp_path / f"{v}{seed}", [f"seed={seed}"], {"seed": seed},
                     {"status": "done", "test/bpc": x, "time/cpu_s": 2 * 5400.0}, run_info={**MACHINE, "threads": 2})
            runs.append(load_runs(tmp_path / f"{v}{seed}")[0])
        rows[(v,)] = Row((v,), v, runs)
    res = test_claim(Claim("ends lower", ("a",), Measure("test/bpc", "test bpc"), "lower", ("b",)), rows)
    n = res.seeds_needed
    assert res.verdict == stats.NOT_RESOLVED and n > 3
    hours = 2 * (n - 3) * 5400.0 / 2 / 3600  # runs of 1.5 h with a core to themselves, 2 at a time
    total = 6 * 5400.0 / 2 / 3600 + hours  # the table's 6 runs so far, and the added ones
    sd_b = stats.mean_std([2.01, 2.05, 2.00])[1]
    at_95 = stats.seeds_needed(res.std, sd_b, res.diff, res.delta, 0.95, start=3)
    assert n == stats.seeds_needed(res.std, sd_b, res.diff, res.delta, 0.99, start=3) > at_95  # at 99 %
    assert claim_line(res).endswith(f"about {n} seeds per row for a decision with 80 % power at the measured spread "
                                    f"and difference, at the second look's 99 % ({2 * (n - 3)} more runs, about "
                                    f"{hours:.1f} h on 2 cores; the table would then take {total:.1f} h, beyond the "
                                    "8 h a table may take at the cpu scale); the estimate points to HELD")


def _enwik8_runs(folder, variants, name="ht_enwik8_l6"):
    for v, values in variants.items():
        for seed, x in enumerate(values):
            fake_run(folder / f"seed={seed},variant={v}", [f"variant={v}", f"seed={seed}"],
                     {"variant": v, "seed": seed, "name": name},
                     {"status": "done", "step": 300, "val/bpc": x + 0.1, "test/bpc": x},
                     [{"step": 100, "val/bpc": x + 1}, {"step": 200, "val/bpc": x + 0.5}], MACHINE)


def test_a_comparison_links_to_its_best_home_whatever_the_files_order(tmp_path):
    """Two other claims files hold the same comparison: a part of a combined study (sorted first) and a table of
    its own; a third part links to the table of its own."""
    from highway_repro.report.claims_file import CLAIM_FIELDS, CLAIMS_FIELDS, comparisons_elsewhere

    def claims_file(name, table, part_of):
        row = dict.fromkeys(CLAIM_FIELDS, None) | {"kind": "claim", "row": "r", "claim": f"c of {table}",
                                                   "verdict": "HELD", "comparison": "k", "experiment": "e"}
        d = dict.fromkeys(CLAIMS_FIELDS, None) | {"table": table, "file": f"{name}.md", "part_of": part_of,
                                                  "rows": [row]}
        (tmp_path / f"{name}.claims.json").write_text(json.dumps(d))

    claims_file("a_part", "part_a", "study")
    claims_file("b_table", "table_b", None)
    home = comparisons_elsewhere(tmp_path / "c_part", "part_c", "study")
    assert home("k", "e") == {"table": "table_b", "file": "b_table.md", "row": "r", "claim": "c of table_b"}
    assert comparisons_elsewhere(tmp_path / "d_table", "table_d", None)("k", "e") is None  # as good a home itself


def test_a_study_reusing_a_tables_runs_adds_no_comparison(tmp_path):
    """The placement scan reuses the 6-layer table's baseline and all-layers runs: its lines on them link to the
    table (Markdown, and kind `same` in summary.csv) and leave its family; its own rows' comparisons stay. A study
    whose baseline has a run more than the table's is a comparison of its own."""
    table = {"baseline": [2.20, 2.21, 2.22], "sdu_tanh": [2.10, 2.12, 2.11]}
    scan = {"tanh_l1": [2.19, 2.20], "tanh_l6": [2.15, 2.16]}
    _enwik8_runs(tmp_path / "l6", table)
    _enwik8_runs(tmp_path / "scan", table | scan)  # the runner restores the table's runs under their folder names
    out = tmp_path / "results" / "highway_transformer"
    build_table("ht_enwik8_l6", load_runs(tmp_path / "l6"), out / "enwik8_l6", {"scale": "cpu"})
    md = build_table("ht_placement_scan", load_runs(tmp_path / "scan"), out / "placement_scan", {"scale": "cpu"})
    assert "`sdu_tanh` ends lower than the baseline: the same runs, measure and rows as " \
           "[ht_enwik8_l6](enwik8_l6.md)" in md
    write_summary(tmp_path / "results")
    with open(tmp_path / "results" / "summary.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["kind"] in ("claim", "same")]
    scan_rows = [r for r in rows if r["table"] == "ht_placement_scan"]
    same = [r for r in scan_rows if r["kind"] == "same"]
    assert len(same) == 2 and all(r["same_as"].startswith("highway_transformer/enwik8_l6.md: ") for r in same)
    assert all(r["verdict"] == "" or r["kind"] == "same" for r in same)
    own = [r for r in scan_rows if r["kind"] == "claim"]
    # tanh_l1 and tanh_l6 vs baseline (ends lower, converges faster), and the paper's bottom-vs-top claim
    assert len(own) == 5 and {r["family_size"] for r in own} == {"5"}
    bottom = next(r for r in own if "gating a bottom layer" in r["claim"])
    assert bottom["paper_claim"] == "yes" and bottom["verdict"] == "DID NOT HOLD"  # layer 1 ends higher than 6
    keys = [(r["table"], r["row"], r["claim"]) for r in rows if r["kind"] == "claim"]
    assert len(keys) == len(set(keys))
    n_distinct = len([r for r in rows if r["kind"] == "claim"])
    # a baseline run more in the study: not the same runs, so a comparison of its own
    fake_run(tmp_path / "scan" / "seed=3,variant=baseline", ["variant=baseline", "seed=3"],
             {"variant": "baseline", "seed": 3, "name": "ht_enwik8_l6"},
             {"status": "done", "step": 300, "val/bpc": 2.33, "test/bpc": 2.23}, [{"step": 100, "val/bpc": 3.2}])
    build_table("ht_placement_scan", load_runs(tmp_path / "scan"), out / "placement_scan", {"scale": "cpu"})
    write_summary(tmp_path / "results")
    with open(tmp_path / "results" / "summary.csv", newline="") as fh:
        assert sum(r["kind"] == "claim" for r in csv.DictReader(fh)) == n_distinct + 2


def test_the_summary_keeps_the_tables_families_and_says_when_they_disagree(tmp_path, capsys):
    """summary.csv takes each table's own family and Holm verdicts: a study built before the table whose runs it
    reuses holds their comparisons too (two homes), which the index says, naming both files, instead of quietly
    re-counting one of the families (built in order: test_a_study_reusing_a_tables_runs_adds_no_comparison)."""
    table = {"baseline": [2.20, 2.21, 2.22], "sdu_tanh": [2.10, 2.12, 2.11]}
    _enwik8_runs(tmp_path / "l6", table)
    _enwik8_runs(tmp_path / "scan", table | {"tanh_l1": [2.19, 2.20], "tanh_l6": [2.15, 2.16]})
    out = tmp_path / "results" / "highway_transformer"
    build_table("ht_placement_scan", load_runs(tmp_path / "scan"), out / "placement_scan", {"scale": "cpu"})
    build_table("ht_enwik8_l6", load_runs(tmp_path / "l6"), out / "enwik8_l6", {"scale": "cpu"})
    write_summary(tmp_path / "results")
    readme = (tmp_path / "results" / "README.md").read_text()
    assert "**The tables disagree on 2 comparison(s)" in readme
    assert "highway_transformer/enwik8_l6.md and highway_transformer/placement_scan.md both hold `sdu_tanh ends " \
           "lower than the baseline" in readme
    assert "warning: results/README.md: the tables disagree on 2" in capsys.readouterr().err
    with open(tmp_path / "results" / "summary.csv", newline="") as fh:
        scan = [r for r in csv.DictReader(fh) if r["table"] == "ht_placement_scan" and r["kind"] == "claim"]
    assert len(scan) == 7 and {r["family_size"] for r in scan} == {"7"}  # as the study's own Markdown says


def test_an_unresolved_random_search_names_the_trials_a_decision_needs(tmp_path):
    """A quantile claim that 4 trials a row leave NOT RESOLVED (no end of its interval exists) names the trials per
    row at which its 99 % interval would decide if the trials kept their measured distribution: the first n whose
    upper rank s of the 20 % quantile reads the measured best trial (4 s <= n), 552 here, and what running them
    would cost: 548 + 548 runs of 6 min on 2 cores = 54.8 h, and the table's 8 runs so far 0.4 h."""
    from highway_repro.report.claims import Claim, claim_line, test_claim
    from highway_repro.report.measures import Measure, Row

    rows = {}
    for v, xs in {"a": (0.01, 0.5, 0.02, 0.3), "b": (0.02, 0.4, 0.05, 0.6)}.items():
        runs = []
        for seed, x in enumerate(xs):
            fake_run(tmp_path / f"{v}{seed}", [f"seed={seed}"], {"seed": seed},
                     {"status": "done", "train/loss": x, "time/cpu_s": 360.0}, run_info={**MACHINE, "threads": 1})
            runs.append(load_runs(tmp_path / f"{v}{seed}")[0])
        rows[(v,)] = Row((v,), v, runs)
    log_loss = Measure("train/loss", "log10 loss", how="log10")
    res = test_claim(Claim("is lower", ("a",), log_loss, "lower", ("b",), pick="quantile", q=0.2), rows)
    assert res.verdict == stats.NOT_RESOLVED and res.ci == (-math.inf, math.inf)
    n = res.seeds_needed
    s_at = [stats.quantile_ranks(m, 0.2, (1 - stats.SECOND_LOOK) / 4)[1] for m in (n - 1, n)]
    assert n == 552 and 4 * s_at[0] > n - 1 and 4 * s_at[1] <= n
    assert res.decision == pytest.approx((1096, 54.8, 55.2, True))
    assert claim_line(res).endswith("about 552 trials per row at the measured distribution of the trials (its "
                                    "interval's ends read off it: about even odds of a decision), at the second look's "
                                    "99 % (1096 more runs, about 54.8 h on 2 cores; the table would then take 55.2 h, "
                                    "beyond the 8 h a table may take at the cpu scale); the estimate points to HELD")


def test_a_second_look_p_value_says_what_its_99_percent_interval_says():
    """A test read at the second look: its one-sided p-values, scaled by (1 - 0.95) / (1 - 0.99) = 5, fall below
    0.025 exactly when the 99 % interval lies on that side, so the raw verdict and Holm's family of one agree with
    the interval; at the first look's 95 % they are unchanged."""
    a, b = [2.00, 2.01, 2.02, 2.03], [2.05, 2.06, 2.07, 2.08]  # diff -0.05, se sqrt(2 x 0.000167 / 4), df 6
    se, df = math.sqrt(2 * 0.01 ** 2 * 5 / 3 / 4), 6.0
    cut = student_t.ppf(0.995, df) * se  # the 99 % interval's half-width: it excludes 0 when |diff| > cut
    for diff in (-cut * (1 + 1e-6), -cut * (1 - 1e-6), -cut * 0.7, -cut * 1.5):
        xs = [x + diff + 0.05 for x in a]  # the same spread, this difference
        p = stats.second_look_p({"p_side": stats.t_test(xs, b, "lower")["tests"]["p_side"], "p_other": None}, 0.99)
        lo, hi = welch_interval(xs, b, 0.99)
        assert (p["p_side"] < 0.025) == (hi < 0) == (diff < -cut) and p["p_other"] is None
        assert stats.holm_verdicts([{**p, "p_other": 1.0, "p_equiv": None}]) == [
            stats.HELD if hi < 0 else stats.NOT_RESOLVED]
    assert stats.second_look_p({"p_side": 0.3}, 0.99) == {"p_side": 1.0}
    assert stats.second_look_p({"p_side": 0.01}, stats.LEVEL) == {"p_side": 0.01}


def test_the_second_look_reads_its_runs_at_99_percent_and_the_other_comparisons_keep_the_first_look(tmp_path):
    """The placement scan's second look (configs/sweep/ht_placement_scan/cpu-second_look.yaml: layers 1 and 6,
    seeds 5-8): layer 1 vs layer 6 reads all 9 seeds a row at a 99 % interval and counts its seeds needed at 99 %,
    and once every one of those runs has ended it says that no look follows (before that, it reads its first look
    and says the second is under way); layer 1 vs the baseline keeps seeds
    0-4 at 95 %, and a table without a second look keeps every run."""
    from highway_repro.report.claims import first_look, second_look_grid
    from highway_repro.report.measures import Row

    assert second_look_grid("ht_placement_scan", "cpu") == {"variant": {"tanh_l1", "tanh_l6"},
                                                            "seed": {"5", "6", "7", "8"}}
    assert second_look_grid("ht_enwik8_l6", "cpu") == second_look_grid("ht_placement_scan", "smoke") == {}
    assert second_look_grid("hn_fig1", "cpu") == {"model.depth": {"50"}, "model.kind": {"plain", "highway"},
                                                  "trial": {str(t) for t in range(26, 100)}}
    values = {"baseline": [2.20, 2.21, 2.22, 2.21, 2.20], "sdu_tanh": [2.10, 2.12, 2.11, 2.11, 2.10],
              # seeds 0-4 end below the baseline; the second look's seeds 5-8 end far above it
              "tanh_l1": [2.15, 2.16, 2.15, 2.16, 2.15, 2.40, 2.41, 2.42, 2.43],
              "tanh_l6": [2.14, 2.15, 2.16, 2.15, 2.14, 2.13, 2.15, 2.14, 2.16]}
    for v, xs in values.items():
        for seed, x in enumerate(xs):
            fake_run(tmp_path / f"seed={seed},variant={v}", [f"variant={v}", f"seed={seed}"],
                     {"variant": v, "seed": seed, "name": "ht_enwik8_l6", "scale_name": "cpu"},
                     {"status": "done", "step": 300, "val/bpc": x + 0.1, "test/bpc": x},
                     [{"step": 100, "val/bpc": x + 1}], MACHINE)
    md = build_table("ht_placement_scan", load_runs(tmp_path), tmp_path / "scan", {"scale": "cpu"})
    l1_l6 = next(line for line in md.splitlines() if "`tanh_l1` ends lower than tanh_l6" in line)
    assert "(n 9) vs" in l1_l6 and "99 % CI" in l1_l6 and "(the second look)" in l1_l6
    l1_base = next(line for line in md.splitlines() if "`tanh_l1` ends lower than the baseline" in line)
    assert "(n 5) vs" in l1_base and "95 % CI" in l1_base and "**HELD**" in l1_base
    assert ("about 18 seeds per row for a decision with 80 % power at the measured spread and difference, at the "
            "second look's 99 %; the estimate points to DID NOT HOLD" in l1_l6)
    assert l1_l6.endswith("its second look has all its runs and was the last: NOT RESOLVED at this scale")
    (tmp_path / "seed=8,variant=tanh_l6" / "metrics.json").unlink()  # a second-look run still training
    md = build_table("ht_placement_scan", load_runs(tmp_path), tmp_path / "scan", {"scale": "cpu"})
    l1_l6 = next(line for line in md.splitlines() if "`tanh_l1` ends lower than tanh_l6" in line)
    assert "(n 5) vs" in l1_l6 and "95 % CI" in l1_l6
    assert l1_l6.endswith("(the runs of configs/sweep/ht_placement_scan/cpu-second_look.yaml) is under way")
    runs = [r for r in load_runs(tmp_path) if r.get("variant") == "tanh_l1"]
    rows = {("tanh_l1",): Row(("tanh_l1",), "layer 1", runs)}
    assert len(first_look(rows, "ht_placement_scan")[("tanh_l1",)].runs) == 5
    assert first_look(rows, "ht_enwik8_l6") == rows  # no second look: every run
    for r in load_runs(tmp_path):  # the same runs at the smoke scale, which has no second look: 95 %, every run
        (r.path / "config_resolved.yaml").write_text((r.path / "config_resolved.yaml").read_text().replace(
            "scale_name: cpu", "scale_name: smoke"))
    md = build_table("ht_placement_scan", load_runs(tmp_path), tmp_path / "scan", {"scale": "smoke"})
    l1_l6 = next(line for line in md.splitlines() if "`tanh_l1` ends lower than tanh_l6" in line)
    assert "(n 9) vs" in l1_l6 and "95 % CI" in l1_l6 and "second look" not in l1_l6.split("**")[0]


def test_a_second_look_grid_rejects_a_value_it_cannot_match(tmp_path, monkeypatch):
    """The grid is read by Hydra's own parser (choice(1,2) is seeds 1 and 2, as Hydra runs them); a swept value no run
    can have (a list, a bool) is an error naming the file, the key and what is allowed, not a grid that silently
    matches no run."""
    from highway_repro.report import claims

    monkeypatch.setattr(claims, "SWEEP_DIR", tmp_path)
    (tmp_path / "t").mkdir()
    path = tmp_path / "t" / "cpu-second_look.yaml"
    path.write_text("hydra:\n  sweeper:\n    params:\n      seed: choice(1,2)\n      trial: range(3,5)\n")
    assert claims.second_look_grid("t", "cpu") == {"seed": {"1", "2"}, "trial": {"3", "4"}}
    for value in ("[1, 2]", "true"):
        path.write_text(f"hydra:\n  sweeper:\n    params:\n      seed: {value}\n")
        with pytest.raises(ValueError, match=r"cpu-second_look.yaml: seed=.* is not a grid value "
                                             r"\(valid: a number or name, a comma list, range\(a,b\), choice\(...\)\)"):
            claims.second_look_grid("t", "cpu")


def test_fig1s_second_look_reads_the_papers_100_trials_and_the_first_look_keeps_26(tmp_path):
    """Fig. 1 at depth 50 (configs/sweep/hn_fig1/cpu-second_look.yaml: trials 26-99 of plain and highway): highway
    vs plain is the 20 % quantile of 100 trials a row (log10 loss base + 0.1 (trial mod 7): x_(20) is -3.4 and -0.9),
    at a 99 % interval from the ranks 10 and 33 of each row at the Bonferroni level: [x_(10) - y_(33), x_(33) - y_(10)]
    = [-3.5 + 0.8, -3.3 + 1.0]; the rows' first look is trials 0-25."""
    from highway_repro.report.claims import first_look
    from highway_repro.report.measures import Row

    for kind, base in (("plain", -1.0), ("highway", -3.5)):
        for t in range(100):
            loss = 10 ** (base + (t % 7) * 0.1)
            fake_run(tmp_path / f"model.depth=50,model.kind={kind},trial={t}",
                     ["model.depth=50", f"model.kind={kind}", f"trial={t}"],
                     {"model": {"depth": 50, "kind": kind}, "trial": t, "name": "hn_fig1", "scale_name": "cpu"},
                     {"status": "done", "step": 16000, "train/loss": loss}, [{"step": 16000, "train/loss": loss}],
                     MACHINE)
    md = build_table("hn_fig1", load_runs(tmp_path), tmp_path / "fig1", {"scale": "cpu"})
    line = next(line for line in md.splitlines() if "is more than 100x lower than plain" in line)
    assert "20 % quantile of 100 trials -3.400 vs depth=50, kind=plain -0.900 (100 trials)" in line
    assert "99 % interval [-2.7, -2.3] (the second look)" in line and "**HELD**" in line
    runs = [r for r in load_runs(tmp_path) if r.get("model.kind") == "highway"]
    first = first_look({("50", "highway"): Row(("50", "highway"), "highway", runs)}, "hn_fig1")
    assert sorted(int(r.get("trial")) for r in first[("50", "highway")].runs) == list(range(26))


def test_the_claims_count_names_the_comparisons_whose_second_look_was_the_last():
    """Of 3 NOT RESOLVED paper claims, one names the seeds a decision needs, one ended its second look (no number:
    no look follows) and one names neither; a HELD one and a comparison that is not a paper claim count in neither."""
    from highway_repro.report.claims import LAST_LOOK
    from highway_repro.report.claims_list import counts

    def row(verdict, paper="yes", seeds="", detail=""):
        return {"verdict": verdict, "holm_verdict": verdict, "paper_claim": paper, "seeds_needed": seeds,
                "detail": detail, "claim_type": "trend" if paper == "yes" else "own", "scale": "cpu"}

    text = counts([row("NOT RESOLVED", seeds="9"), row("NOT RESOLVED", detail=LAST_LOOK), row("NOT RESOLVED"),
                   row("HELD", detail=LAST_LOOK), row("NOT RESOLVED", paper="no", detail=LAST_LOOK)])
    assert ("NOT RESOLVED: 75 %, 1 of the 3 naming the seeds or trials a decision would need, 1 at the end of their "
            "second look (no look follows). 1 is the project's own: 0 HELD, 0 DID NOT HOLD, 0 NO DIFFERENCE, 1 NOT "
            "RESOLVED (Holm: 0 HELD, 0 DID NOT HOLD, 0 NO DIFFERENCE, 1 NOT RESOLVED).") in text


def test_every_claim_type_follows_the_rule_from_what_the_paper_states():
    """Each claim of papers.PAPER_CLAIMS says what the paper states of it (no default), and its type is the rule's
    (papers.CLAIM_TYPE_RULE), restated here: nothing -> own; a number -> level (artifact: a row the discrepancy
    report explains); an order -> trend, or negligible where the paper's two numbers differ by under 0.1 % of its
    compared value. By hand, from the papers' text, the ones that are not trends: the levels (CIFAR >= 92 %, Table 1's
    accuracies, plain nets of 10 and 20 layers below 1e-4), the comparisons the papers never made (the single-layer
    scan and single layers at the paper's size, Fig. 1 at depth 50) and the 12-layer sigmoid in layers 1-2 ending
    lower (1.07148 vs 1.07160 test: 0.011 %); 'bottom layers help more than top' is a trend in both tables."""
    from dataclasses import MISSING, fields

    from highway_repro.report.papers import HT, PAPER_CLAIMS, STATED, PaperClaim

    assert next(f.default for f in fields(PaperClaim) if f.name == "stated") is MISSING
    assert {c.stated for c in PAPER_CLAIMS} <= set(STATED)
    for c in PAPER_CLAIMS:
        if c.stated == "none":
            rule = "own"
        elif c.stated == "number":
            rule = "artifact" if set(c.row) & set(getattr(HT.get(c.table), "no_claim_rows", ())) else "level"
        else:
            paper = HT.get(c.table)
            split = {"val/": 0, "test": 1}.get(c.statistic[:4])
            a, b = (paper.rows.get(c.row[0]), paper.rows.get(c.against[0])) if paper and split is not None else (0, 0)
            small = a and b and a[split] and b[split] and abs(a[split] - b[split]) < 0.001 * b[split]
            rule = "negligible" if small else "trend"
        assert c.claim_type == rule, c
    types: dict[tuple, set] = {}
    for c in PAPER_CLAIMS:
        types.setdefault((c.table, c.row, c.against if isinstance(c.against, tuple) else "number"), set()).add(
            c.claim_type)
    assert {k: t for k, t in types.items() if t != {"trend"}} == {
        ("hn_fig1", ("10", "plain"), "number"): {"level"},
        ("hn_fig1", ("20", "plain"), "number"): {"level"},
        ("hn_table1", ("16", "highway"), "number"): {"level"},
        ("hn_table1", ("32", "highway"), "number"): {"level"},
        ("hn_cifar", ("highway",), "number"): {"level"},
        ("hn_fig1", ("50", "highway"), ("50", "plain")): {"own"},
        ("ht_placement_scan", ("tanh_l1",), ("tanh_l6",)): {"own"},
        ("ht_paper_anchor", ("tanh_l1",), ("tanh_l6",)): {"own"},
        ("ht_placement_scan", ("tanh_l1", "tanh_l2", "tanh_l3"), ("tanh_l4", "tanh_l5", "tanh_l6")): {"own"},
        ("ht_enwik8_l12", ("sigmoid_l1_2",), ("baseline",)): {"negligible", "trend"}}  # test bpc; converges faster


def test_a_level_claim_at_a_reduced_scale_gets_no_verdict(tmp_path):
    """Table 1's accuracies are the paper's levels: at the cpu scale their lines keep their numbers, say 'paper
    scale only' and count in no tally (the results index, the claims count, the README's glance), while
    summary.csv keeps the test's verdict beside claim_type `level`; at the paper scale they are verdicts."""
    from test_report import ACC, load_update_readme

    for scale in ("cpu", "paper"):
        for w, accs in ACC.items():
            for seed, a in enumerate(accs):
                fake_run(tmp_path / scale / "runs" / f"w{w}s{seed}", [f"model.width={w}", f"seed={seed}"],
                         {"model": {"kind": "highway", "width": int(w)}, "seed": seed, "scale_name": scale},
                         {"status": "done", "test/acc": a}, run_info=MACHINE)
        md = build_table("hn_table1", load_runs(tmp_path / scale / "runs"), tmp_path / scale / "results" / "table1",
                         {"scale": scale})
        write_summary(tmp_path / scale / "results")
        with open(tmp_path / scale / "results" / "summary.csv", newline="") as fh:
            claims = [r for r in csv.DictReader(fh) if r["kind"] == "claim"]
        assert [(r["claim_type"], r["verdict"]) for r in claims] == [("level", "DID NOT HOLD"), ("level", "HELD")]
        index = (tmp_path / scale / "results" / "README.md").read_text()
        (tmp_path / scale / "README.md").write_text("<!-- glance:begin -->\n<!-- glance:end -->\n")
        assert load_update_readme().main(tmp_path / scale) == 0
        glance = (tmp_path / scale / "README.md").read_text()
        lines = [ln for ln in md.splitlines() if "reaches the paper's accuracy" in ln]
        if scale == "cpu":
            assert len(lines) == 2 and all(ln.count("**") == 2 and "**paper scale only**" in ln for ln in lines)
            assert "ours 91.00 ± 1.00 (n 3), 95 % CI of the mean [" in lines[0]  # its numbers, for information
            assert "(table1.md) | cpu | 6 | 0 / 0 / 0 / 0; 2 paper scale only | 0 / 0 / 0 / 0 |" in index
            assert "| paper | level | 99.4 | 91 (acc, test, n 3) | 99.34  | cpu | paper scale only [" in index
            assert ("2 distinct comparisons: 0 HELD, 0 DID NOT HOLD, 0 NO DIFFERENCE, 0 NOT RESOLVED (Holm within "
                    "each table: 0 HELD, 0 DID NOT HOLD, 0 NO DIFFERENCE, 0 NOT RESOLVED), and 2 paper scale only.") \
                in glance
            assert "2 are the papers' level claims (absolute numbers), testable at the paper's scale only;" in glance
            assert " | 0 | 0 | 0 | 0 | cpu; 2 paper scale only |" in glance
        else:
            assert "**DID NOT HOLD**" in lines[0] and "**HELD**" in lines[1]
            assert "paper scale only" not in md + glance
            assert "(table1.md) | paper | 6 | 1 / 1 / 0 / 0 | 1 / 1 / 0 / 0 |" in index
            assert "| paper | level | 99.4 | 91 (acc, test, n 3) | 99.34  | paper | **DID NOT HOLD** [" in index
            assert ("2 are the papers' level claims (absolute numbers): 1 HELD, 1 DID NOT HOLD, 0 NO DIFFERENCE, 0 NOT "
                    "RESOLVED at the paper's scale;") in glance
            assert " | 1 | 1 | 0 | 0 | paper |" in glance


def test_a_paper_claim_s_margin_is_at_most_half_the_paper_s_effect():
    """enwik8 12 layers: the paper's effect is -0.0020 bpc on its 1.072 baseline (-0.19 %); on our 2.154 bpc
    baseline half of it is 0.0020 bpc, below the metric's 0.5 % (0.0108): the claim's delta is the smaller one."""
    from highway_repro.report import papers

    assert papers.margin("bpc", 2.154) == pytest.approx(0.005 * 2.154)
    effect = (-0.0020, -0.0020 / 1.072)
    assert papers.margin("bpc", 2.154, effect) == pytest.approx(0.5 * 0.0020 / 1.072 * 2.154)
    assert papers.margin("bpc", 2.154, (-0.13, -0.087)) == pytest.approx(0.005 * 2.154)  # a large effect: the rule
    assert papers.margin("log10 loss", -3.0, (-2.0, None)) == 0.5 and papers.margin("x", 1.0, effect) is None


def _seed_rows(folder, values: dict, data_seed: bool = True) -> dict:
    """Rows of fake runs, one a seed: {row: {seed: value}}; `data_seed`: the config has `data.seed` = `seed`."""
    from highway_repro.report.measures import Row

    rows = {}
    for v, by_seed in values.items():
        runs = []
        for seed, x in by_seed.items():
            config = {"seed": seed, **({"data": {"seed": seed}} if data_seed else {})}
            fake_run(folder / f"{v}{seed}", [f"seed={seed}"], config, {"status": "done", "test/hours": x})
            runs.append(load_runs(folder / f"{v}{seed}")[0])
        rows[(v,)] = Row((v,), v, runs)
    return rows


def test_a_paired_interval_on_students_sleep_data(tmp_path):
    """Student's (1908) sleep data (R's `sleep`): extra hours of sleep of 10 patients under two drugs. R's
    `t.test(extra ~ group, data = sleep, paired = TRUE)`: mean difference -1.58, t = -4.0621, df 9, p = 0.002833,
    95 % CI [-2.4598858, -0.7001142]; unpaired (Welch): [-3.3654832, 0.2054832]. Patients as seeds, the same
    `seed` and `data.seed` in both rows: the claim is tested paired and HELD, where Welch's interval contains 0."""
    from highway_repro.report.claims import Claim, test_claim
    from highway_repro.report.measures import Measure

    drug1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
    drug2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]
    rows = _seed_rows(tmp_path, {"drug1": dict(enumerate(drug1)), "drug2": dict(enumerate(drug2))})
    res = test_claim(Claim("sleeps less", ("drug1",), Measure("test/hours", "hours"), "lower", ("drug2",)), rows)
    assert res.diff == pytest.approx(-1.58) and res.ci == pytest.approx((-2.4598858, -0.7001142), abs=1e-6)
    assert res.ci_unpaired == pytest.approx((-3.3654832, 0.2054832), abs=1e-6)
    assert res.tests["p_side"] == pytest.approx(0.002833 / 2, abs=1e-6) and res.verdict == stats.HELD
    assert "difference -1.58, paired 95 % CI [-2.46, -0.7001] over 10 seeds (Welch's: [-3.365, 0.2055])" in res.line


def test_a_shared_per_seed_component_narrows_the_paired_interval(tmp_path):
    """Two rows 0.05 apart whose seeds move both by up to +-0.5: the paired interval is a small part of Welch's and
    decides (HELD) where Welch's cannot; the same runs without `data.seed` in their configs, with a seed one row
    lacks (different seed counts: Welch uses every run), or with fewer than 2 seeds, keep Welch's test."""
    from highway_repro.report.claims import Claim, claim_line, test_claim
    from highway_repro.report.measures import Measure

    shared = [0.0, 0.3, -0.2, 0.5, -0.4]
    noise = [0.004, -0.003, 0.001, -0.002, 0.0]
    values = {"a": {k: 2.0 + s + e for k, (s, e) in enumerate(zip(shared, noise))},
              "b": {k: 2.05 + s - e for k, (s, e) in enumerate(zip(shared, noise))}}
    claim = Claim("ends lower", ("a",), Measure("test/hours", "hours"), "lower", ("b",))
    res = test_claim(claim, _seed_rows(tmp_path / "paired", values))
    (lo, hi), (wlo, whi) = res.ci, res.ci_unpaired
    assert hi - lo < (whi - wlo) / 20 and res.verdict == stats.HELD and res.diff == pytest.approx(-0.05)
    assert stats.verdict(res.ci_unpaired, "lower") == stats.NOT_RESOLVED
    assert "over 5 seeds (Welch's: [" in claim_line(res)
    extra = test_claim(claim, _seed_rows(tmp_path / "extra", {**values, "a": values["a"] | {5: 1.0}}))
    assert extra.ci_unpaired is None and ", Welch 95 % CI [" in extra.line
    welch = test_claim(claim, _seed_rows(tmp_path / "unpaired", values, data_seed=False))
    assert welch.ci == res.ci_unpaired and welch.ci_unpaired is None and ", Welch 95 % CI [" in welch.line
    apart = test_claim(claim, _seed_rows(tmp_path / "apart", {"a": {0: 2.0, 1: 2.1, 2: 2.2}, "b": {2: 2.3, 3: 2.4}}))
    assert apart.ci_unpaired is None and ", Welch 95 % CI [" in apart.line
    # undecided: the seeds a paired test at 99 % needs for 80 % power, the first n with (t(0.995, n - 1) + t(0.8,
    # n - 1)) sd / sqrt(n) < |mean| (differences -0.05, 0, -0.1: sd 0.05; n 14: (3.012 + 0.870) x 0.05 / sqrt(14) =
    # 0.0519, n 15: 0.0499)
    rows = _seed_rows(tmp_path / "open", {"a": {0: 2.0, 1: 2.1, 2: 2.2}, "b": {0: 2.05, 1: 2.1, 2: 2.3}})
    n = next(n for n in range(3, 100) if (student_t.ppf(0.995, n - 1) + student_t.ppf(0.8, n - 1)) * 0.05
             / math.sqrt(n) < 0.05)
    assert test_claim(claim, rows).seeds_needed == n == 15


def test_a_comparison_names_its_processors_and_whether_they_are_balanced():
    from pathlib import Path

    from highway_repro.report.claims import cpu_models, processor
    from highway_repro.report.runs import Run

    def run(cpu, gpu=None):
        return Run(Path("x"), {}, {}, {}, "done", run_info={"cpu_model": cpu, "cuda_device": gpu})

    amd, intel = run("AMD EPYC"), run("Intel(R) Xeon(R) Processor")
    assert processor(intel) == "Intel Xeon" and processor(run(None, "NVIDIA H200")) == "NVIDIA H200"
    assert cpu_models([[amd, amd], [amd] * 3]) == "on AMD EPYC"
    assert cpu_models([[amd, intel], [intel, amd]]) == ("on 1 AMD EPYC + 1 Intel Xeon vs 1 AMD EPYC + 1 Intel Xeon, "
                                                        "balanced")
    assert cpu_models([[amd] * 5, [amd] * 3 + [intel] * 2]) == ("on 5 AMD EPYC vs 3 AMD EPYC + 2 Intel Xeon, not "
                                                                "balanced")


def test_the_papers_trend_claims_are_one_family_and_a_post_data_rule_shows_the_verdict_before_it():
    """Ten trend claims each HELD alone at p = 0.02 are NOT RESOLVED as one family (10 x 0.02 > 0.025); own and
    uncounted claims stay out of it. A paired line shows Welch's verdict, a NO DIFFERENCE line of a table whose
    margins came after the data shows NOT RESOLVED, and Fig. 1's quantile claim, moved to the quantile after its
    trials were read, has no valid earlier verdict; a rule fixed before the data shows nothing."""
    from highway_repro.report import papers
    from highway_repro.report.ledger import claim_id, earlier_verdict
    from highway_repro.report.summary import papers_family

    weak = {"p_side": 0.02, "p_other": 0.98, "p_equiv": None}
    trend = [{"kind": "claim", "claim_type": "trend", "scale": "cpu", "verdict": "HELD", "tests": weak}
             for _ in range(10)]
    others = [{"kind": "claim", "claim_type": t, "scale": "cpu", "verdict": "HELD", "tests": weak}
              for t in ("own", "level", "negligible")]
    assert papers_family(trend + others) == 10
    assert {r["papers_family_verdict"] for r in trend} == {stats.NOT_RESOLVED}
    assert not any("papers_family_verdict" in r for r in others)
    assert papers_family(trend[:1]) == 1 and trend[0]["papers_family_verdict"] == stats.HELD
    fig1 = next(i for i, c in enumerate(papers.PAPER_CLAIMS) if c.table == "hn_fig1" and c.row == ("100", "highway"))
    entries = [{"id": "rule: paired by seed", "after_data": True, "definition": "paired"},
               {"id": "margin t_after", "after_data": True, "definition": {}},
               {"id": "margin t_before", "after_data": False, "definition": {}},
               {"id": claim_id(papers.PAPER_CLAIMS[fig1]), "after_data": True, "definition": {}}]
    line = {"kind": "claim", "side": "lower", "threshold": 0.0, "pick": "all", "delta": None}
    paired = {**line, "table": "t_before", "ci_low": -0.3, "ci_high": -0.1, "ci_unpaired_low": -0.4,
              "ci_unpaired_high": 0.1}
    equal = {**line, "ci_low": -0.005, "ci_high": 0.005, "ci_unpaired_low": None, "delta": 0.01}
    assert earlier_verdict(paired, entries) == stats.NOT_RESOLVED
    assert earlier_verdict(paired, entries[1:]) is None  # pairing fixed before the data
    assert earlier_verdict({**equal, "table": "t_after"}, entries) == stats.NOT_RESOLVED
    assert earlier_verdict({**equal, "table": "t_before"}, entries) is None
    assert earlier_verdict({**line, "pick": "quantile", "paper_claim_id": fig1}, entries) == "no valid verdict"


def test_the_accuracy_claims_thresholds_are_the_papers_numbers_by_their_rule():
    """papers.yaml writes each accuracy claim's threshold as a number: Table 1's is the paper's mean less
    table1_claim_stds of its std (16 filters: 99.40 - 2 x 0.03 = 99.34), Table 3's cifar_claim_at_least (92.0)."""
    from highway_repro.report import papers

    table1 = {c.row: c for c in papers.PAPER_CLAIMS if c.table == "hn_table1"}
    assert table1[("16", "highway")].against == 99.34 and table1[("32", "highway")].against == 99.5
    assert {row: c.against for row, c in table1.items()} == {
        row: papers.table1_threshold(p) for row, p in papers.HN_TABLE1.rows.items()}
    assert [c.against for c in papers.PAPER_CLAIMS if c.table == "hn_cifar"] == [papers.CIFAR_CLAIM_AT_LEAST]
