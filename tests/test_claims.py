"""The claim statistics beyond the interval: Holm's adjustment on a published example, the bootstrap of a random
search's best trial against the exact law of a resampled minimum, the seeds a decision needs, and each comparison
counted once (a study reusing a table's runs links to the table)."""

from __future__ import annotations

import csv
import math

import pytest

from highway_repro.report import build_table, load_runs, stats, write_summary
from test_report import MACHINE, fake_run


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
    ci = stats.welch_interval(a, b)
    se, df = stats.welch_se_df(a, b)
    diff = sum(a) / 3 - sum(b) / 3
    test = {"p_side": stats.side_p(diff, se, df, "lower"), "p_other": stats.side_p(diff, se, df, "higher"),
            "p_equiv": None}
    assert stats.holm_verdicts([test]) == [stats.verdict(ci, "lower")] == [stats.HELD]
    assert stats.holm_verdicts([test | {"p_side": test["p_other"], "p_other": test["p_side"]}]) == [stats.NOT_HELD]
    weak = {"p_side": 0.02, "p_other": 0.98, "p_equiv": None}
    assert stats.holm_verdicts([weak]) == [stats.HELD]
    assert stats.holm_verdicts([weak] * 10) == [stats.NOT_RESOLVED] * 10
    strong = {"p_side": 1e-4, "p_other": 1.0, "p_equiv": None}
    assert stats.holm_verdicts([strong] + [weak] * 9 + [None]) == [stats.HELD] + [stats.NOT_RESOLVED] * 10
    equal = {"p_side": 0.4, "p_other": 0.6, "p_equiv": 0.001}
    assert stats.holm_verdicts([equal, weak]) == [stats.NO_DIFFERENCE, stats.NOT_RESOLVED]


@pytest.mark.parametrize("n", [5, 12])
def test_bootstrap_of_the_best_trial_follows_the_exact_order_statistic_law(n):
    """A resample of n from n distinct values x_(1) < ... < x_(n) has its minimum >= x_(k) exactly when all n draws
    fall among the n - k + 1 values >= x_(k): P = ((n - k + 1) / n)^n. The bootstrap's share of resampled minima
    >= x_(k) must match it within 5 binomial standard errors of RESAMPLES draws (a resample of another size, or a
    dropped value, moves it by far more)."""
    from highway_repro.report.spec import RESAMPLES

    xs = [math.sqrt(i) + 0.1 * i for i in range(1, n + 1)]  # distinct, in any order
    mins = stats.bootstrap(list(reversed(xs)), min, RESAMPLES, seed=3)
    for k in range(1, n + 1):
        exact = ((n - k + 1) / n) ** n
        share = sum(m >= xs[k - 1] for m in mins) / len(mins)
        tol = 5 * math.sqrt(max(exact * (1 - exact), 1 / RESAMPLES) / RESAMPLES)
        assert abs(share - exact) <= tol, (k, share, exact)
    dropped = stats.bootstrap(xs[1:], min, RESAMPLES, seed=3)  # the best trial dropped: another law
    assert sum(m >= xs[1] for m in dropped) / len(dropped) == 1.0 != pytest.approx(((n - 1) / n) ** n, abs=0.1)


@pytest.mark.parametrize("level", [stats.LEVEL, stats.SECOND_LOOK])
@pytest.mark.parametrize("side", ["lower", "higher"])
def test_a_bootstrap_p_value_agrees_with_its_percentile_interval_at_the_edge(level, side):
    """Of 10,000 resamples, k lie at the threshold's far side (+1 for a claim of "lower", -1 for "higher") and the
    rest on the claim's side. The nearest-rank interval at `level` excludes the threshold exactly when k <= the
    tail's count (250 at 95 %, 50 at 99 %); the p-value read at the same level (through a family of one, as the
    report reads it) must say the same at every k around that edge, in both directions."""
    n, far = 10000, 1.0 if side == "lower" else -1.0
    tail = round((1 - level) / 2 * n)
    for k in range(tail - 2, tail + 3):
        for sign in (1.0, -1.0):  # the claim's side, then the other side
            boot = [-far * sign] * (n - k) + [far * sign] * k
            raw = stats.verdict(stats.percentile_interval(boot, level), side)
            p = stats.second_look_p(stats.bootstrap_p(boot, 0.0, side), level)
            assert stats.holm_verdicts([p]) == [raw], (k, sign, raw, p)
            held = stats.HELD if sign > 0 else stats.NOT_HELD
            assert raw == (held if k <= tail else stats.NOT_RESOLVED), (k, sign, raw)


def test_seeds_needed_inverts_the_welch_half_width():
    """The smallest n per row whose Welch half-width t(df(n)) sqrt((sa^2 + sb^2) / n) falls below |difference| (or
    below delta - |difference|): checked against the half-width of the interval that n values would give."""
    sa, sb, diff = 0.02, 0.03, -0.03
    n = stats.seeds_needed(sa, sb, diff, None)

    def half(m):
        df = (m - 1) * (sa ** 2 + sb ** 2) ** 2 / (sa ** 4 + sb ** 4)
        return stats.t_quantile(0.975, df) * math.sqrt((sa ** 2 + sb ** 2) / m)

    assert half(n) < abs(diff) <= half(n - 1)
    assert stats.seeds_needed(sa, sb, -0.01, 0.05) < stats.seeds_needed(sa, sb, -0.01, None)  # equivalence is nearer
    assert stats.seeds_needed(0.0, 0.0, 0.1, None) is None


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
    n = res["seeds_needed"]
    assert res["verdict"] == stats.NOT_RESOLVED and n > 3
    hours = 2 * (n - 3) * 5400.0 / 2 / 3600  # runs of 1.5 h with a core to themselves, 2 at a time
    total = 6 * 5400.0 / 2 / 3600 + hours  # the table's 6 runs so far, and the added ones
    sd_b = stats.mean_std([2.01, 2.05, 2.00])[1]
    at_95 = stats.seeds_needed(res["std"], sd_b, res["diff"], res["delta"], 0.95, start=3)
    assert n == stats.seeds_needed(res["std"], sd_b, res["diff"], res["delta"], 0.99, start=3) > at_95  # at 99 %
    assert claim_line(res).endswith(f"a decision needs about {n} seeds per row at the measured spread and the "
                                    f"second look's 99 % ({2 * (n - 3)} more runs, about {hours:.1f} h on 2 cores; "
                                    f"the table would then take {total:.1f} h, beyond the 8 h a table may take at "
                                    "the cpu scale)")


def _enwik8_runs(folder, variants, name="ht_enwik8_l6"):
    for v, values in variants.items():
        for seed, x in enumerate(values):
            fake_run(folder / f"seed={seed},variant={v}", [f"variant={v}", f"seed={seed}"],
                     {"variant": v, "seed": seed, "name": name},
                     {"status": "done", "step": 300, "val/bpc": x + 0.1, "test/bpc": x},
                     [{"step": 100, "val/bpc": x + 1}, {"step": 200, "val/bpc": x + 0.5}], MACHINE)


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


def test_an_unresolved_random_search_names_the_papers_trials(tmp_path):
    """A best-trial claim that 4 trials a row leave NOT RESOLVED names the paper's trials per row (a bootstrap of a
    minimum cannot go below the measured one, so the trials give no projection) and what running them would cost:
    96 + 96 runs of 6 min on 2 cores = 9.6 h, and the table's 8 runs so far 0.4 h."""
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
    res = test_claim(Claim("is lower (best trial)", ("a",), log_loss, "lower", ("b",), pick="best", trials=100), rows)
    assert res["verdict"] == stats.NOT_RESOLVED
    assert res["seeds_needed"] == 100 and res["decision"] == (192, 9.6, 10.0, True)
    assert claim_line(res).endswith("needs its 100 trials per row, read at the second look's 99 % (192 more runs, "
                                    "about 9.6 h on 2 cores; the table would then take 10.0 h, beyond the 8 h a "
                                    "table may take at the cpu scale)")
    res = test_claim(Claim("is lower (best trial)", ("a",), log_loss, "lower", ("b",), pick="best"), rows)
    assert res["seeds_needed"] is None  # no paper design stated: nothing to name


def test_a_second_look_p_value_says_what_its_99_percent_interval_says():
    """A test read at the second look: its one-sided p-values, scaled by (1 - 0.95) / (1 - 0.99) = 5, fall below
    0.025 exactly when the 99 % interval lies on that side, so the raw verdict and Holm's family of one agree with
    the interval; at the first look's 95 % they are unchanged."""
    a, b = [2.00, 2.01, 2.02, 2.03], [2.05, 2.06, 2.07, 2.08]  # diff -0.05, se 0.00913, df 6
    se, df = stats.welch_se_df(a, b)
    cut = stats.t_quantile(0.995, df) * se  # the 99 % interval's half-width: it excludes 0 when |diff| > cut
    for diff in (-cut * (1 + 1e-6), -cut * (1 - 1e-6), -cut * 0.7, -cut * 1.5):
        xs = [x + diff + 0.05 for x in a]  # the same spread, this difference
        p = stats.second_look_p({"p_side": stats.side_p(diff, se, df, "lower"), "p_other": None}, 0.99)
        lo, hi = stats.welch_interval(xs, b, 0.99)
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
    assert "a decision needs about 13 seeds per row at the measured spread and the second look's 99 %" in l1_l6
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
    """A swept value the report cannot expand to the runs' own values (a Hydra function other than range, a list, a
    bool) is an error naming the file, the key and what is allowed, not a grid that silently matches no run."""
    from highway_repro.report import claims

    monkeypatch.setattr(claims, "SWEEP_DIR", tmp_path)
    (tmp_path / "t").mkdir()
    for value in ("choice(1,2)", "[1, 2]", "true"):
        (tmp_path / "t" / "cpu-second_look.yaml").write_text(f"hydra:\n  sweeper:\n    params:\n      seed: {value}\n")
        with pytest.raises(ValueError, match=r"cpu-second_look.yaml: seed=.* is not a second look's grid value "
                                             r"\(valid: a number or name, a comma list, range\(a,b\)\)"):
            claims.second_look_grid("t", "cpu")


def test_fig1s_second_look_reads_the_papers_100_trials_and_the_first_look_keeps_26(tmp_path):
    """Fig. 1 at depth 50 (configs/sweep/hn_fig1/cpu-second_look.yaml: trials 26-99 of plain and highway): highway
    vs plain is the best of 100 trials a row at a 99 % bootstrap interval (trial 60, an added one, is the best);
    the rows' first look is trials 0-25."""
    from highway_repro.report.claims import first_look
    from highway_repro.report.measures import Row

    for kind, base in (("plain", -1.0), ("highway", -3.5)):
        for t in range(100):
            loss = 10 ** (base + (t % 7) * 0.1 - (1.0 if t == 60 and kind == "highway" else 0.0))  # an added trial best
            fake_run(tmp_path / f"model.depth=50,model.kind={kind},trial={t}",
                     ["model.depth=50", f"model.kind={kind}", f"trial={t}"],
                     {"model": {"depth": 50, "kind": kind}, "trial": t, "name": "hn_fig1", "scale_name": "cpu"},
                     {"status": "done", "step": 16000, "train/loss": loss}, [{"step": 16000, "train/loss": loss}],
                     MACHINE)
    md = build_table("hn_fig1", load_runs(tmp_path), tmp_path / "fig1", {"scale": "cpu"})
    best = next(line for line in md.splitlines() if "100x lower than plain (best trial)" in line)
    assert "best trial of 100 trials -4.100 vs depth=50, kind=plain -1.000 (100 trials)" in best
    assert "99 % bootstrap interval [-3.1, -2.5] (the second look)" in best and "**HELD**" in best
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
                "detail": detail}

    text = counts([row("NOT RESOLVED", seeds="9"), row("NOT RESOLVED", detail=LAST_LOOK), row("NOT RESOLVED"),
                   row("HELD", detail=LAST_LOOK), row("NOT RESOLVED", paper="no", detail=LAST_LOOK)])
    assert text.endswith("NOT RESOLVED: 75 %, 1 of the 3 naming the seeds or trials a decision would need, 1 at the "
                         "end of their second look (no look follows).")
