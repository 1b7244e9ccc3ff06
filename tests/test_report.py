"""The report package: t quantiles, t-tests and Welch intervals against known values, the four verdicts, the header read
from run folders (not from the machine that builds the report), claims files, results/summary.csv and the claims list
of results/README.md, the README's "at a glance" table, and paper tables end to end from fake run folders."""

from __future__ import annotations

import ast
import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, compose, load_script, needs_mirror
from highway_repro.report import build_table, load_runs, stats, write_summary
from highway_repro.report.header import header

# Student t 0.975 quantiles from published tables (e.g. NIST/SEMATECH e-Handbook, Table 1.3.6.7.2)
T975 = {1: 12.7062047, 2: 4.30265273, 3: 3.18244631, 4: 2.77644511, 5: 2.57058184, 10: 2.22813885,
        30: 2.04227246, 100: 1.98397152}


# ------------------------------------------------------------------ statistics
def welch_interval(a, b, level=0.95):
    """Welch's interval of mean(a) - mean(b) as `stats.t_test` gives it; None when a side has fewer than two values."""
    t = stats.t_test(a, b, level=level)
    return t and t["ci"]


SLEEP = ([0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0], [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4])


def test_t_test_on_students_sleep_data():
    """R's `t.test` on Student's (1908) sleep data (R's `sleep`, the output on its help page): Welch t = -1.8608,
    df = 17.776, p = 0.07939 two-sided, 95 % CI [-3.3654832, 0.2054832]; paired t = -4.0621, df = 9, p = 0.002833,
    CI [-2.4598858, -0.7001142]. A one-sided p on the estimate's side is half the two-sided one. Equivalence within
    -1.58 +-2 of nothing: TOST against -2 and +2 on the paired difference, se = 1.58 / 4.0621, is the larger of the
    two one-sided p-values, P(T_9 >= 0.42 / se) = 0.15416 (t = 1.0798)."""
    drug1, drug2 = SLEEP
    welch = stats.t_test(drug1, drug2, "lower")
    assert welch["estimate"] == pytest.approx(-1.58) and welch["ci"] == pytest.approx((-3.3654832, 0.2054832), abs=1e-6)
    assert welch["tests"]["p_side"] == pytest.approx(0.07939 / 2, abs=5e-6)
    assert welch["tests"]["p_other"] == pytest.approx(1 - 0.07939 / 2, abs=5e-6) and welch["tests"]["p_equiv"] is None
    diffs = [a - b for a, b in zip(drug1, drug2)]
    paired = stats.t_test(diffs, None, "lower", delta=2.0)
    assert paired["ci"] == pytest.approx((-2.4598858, -0.7001142), abs=1e-6)
    assert paired["tests"]["p_side"] == pytest.approx(0.002833 / 2, abs=1e-6)
    assert paired["tests"]["p_equiv"] == pytest.approx(0.15416, abs=2e-5)
    assert stats.t_test(diffs, None, "higher", threshold=-1.58 + 1e-9)["tests"]["p_side"] == pytest.approx(0.5)
    assert stats.t_test([1.0], drug2) is None and stats.t_test([2.0, 2.0], [1.0, 1.0], "higher")["tests"] == {
        "p_side": 0.0, "p_other": 1.0, "p_equiv": None}  # no spread: the difference is exact


def test_welch_interval_against_hand_computed_values():
    # equal n and equal variances: Welch's df = 2(n - 1) = 4; se = sqrt(1/3 + 1/3)
    lo, hi = welch_interval([1, 2, 3], [4, 5, 6])
    half = T975[4] * math.sqrt(2 / 3)
    assert (lo, hi) == (pytest.approx(-3 - half, abs=1e-6), pytest.approx(-3 + half, abs=1e-6))
    # a constant second sample: df = n_a - 1 = 2; t(0.975, 2) = 0.95 / sqrt(2 * 0.975 * 0.025) exactly
    lo, hi = welch_interval([1, 2, 3], [5, 5, 5])
    half = 0.95 / math.sqrt(2 * 0.975 * 0.025) * math.sqrt(1 / 3)
    assert (lo, hi) == (pytest.approx(-3 - half, abs=1e-9), pytest.approx(-3 + half, abs=1e-9))
    # unequal variances: df = (1/3 + 5/3)^2 / ((1/3)^2 / 2 + (5/3)^2 / 3) = 4.0755 by hand, se = sqrt(2),
    # t(0.975, 4.0755) = 2.756285 (integrating the t density)
    lo, hi = welch_interval([1, 2, 3], [2, 4, 6, 8])
    assert (lo, hi) == (pytest.approx(-6.897975, abs=1e-5), pytest.approx(0.897975, abs=1e-5))
    assert welch_interval([1.0], [2, 3, 4]) is None and welch_interval([1, 2], [3]) is None
    lo, hi = stats.mean_interval([1, 2, 3])
    half = T975[2] / math.sqrt(3)
    assert (lo, hi) == (pytest.approx(2 - half, abs=1e-6), pytest.approx(2 + half, abs=1e-6))
    # one value has a mean but no measured spread (a table's csv must not read "std 0")
    assert stats.mean_std([2.5])[0] == 2.5 and math.isnan(stats.mean_std([2.5])[1])


def test_three_verdicts():
    assert stats.verdict((-0.3, -0.1), "lower") == stats.HELD
    assert stats.verdict((0.1, 0.3), "lower") == stats.NOT_HELD
    assert stats.verdict((-0.1, 0.3), "lower") == stats.NOT_RESOLVED
    assert stats.verdict((0.1, 0.3), "higher") == stats.HELD
    assert stats.verdict((-0.3, -0.1), "higher") == stats.NOT_HELD
    assert stats.verdict((-1.5, -1.2), "lower", threshold=-1.0) == stats.HELD  # "at least 10x lower" in log10
    assert stats.verdict((-0.9, -0.2), "lower", threshold=-1.0) == stats.NOT_HELD
    assert stats.verdict((0.0, 0.3), "higher") == stats.NOT_RESOLVED  # touching the threshold is not wholly above
    assert stats.verdict(None, "lower") == stats.NOT_RESOLVED  # n < 2 on a side
    with pytest.raises(ValueError, match="side='down' is not known"):
        stats.verdict((0, 1), "down")


def test_four_verdicts_with_an_equivalence_margin():
    """NO DIFFERENCE: the interval contains 0 and lies within +-delta; an interval on one side keeps HELD or DID NOT
    HOLD even inside +-delta; an interval that contains 0 and reaches past delta stays NOT RESOLVED."""
    d = 0.01
    assert stats.verdict((-0.006, 0.006), "lower", delta=d) == stats.NO_DIFFERENCE
    assert stats.verdict((-0.01, 0.01), "lower", delta=d) == stats.NO_DIFFERENCE  # the margin's ends belong to it
    assert stats.verdict((-0.37, 0.35), "lower", delta=d) == stats.NOT_RESOLVED  # too few runs to tell
    assert stats.verdict((-0.006, 0.02), "lower", delta=d) == stats.NOT_RESOLVED
    assert stats.verdict((-0.008, -0.002), "lower", delta=d) == stats.HELD  # smaller than delta, but one-sided
    assert stats.verdict((0.002, 0.008), "lower", delta=d) == stats.NOT_HELD
    assert stats.verdict((-0.006, 0.006), "lower") == stats.NOT_RESOLVED  # no margin: three verdicts
    assert stats.verdict((-1.2, -0.8), "lower", threshold=-1.0, delta=0.5) == stats.NO_DIFFERENCE
    assert stats.verdict(None, "lower", delta=d) == stats.NOT_RESOLVED


# ------------------------------------------------------------------ fake run folders
MACHINE = {"machine": "fakearch", "cpu_model": "Fake CPU 9000", "cpu_count": 64, "torch": "9.9.9", "python": "3.99.0",
           "cuda_device": None, "threads": 1, "git_commit": "abcdef1234567890abcdef1234567890abcdef12"}


def fake_run(folder: Path, overrides: list[str], config: dict, final: dict | None, history=(), run_info=None):
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (folder / "config_resolved.yaml").write_text(yaml.safe_dump(config))
    if final is not None:
        (folder / "metrics.json").write_text(json.dumps(final))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(h) + "\n" for h in history))
    if run_info is not None:
        (folder / "run_info.json").write_text(json.dumps(run_info))


# test bpc per seed; val = test + 0.05; val history at steps 100/200/300 = val + 0.3 / + 0.15 / + 0
HT_TEST = {"baseline": [2.00, 2.02, 2.04],  # floor 1.80: not met
           "sdu_sigmoid": [1.80, 1.82, 1.84],  # clearly lower: HELD; reaches the baseline's final val at step 200
           "sdu_tanh": [1.90, 2.10, 2.05],  # inside the spread: NOT RESOLVED
           "highway": [2.30, 2.32, 2.34]}  # clearly higher: DID NOT HOLD; never reaches it
LABELS = {"baseline": "baseline (no gate)", "sdu_sigmoid": "SDU sigmoid, all layers",
          "sdu_tanh": "SDU tanh, all layers"}


def make_ht_runs(root: Path) -> None:
    for v, tests in HT_TEST.items():
        for seed, test in enumerate(tests):
            val = test + 0.05
            ln2 = math.log(2)
            final = {"status": "done", "step": 300, "model/params": 1000 if v == "baseline" else 1200,
                     "time/wall_s": 600.0, "time/cpu_s": 590.0, "val/bpc": val, "test/bpc": test,
                     "val/loss": val * ln2, "test/loss": test * ln2}
            hist = [{"step": 0, "model/params": final["model/params"]}]
            for step, extra in ((100, 0.3), (200, 0.15), (300, 0.0)):
                hist += [{"step": step, "train/loss": 2.0, "perf/tokens_per_s": 1000.0},
                         {"step": step, "val/bpc": val + extra, "val/loss": (val + extra) * ln2}]
            cfg = {"variant": v, "seed": seed, "data": {"name": "ptb_char_raw"}, "model": {"n_layers": 3}}
            if v in LABELS:
                cfg["variant_label"] = LABELS[v]
            fake_run(root / f"seed={seed},variant={v}", [f"variant={v}", f"seed={seed}"], cfg, final, hist, MACHINE)
    fake_run(root / "seed=3,variant=sdu_tanh", ["variant=sdu_tanh", "seed=3"], {"variant": "sdu_tanh"},
             {"status": "failed", "error": "ValueError: gate exploded"}, run_info=MACHINE)
    fake_run(root / "seed=4,variant=sdu_tanh", ["variant=sdu_tanh", "seed=4"], {"variant": "sdu_tanh"}, None)


def test_learning_curve_leaves_out_a_final_pass_over_more_data(tmp_path):
    """With capped intermediate evaluations (the first eval_max_batches batches of val) and a complete final
    pass, the final pass (here higher, as at the enwik8 cpu scale) is off the curve: AUC, the curve and the
    steps to reach the baseline use the intermediate evaluations only; uncapped runs keep their last point."""
    from highway_repro.report.measures import Measure, Row, mean_curve, reach_steps

    capped = {"max_steps": 300, "eval_every": 100, "eval_max_batches": 20, "final_max_batches": None}
    curves = {"baseline": (3.0, 2.5, 2.9), "sdu_tanh": (2.6, 2.4, 2.8)}  # steps 100, 200 (subset); 300 (full)
    rows = {}
    for v, ys in curves.items():
        runs = []
        for seed in (0, 1):
            hist = [{"step": s, "val/bpc": y} for s, y in zip((100, 200, 300), ys)]
            folder = tmp_path / f"seed={seed},variant={v}"
            fake_run(folder, [f"variant={v}", f"seed={seed}"], {"variant": v, "trainer": capped},
                     {"status": "done", "step": 300, "val/bpc": ys[-1]}, hist)
            runs.append(load_runs(folder)[0])
        rows[v] = Row((v,), v, runs)
    base, tanh = rows["baseline"], rows["sdu_tanh"]
    assert base.runs[0].curve("val/bpc") == [(100, 3.0), (200, 2.5)]
    assert mean_curve(base.done, "val/bpc") == ([100, 200], [3.0, 2.5])
    assert base.mean(Measure("val/bpc", "", how="auc")) == pytest.approx(2.75)  # not (3.0 + 2.5 + 2.9) / 3
    # the goal is the baseline's last point on the same data (2.5), not its final pass (2.9, reached at step 100)
    assert reach_steps(tanh, base, Measure("val/bpc", "val bpc")) == ("200", 2.5)
    # uncapped (every evaluation complete): the final pass is on the curve
    uncapped = tmp_path / "uncapped"
    fake_run(uncapped, [], {"trainer": {**capped, "eval_max_batches": None}}, {"status": "done", "step": 300},
             [{"step": s, "val/bpc": y} for s, y in zip((100, 200, 300), curves["baseline"])])
    assert load_runs(uncapped)[0].curve("val/bpc") == [(100, 3.0), (200, 2.5), (300, 2.9)]
    # a value at a step (the paper-size anchor's val bpc at step 400): the logged value there, else nan
    at = Measure("val/bpc", "", how="at", step=200)
    assert at.name == "val/bpc@200" and at.metric == "bpc"
    assert base.values(at) == [2.5, 2.5] and tanh.mean(at) == pytest.approx(2.4)
    assert Row(("b",), "b", [load_runs(uncapped)[0]]).values(Measure("val/bpc", "", how="at", step=250)) == []


def test_paper_anchor_table_sets_the_step_400_value_beside_the_official_log(tmp_path):
    """The anchor table: each row's val bpc at step 400, the official log's number, ours - official with the
    t-interval of the mean, within the tolerance or not; the paper's claim (SDU tanh below the baseline) on it."""
    from highway_repro.report import build_table, papers

    official = {"baseline": 2.5668, "sdu_tanh": 2.4276}
    ours = {"baseline": (2.60, 2.62, 2.64), "sdu_tanh": (2.42, 2.43, 2.44)}
    for v, ys in ours.items():
        for seed, y in enumerate(ys):
            hist = [{"step": s, "val/bpc": y + (400 - s) / 100} for s in (100, 200, 300, 400)]
            fake_run(tmp_path / "runs" / f"seed={seed},variant={v}", [f"variant={v}", f"seed={seed}"],
                     {"variant": v, "seed": seed}, {"status": "done", "step": 400, "val/bpc": y, "test/bpc": y}, hist)
    assert papers.ENWIK8_L6_LOGS["baseline"][0] == official["baseline"] and papers.ANCHOR_STEP == 400
    text = build_table("ht_paper_anchor", load_runs(tmp_path / "runs"), out=tmp_path / "anchor", meta={})
    base = next(line for line in text.splitlines() if line.startswith("| `baseline`"))
    cells = [c.strip() for c in base.split("|")]
    half = 4.302653 * 0.02 / 3 ** 0.5  # t(0.975, 2) x sd / sqrt(n)
    assert "2.6200 ± 0.0200" in cells and "2.5668" in cells and "yes" in cells
    assert f"+{2.62 - 2.5668:.4f} [+{2.62 - 2.5668 - half:.4f}, +{2.62 - 2.5668 + half:.4f}]" in cells
    assert "3.6200 ± 0.0200" in cells  # step 100
    claim = next(line for line in text.splitlines() if "ends lower than the baseline at step 400" in line)
    assert "difference -0.19," in claim and claim.endswith("**HELD** (Holm over the table's 1 tests: **HELD**)")


ACC = {"16": [0.90, 0.91, 0.92],  # far below the paper's 99.40 - 2 x 0.03: DID NOT HOLD; floor 98.7 not met
       "32": [0.9960, 0.9962, 0.9964]}  # 99.62 ± 0.02: interval above 99.50: HELD; floor 99.0 met


def make_hn_runs(root: Path) -> None:
    for w, accs in ACC.items():
        for seed, a in enumerate(accs):
            fake_run(root / f"model.width={w},seed={seed}", [f"model.width={w}", f"seed={seed}"],
                     {"model": {"kind": "highway", "width": int(w)}, "seed": seed},
                     {"status": "done", "test/acc": a, "test/loss": 1 - a, "time/wall_s": 100.0,
                      "model/params": 39000 if w == "16" else 151690}, run_info=MACHINE)


def _claims(path: Path) -> dict:
    return {(r["row"], r["kind"], r["claim"].split(";")[0]): r for r in json.loads(path.read_text())["rows"]}


# ------------------------------------------------------------------ end to end
def test_quantile_claims_count_a_diverged_trial_as_a_failure(tmp_path):
    """A quantile of a random search's trials: a trial that diverged counts at the worst final value a trial of the
    compared rows reached (never dropped, so a kind that loses more trials is not judged by fewer, better ones)."""
    from highway_repro.report.claims import Claim, test_claim
    from highway_repro.report.measures import Measure, Row

    m = Measure("train/loss", "loss")
    rows = {}
    for kind, losses in (("highway", [0.1, 0.2, 0.3, 0.4, 0.5]), ("plain", [0.3, 0.35, None, None, None])):
        runs = []
        for i, loss in enumerate(losses):
            final = {"status": "done", "train/loss": loss} if loss is not None else {"status": "diverged"}
            fake_run(tmp_path / f"{kind}{i}", [], {}, final)
            runs.append(load_runs(tmp_path / f"{kind}{i}")[0])
        rows[(kind,)] = Row((kind,), kind, runs)
    res = test_claim(Claim("is lower", ("highway",), m, "lower", ("plain",), pick="quantile", q=0.6), rows)
    assert (res.n, res.other_n) == (5, 5) and res.mean == pytest.approx(0.3)
    assert res.other_mean == pytest.approx(0.5)  # x_(3) of 0.3, 0.35, 0.5 x 3; not 0.35 over the 2 finished
    lo, hi = res.ci
    assert res.diff == pytest.approx(-0.2) and lo <= res.diff <= hi
    assert res.tests["p_side"] < res.tests["p_other"]


def test_a_row_whose_paper_number_tests_nothing_is_claimed_on_test(tmp_path):
    """enwik8 L6 'layers 3-6': the paper's val-only number tests nothing (its code gated no layer), so the claim is
    ours and, like our other claims, on the test split, with no paper value."""
    for v, test in (("baseline", [2.20, 2.21]), ("tanh_l3_6", [2.10, 2.12])):
        for seed, x in enumerate(test):
            final = {"status": "done", "step": 300, "val/bpc": x - 0.5, "test/bpc": x}  # val would say the same
            fake_run(tmp_path / "runs" / f"seed={seed},variant={v}", [f"variant={v}", f"seed={seed}"],
                     {"variant": v, "seed": seed}, final, [{"step": 100, "val/bpc": x}], MACHINE)
    build_table("ht_enwik8_l6", load_runs(tmp_path / "runs"), tmp_path / "res" / "l6", {"scale": "cpu"})
    c = _claims(tmp_path / "res" / "l6.claims.json")[("tanh_l3_6", "claim", "ends lower than the baseline")]
    assert (c["split"], c["paper"], c["paper_claim"]) == ("test", None, False)


def test_ht_table_end_to_end(tmp_path):
    make_ht_runs(tmp_path / "runs")
    runs = load_runs(tmp_path / "runs")
    assert len(runs) == 14 and {r.status for r in runs} == {"done", "failed", "missing"}
    meta = {"commands": ["make reproduce-ht-char-ptb SCALE=cpu"], "scale": "cpu", "wall_s": 7200.0}
    md = build_table("ht_char_ptb", runs, tmp_path / "res" / "char_ptb_l3", meta)
    assert md == (tmp_path / "res" / "char_ptb_l3.md").read_text()
    assert (tmp_path / "res" / "char_ptb_l3.png").stat().st_size > 1000
    # rows: labels from the runs' variant_label, else the variant's name
    assert "| SDU sigmoid, all layers (`sdu_sigmoid`) | 1,200 | 3 | 1.8700 ± 0.0200 | 1.8200 ± 0.0200 | -9.9% |" in md
    assert "| `highway` | 1,200 | 3 |" in md
    assert "| SDU tanh, all layers (`sdu_tanh`) | 1,200 | 3 (2 failed) |" in md
    assert "ValueError: gate exploded" in md and "no metrics.json" in md
    # the Welch interval of sdu_sigmoid - baseline: df 4, half width t(0.975, 4) * sqrt(2 * 0.02^2 / 3)
    half = T975[4] * math.sqrt(2 * 0.02 ** 2 / 3)
    claims = _claims(tmp_path / "res" / "char_ptb_l3.claims.json")
    c = claims[("SDU sigmoid, all layers (sdu_sigmoid)", "claim", "ends lower than the baseline")]
    assert (c["ci_low"], c["ci_high"]) == (pytest.approx(-0.2 - half, abs=1e-5), pytest.approx(-0.2 + half, abs=1e-5))
    assert c["verdict"] == "HELD" and c["paper"] == 1.371 and c["paper_claim"] is True and c["n_seeds"] == 3
    # delta: 0.5 % of the baseline's mean test bpc (2.02)
    assert f"95 % CI [{-0.2 - half:.4g}, {-0.2 + half:.4g}], delta ±0.0101; on Fake CPU 9000: **HELD**" in md
    assert c["delta"] == pytest.approx(0.0101) and c["family_size"] == 6 and c["holm_verdict"] == "HELD"
    tanh = claims[("SDU tanh, all layers (sdu_tanh)", "claim", "ends lower than the baseline")]
    assert tanh["verdict"] == "NOT RESOLVED"
    hw = claims[("highway", "claim", "ends lower than the baseline")]
    assert hw["verdict"] == "DID NOT HOLD" and hw["paper_claim"] is False  # no paper number: our extra row
    # converges faster: same AUC offsets, so the AUC difference equals the final one; steps to reach 2.07
    fast = claims[("SDU sigmoid, all layers (sdu_sigmoid)", "claim", "converges faster than the baseline")]
    assert fast["verdict"] == "HELD" and fast["detail"].endswith(": 200")
    assert claims[("highway", "claim", "converges faster than the baseline")]["detail"].endswith("not reached")
    # the floor of the baseline (test bpc <= 1.80): 2.02 ± 0.02 misses it
    floor = claims[("baseline (no gate) (baseline)", "floor", "reaches the floor test bpc <= 1.8")]
    assert floor["floor_met"] is False and floor["verdict"] == "DID NOT HOLD" and floor["floor"] == 1.8
    row = claims[("baseline (no gate) (baseline)", "row", "")]
    assert row["mean"] == pytest.approx(2.02) and row["paper"] == 1.495 and row["floor_met"] is False
    # header: from the meta and the run folders
    assert "- command: `make reproduce-ht-char-ptb SCALE=cpu`" in md
    assert "- scale: cpu; seeds: 0, 1, 2, 3, 4; runs: 12 done, 1 failed, 1 missing" in md
    assert "- wall time: 2.00 h for the command; training 2.00 h summed over runs, 1.97 CPU-hours" in md
    assert "- machine: fakearch, Fake CPU 9000, 64 CPUs, torch 9.9.9, Python 3.99.0, no GPU (13 runs)" in md
    assert "- code: commit abcdef123456 (13 runs)" in md


def test_hn_table_and_summary_end_to_end(tmp_path):
    make_ht_runs(tmp_path / "runs" / "ht")
    make_hn_runs(tmp_path / "runs" / "hn")
    meta = {"commands": ["make reproduce-hn-table1 SCALE=cpu"], "scale": "cpu", "wall_s": None}
    md = build_table("hn_table1", load_runs(tmp_path / "runs" / "hn"), tmp_path / "results" / "hn" / "table1", meta)
    assert "| 16 | highway | 39,000 | 3 | 91.00 ± 1.00 | 92.00 | 99.43 | 99.40 ± 0.03 |" in md
    assert "| 32 | highway | 151,690 | 3 | 99.62 ± 0.02 | 99.64 | 99.55 | 99.54 ± 0.02 |" in md
    build_table("ht_char_ptb", load_runs(tmp_path / "runs" / "ht"), tmp_path / "results" / "ht" / "char",
                {**meta, "planned": 20})  # the grid has runs not trained yet
    build_table("hn_table1", load_runs(tmp_path / "runs" / "hn"), tmp_path / "results" / "archive" / "v0" / "t1", meta)
    # a part of a study (its rows are also in the study's combined table): in summary.csv, not in the README's glance
    build_table("ht_char_ptb", load_runs(tmp_path / "runs" / "ht"), tmp_path / "results" / "ht" / "part",
                {**meta, "part_of": "ht_gate_zoo"})
    expected = {n: f"{n} (`make reproduce-{n.replace('_', '-')}`)" for n in ("hn_table1", "ht_char_ptb", "hn_cifar")}
    path = write_summary(tmp_path / "results", expected)
    assert path == tmp_path / "results" / "summary.csv"
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    required = ["table", "row", "metric", "split", "n_seeds", "mean", "std", "ci_low", "ci_high", "paper", "floor",
                "floor_met", "claim", "verdict"]
    assert set(required) <= set(rows[0])
    by = {(r["table"], r["row"], r["kind"]): r for r in rows if r["kind"] != "claim"}
    assert {r["table"] for r in rows} == {"hn_table1", "ht_char_ptb"}
    w32 = by[("hn_table1", "width=32, kind=highway", "row")]
    assert (w32["metric"], w32["split"], w32["n_seeds"], w32["paper"]) == ("acc", "test", "3", "99.54")
    assert float(w32["mean"]) == pytest.approx(99.62) and w32["floor"] == "99.0" and w32["floor_met"] == "yes"
    assert by[("hn_table1", "width=16, kind=highway", "floor")]["floor_met"] == "no"
    verdicts = {r["row"]: r["verdict"] for r in rows if r["table"] == "hn_table1" and r["kind"] == "claim"}
    assert verdicts == {"width=16, kind=highway": "DID NOT HOLD", "width=32, kind=highway": "HELD"}
    assert all(r["file"] in ("hn/table1.md", "ht/char.md", "ht/part.md") for r in rows)
    assert {r["part_of"] for r in rows if r["file"] == "ht/part.md"} == {"ht_gate_zoo"}
    assert {r["part_of"] for r in rows if r["file"] != "ht/part.md"} == {""}
    index = (tmp_path / "results" / "README.md").read_text()
    # verdicts held / did not hold / no difference / not resolved, raw then Holm, the family, lines linked elsewhere;
    # Table 1's claims are the paper's levels: at the cpu scale counted apart, with no verdict
    assert ("[Highway Networks, Table 1: 10-layer conv net on MNIST](hn/table1.md) | cpu | 6 | 0 / 0 / 0 / 0; "
            "2 paper scale only | 0 / 0 / 0 / 0 | 2 | 0 | 1 of 2 |") in index
    assert "(ht/part.md) | cpu | 14 | 0 / 0 / 0 / 0 | 0 / 0 / 0 / 0 | 0 | 6 | 0 of 1 |" in index  # the same runs
    superseded = next(ln for ln in index.splitlines() if ln.startswith("Superseded recipes"))
    assert superseded.endswith("indexed here, not summarised: [archive/v0/t1.md](archive/v0/t1.md).")  # restored
    assert "(ht/char.md) | cpu | 14 of 20 (partial) |" in index  # 12 done, 1 failed, 1 missing
    not_made = next(ln for ln in index.splitlines() if ln.startswith("Not made yet"))
    assert not_made == "Not made yet (no kept run, so no table file): hn_cifar (`make reproduce-hn-cifar`)."
    # the index ends with every distinct comparison and floor
    listed = index[index.index("## Every comparison"):]
    assert "(ht/char.md)" in listed and "(ht/part.md)" not in listed  # the part's comparisons are the table's
    assert "| hn_table1 | width=32, kind=highway reaches the paper's accuracy" in listed
    assert (" | paper | level | 99.54 | 99.62 (acc, test, n 3) | 99.5  | cpu | paper scale only [99.57, 99.67] | — | "
            "— | [hn/table1.md](hn/table1.md) |") in listed
    lines = [ln for ln in listed.splitlines() if ln.startswith("| hn_table1 |") or ln.startswith("| ht_char_ptb |")]
    ours = [i for i, ln in enumerate(lines) if " | ours | " in ln]
    assert any(ln.startswith("| ht_char_ptb | highway ends lower than the baseline | ours |") for ln in lines)
    # a table with runs of its grid not trained yet says so in every line
    assert all(" | cpu, **partial: 14 of 20 runs** | " in ln for ln in lines if ln.startswith("| ht_char_ptb |"))
    assert all(" | cpu | " in ln for ln in lines if ln.startswith("| hn_table1 |"))
    assert ours and min(ours) > max(i for i, ln in enumerate(lines) if " | paper | " in ln)  # the paper's first
    assert all(" | own | " in ln for ln in lines if " | ours | " in ln)

    # the README's "at a glance" section: one line per table, from summary.csv
    update_readme = load_update_readme()
    (tmp_path / "README.md").write_text("# x\n\n<!-- glance:begin -->\nSTALE TEXT\n<!-- glance:end -->\n\n## Next\n")
    assert update_readme.main(tmp_path) == 0
    readme = (tmp_path / "README.md").read_text()
    assert "STALE" not in readme and readme.endswith("<!-- glance:end -->\n\n## Next\n")
    table_lines = [ln for ln in readme.splitlines() if ln.startswith("| [")]
    assert len(table_lines) == 3  # hn_table1, ht_char_ptb, and the part of a study whose table is not made
    # the reference row (the first floor's), ours against the paper's; held / did not hold / no difference / not
    # resolved as in the index above (Table 1's levels: no verdict at the cpu scale)
    assert ("| [Highway Networks, Table 1: 10-layer conv net on MNIST](results/hn/table1.md) | width=32, "
            "kind=highway: 99.62 acc test (paper 99.54) | 0 | 0 | 0 | 0 | cpu; 2 paper scale only |") in table_lines
    char = "| [Highway Transformer: Transformer-L3 on char-PTB (bpc)](results/ht/char.md) | baseline: "
    assert any(ln.startswith(char) and ln.endswith(" | cpu, **partial: 14 of 20 runs** |") for ln in table_lines)


def load_update_readme():
    return load_script("update_readme")


def test_claims_without_runs_on_a_side_are_marked_not_testable(tmp_path):
    """A claim whose comparison row has no finished run (a study's row not trained yet) is NOT RESOLVED and says
    why: in the results index (counted apart) and in the README's glance (not 'no interval')."""
    make_ht_runs(tmp_path / "runs")
    runs = [r for r in load_runs(tmp_path / "runs") if "baseline" not in r.path.name]
    build_table("ht_char_ptb", runs, tmp_path / "results" / "ht" / "char", {"scale": "cpu"})
    write_summary(tmp_path / "results", {})
    index = (tmp_path / "results" / "README.md").read_text()
    # 6 not resolved, all 6 for want of runs; no test, so no family
    assert "(ht/char.md) | cpu | 11 | 0 / 0 / 0 / 6 (6) | 0 / 0 / 0 / 6 | 0 | 0 | — |" in index
    lines = [ln for ln in index.splitlines() if ln.startswith("| ht_char_ptb |")]
    assert len(lines) == 6 and all("**NOT RESOLVED** (not testable yet: no finished runs for the row it is "
                                   "compared with)" in ln for ln in lines)
    (tmp_path / "README.md").write_text("<!-- glance:begin -->\n<!-- glance:end -->\n")
    assert load_update_readme().main(tmp_path) == 0
    assert " | 0 | 0 | 0 | 6 | cpu |" in (tmp_path / "README.md").read_text()


def test_gate_analyses_report_is_rebuilt_from_kept_files_without_the_checkpoint(tmp_path):
    """`make tables` on a fresh clone (no run folder with a checkpoint): the gate analyses' report is rebuilt from
    its kept run and the findings the analysis kept (`<out>_findings.md`), with its scale file at the end."""
    from highway_repro.runner.cli import report_table

    results = tmp_path / "results"
    run = results / "highway_networks" / "runs" / "hn_analysis-cpu" / "run"
    fake_run(run, [], {"model": {"kind": "highway"}},
             {"status": "done", "step": 30000, "test/acc": 0.9687, "train/loss": 0.0034}, run_info=MACHINE)
    assert report_table("hn_analysis", "cpu", tmp_path / "runs", results) == 0  # no findings kept: no report
    assert not (results / "highway_networks" / "analysis.md").exists()
    (results / "highway_networks" / "analysis_findings.md").write_text("## What the figures show\n\nlesionable: 25\n")
    assert report_table("hn_analysis", "cpu", tmp_path / "runs", results) == 0
    md = (results / "highway_networks" / "analysis.md").read_text()
    assert "| highway |" in md and "96.87" in md
    assert md.index("| highway |") < md.index("lesionable: 25") < md.index(
        "<summary>configs/experiment_scale/hn_analysis/cpu.yaml</summary>")


def test_header_reads_run_folders_not_the_builder(tmp_path):
    info_b = {**MACHINE, "machine": "otherarch", "cpu_model": None, "cuda_device": "Fake GPU", "threads": 2}
    fake_run(tmp_path / "a", ["seed=0"], {"seed": 0}, {"status": "done", "time/wall_s": 3600.0, "time/cpu_s": 7200.0},
             run_info=MACHINE)
    fake_run(tmp_path / "b", ["seed=1"], {"seed": 1}, {"status": "done", "time/wall_s": 1800.0}, run_info=info_b)
    fake_run(tmp_path / "c", ["seed=2"], {"seed": 2, "threads": 3}, {"status": "diverged", "time/wall_s": 600.0})
    text = header("T", load_runs(tmp_path), {"commands": ["a", "b", "a"], "scale": "cpu", "wall_s": 60.0})
    assert "- commands: `a`; `b`" in text
    assert "- scale: cpu; seeds: 0, 1, 2; runs: 2 done, 1 failed, 0 missing" in text
    # 7200 s measured + 1800 s x 2 threads + 600 s x 3 threads (the config's) = 12600 s = 3.50 CPU-hours; the run on
    # a GPU also counts its wall time as GPU time: 1800 s = 0.50 GPU-hours
    assert "- wall time: 1.0 min for the commands; training 1.67 h summed over runs, 0.50 GPU-hours (the wall time " \
           "of the 1 run made on a GPU, summed: runs that shared a GPU each count), 3.50 CPU-hours (estimated as " \
           "wall time x threads for 2 of the runs, which recorded no time/cpu_s)" in text
    assert "- machine: fakearch, Fake CPU 9000, 64 CPUs, torch 9.9.9, Python 3.99.0, no GPU (1 run)" in text
    assert "- machine: otherarch, 64 CPUs, torch 9.9.9, Python 3.99.0, GPU Fake GPU (1 run)" in text
    assert "- 1 run folder has no run_info.json" in text
    assert f"{os.cpu_count()} CPU cores" not in text


def test_a_runs_threads_are_a_count_never_a_json_true(tmp_path):
    fake_run(tmp_path / "a", ["seed=0"], {"seed": 0, "threads": 3}, {"status": "done"},
             run_info={**MACHINE, "threads": True})
    fake_run(tmp_path / "b", ["seed=1"], {"seed": 1}, {"status": "done"}, run_info={**MACHINE, "threads": True})
    fake_run(tmp_path / "c", ["seed=2"], {"seed": 2, "threads": "²"}, {"status": "done"},
             run_info={**MACHINE, "threads": "٣"})  # a digit int() reads, and one it does not
    fake_run(tmp_path / "d", ["seed=3"], {"seed": 3}, {"status": "done"}, run_info={**MACHINE, "threads": "²"})
    a, b, c, d = sorted(load_runs(tmp_path), key=lambda r: r.path.name)
    assert a.threads == (3, True) and b.threads == (1, False) and c.threads == (3, True) and d.threads == (1, False)


def test_the_papers_training_hours_only_beside_the_table_they_are_from():
    from highway_repro.report.tables import registry

    def headers(name):
        return [c.header for c in registry()[name].columns]
    assert "paper time vs baseline" in headers("ht_enwik8_l6")
    assert "paper time vs baseline" not in headers("ht_enwik8_l12")
    assert "CPU time/step vs baseline" in headers("ht_enwik8_l12")


def test_report_package_reads_files_only(tmp_path):
    """No torch, models, trainer or runner: building a table imports none of them (of the package, only the report
    itself, the error classes `highway_repro.errors`, the kept-file reader `highway_repro.files`, the table registry
    `highway_repro.targets` and the sweep files' reader `highway_repro.grids`, which imports only the registry)."""
    make_hn_runs(tmp_path / "runs")
    code = ("import sys; from pathlib import Path; from highway_repro.report import build_table, load_runs; "
            f"build_table('hn_table1', load_runs({str(tmp_path / 'runs')!r}), Path({str(tmp_path / 'out')!r}), {{}}); "
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith(('highway_repro.models', "
            "'highway_repro.train', 'highway_repro.runner', 'highway_repro.engine'))]; print(bad); "
            "sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stdout + r.stderr
    for py in (REPO / "highway_repro" / "report").glob("*.py"):
        for node in ast.walk(ast.parse(py.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for n in names:
                assert not n.startswith("highway_repro.") or n.startswith("highway_repro.report") \
                    or n in ("highway_repro.errors", "highway_repro.files", "highway_repro.targets",
                             "highway_repro.grids"), (py.name, n)


def test_paper_numbers_live_in_papers_yaml():
    """Thresholds and paper values (0.23, 92.0, 99.43, 1.495, ...) are in papers.yaml, and in no Python file."""
    data = yaml.safe_load((REPO / "highway_repro" / "report" / "papers.yaml").read_text())
    assert data["fig1"]["trains_below"] == 0.23 and data["tables"]["hn_table1"]["rows"]["16/highway"]["best"] == 99.43
    for py in (REPO / "highway_repro" / "report").glob("*.py"):
        consts = [n.value for n in ast.walk(ast.parse(py.read_text())) if isinstance(n, ast.Constant)
                  and isinstance(n.value, float)]
        for v in (0.23, 92.0, 99.43, 99.55, 1.495, 92.31, 1.24339, 21.16, 1.8, 2.3):
            assert v not in consts, (py.name, v)


def test_every_floor_is_on_a_known_table_and_its_primary_measure():
    """papers.yaml's floors are read by table name on the table's primary measure: a floor of another name or metric
    would be tested on nothing, or on the wrong number."""
    from highway_repro.report import papers, registry

    tables = registry()
    assert {"hn_fig1", "hn_table1", "ht_char_ptb"} <= set(papers.FLOORS)
    for name, floors in papers.FLOORS.items():
        assert name in tables, name
        assert all(f.key == tables[name].primary.key for f in floors), name


def test_every_table_builds_from_failed_runs_only(tmp_path):
    """A sweep whose jobs all failed still gives every table (rows with the error, no claim decided)."""
    from highway_repro.report import registry

    fake_run(tmp_path / "runs" / "j", ["variant=baseline", "model.kind=highway", "model.depth=10", "model.width=16"],
             {}, {"status": "failed", "error": "RuntimeError: boom"})
    for name in registry():
        md = build_table(name, load_runs(tmp_path / "runs"), tmp_path / "out" / name, {"scale": "smoke"})
        assert "RuntimeError: boom" in md and "**HELD**" not in md, name


# ------------------------------------------------------------------ run_info.json
def test_write_run_info_fields_and_update(tmp_path):
    import torch

    from highway_repro.engine.loggers import write_run_info

    first = write_run_info(tmp_path, start_time="2026-01-01T00:00:00+00:00")
    assert first["threads"] == torch.get_num_threads() and first["torch"] == torch.__version__
    assert first["cpu_count"] == os.cpu_count() and first["machine"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert first["git_commit"] == (head or None)  # the checkout's commit (None outside a git checkout)
    write_run_info(tmp_path, start_time="2026-02-02T00:00:00+00:00", end_time="2026-02-02T01:00:00+00:00")
    info = json.loads((tmp_path / "run_info.json").read_text())
    assert info["start_time"] == "2026-01-01T00:00:00+00:00"  # a resumed run keeps its first start
    assert info["end_time"] == "2026-02-02T01:00:00+00:00"
    assert set(MACHINE) <= set(info)


@needs_mirror
def test_train_writes_run_info(tmp_path):
    from highway_repro.train import run

    out = run(compose(["experiment=demo", "scale=smoke"]), tmp_path)
    info = json.loads((tmp_path / "run_info.json").read_text())
    assert out["status"] == "done" and info["start_time"] <= info["end_time"] and info["threads"] >= 1
    assert load_runs(tmp_path)[0].run_info == info


def test_fig1_best_curves_keep_the_last_logged_training_loss(tmp_path, monkeypatch):
    """The best-run panels of Fig. 1 plot every logged running mean of the training loss up to the last step
    (max_steps 16,000 at the cpu scale; the trainer logs at the last step): the final full pass over the training
    set is not in the log, so no point is to be dropped."""
    from highway_repro.report import hn_tables

    panels = []
    monkeypatch.setattr(hn_tables, "plot", lambda path, ps, **kw: panels.extend(ps))
    # the table's kept runs (26 trials x 12 cells and those of the second look made so far, all at max_steps
    # 16,000 or diverged)
    runs = load_runs(REPO / "results" / "highway_networks" / "runs" / "hn_fig1-cpu")
    first = {f"model.depth={d},model.kind={k},trial={t}" for d in (10, 20, 50, 100)
             for k in ("plain", "highway", "residual") for t in range(26)}
    second = {f"model.depth=50,model.kind={k},trial={t}" for k in ("plain", "highway") for t in range(26, 100)}
    assert first <= {r.path.name for r in runs} <= first | second
    build_table("hn_fig1", runs, tmp_path / "fig1", {})
    best = [p for p in panels if p.title.endswith(": best")]
    assert best and all(xs[-1] == 16000 for p in best for xs, _ in p.series.values())


def test_placement_scan_plots_the_trained_layers_against_lines_over_every_k(tmp_path):
    """The scan's k panels: a point per trained layer k (here only k = 2), the baseline and all-layers rows as flat
    lines over every k of the grid (1-6 from the table's rows), not over the trained ones only; each mean over seeds
    with the band of its 95 % t-interval, as the tables' learning curves."""
    from highway_repro.report.ht_tables import placement_panels
    from highway_repro.report.plots import curve_panel
    from highway_repro.report.spec import render
    from highway_repro.report.tables import registry

    for v, test in (("baseline", [2.20, 2.22]), ("sdu_tanh", [2.10, 2.12]), ("tanh_l2", [2.15, 2.19])):
        for seed, x in enumerate(test):
            fake_run(tmp_path / f"seed={seed},variant={v}", [f"variant={v}", f"seed={seed}"], {"variant": v},
                     {"status": "done", "step": 300, "val/bpc": x, "test/bpc": x}, [{"step": 100, "val/bpc": x + 1}])
    fake_run(tmp_path / "seed=0,variant=tanh_l5", ["variant=tanh_l5", "seed=0"], {"variant": "tanh_l5"},
             {"status": "failed", "error": "killed"})
    t, _, _ = render(registry()["ht_placement_scan"], load_runs(tmp_path))
    test_panel, auc_panel = placement_panels(t)
    k_only, base, every = (test_panel.series[s] for s in
                           ("SDU tanh in layer k only", "baseline (no gate)", "SDU tanh, all layers"))
    assert k_only == ([2], [pytest.approx(2.17)])  # the failed k = 5 is not a point
    assert base == ([1, 6], [pytest.approx(2.21)] * 2) and every == ([1, 6], [pytest.approx(2.11)] * 2)
    assert auc_panel.series["SDU tanh in layer k only"] == ([2], [pytest.approx(3.17)])
    # each mean over two seeds has its 95 % t-interval as a band: mean ± t(0.975, 1) sd / sqrt(2), t = 12.7062
    half = 12.706205 * 0.01  # seeds 2.20 and 2.22: sd / sqrt(2) = 0.01
    assert test_panel.bands["baseline (no gate)"] == ([1, 6], [pytest.approx(2.21 - half)] * 2,
                                                      [pytest.approx(2.21 + half)] * 2)
    assert test_panel.bands["SDU tanh in layer k only"] == ([2], [pytest.approx(2.17 - 2 * half)],
                                                            [pytest.approx(2.17 + 2 * half)])
    curves = curve_panel(t.rows, "val/bpc", "")  # the tables' learning curves: the same band
    assert curves.bands[t.by_id[("baseline",)].label] == ([100], [pytest.approx(3.21 - half)],
                                                          [pytest.approx(3.21 + half)])
    assert "t-interval" in test_panel.band_label == curves.band_label


def test_the_index_names_a_commit_that_holds_the_archive():
    """results/README.md sends a reader of the superseded recipes to `summary.ARCHIVE_COMMIT`: its tree has the
    folder (with its own index), and the tree of this checkout no longer does."""
    from highway_repro.report.summary import ARCHIVE_COMMIT

    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)

    if git("cat-file", "-e", f"{ARCHIVE_COMMIT}^{{commit}}").returncode:
        pytest.skip("a clone without the history (shallow)")
    listing = git("ls-tree", "--name-only", f"{ARCHIVE_COMMIT}:results/archive").stdout.split()
    assert {"cpu-v1", "cpu-v2", "cpu-v3", "cpu-v4", "cpu-v5"} <= set(listing)
    assert not (REPO / "results" / "archive").exists()
    assert f"git checkout {ARCHIVE_COMMIT[:12]} -- results/archive" in (REPO / "results" / "README.md").read_text()


def test_the_glance_opens_with_the_findings_of_the_papers_trend_claims(tmp_path):
    """The findings that open the README's glance: one line per table with a paper trend claim, the held and the
    not-held claims in words with their difference and interval, the unresolved ones counted; level, own and
    artifact claims, and study lines that repeat a table's comparison, left out."""
    def row(table, claim, verdict, claim_type="trend", diff="-0.05", **kw):
        return {"table": table, "file": f"ht/{table}.md", "kind": "claim", "row": "SDU tanh, all layers (sdu_tanh)",
                "claim": claim, "verdict": verdict, "claim_type": claim_type, "metric": "bpc", "split": "test",
                "diff": diff, "ci_low": "-0.08", "ci_high": "-0.02", "scale": "cpu", "runs": "10",
                "runs_planned": "10", **kw}

    rows = [row("a", "ends lower than the baseline; paper -8.8%", "HELD"),
            row("a", "converges faster than the baseline", "NOT RESOLVED"),
            row("a", "reaches 1.2", "DID NOT HOLD", claim_type="level"),
            row("a", "ends lower than x", "HELD", claim_type="own"),
            row("b", "ends higher than the baseline; paper +5.3%", "DID NOT HOLD")]
    text = load_update_readme().findings(rows, tmp_path)
    lines = [ln for ln in text.splitlines() if ln.startswith("- ")]
    assert lines == ["- **a** (cpu): held: SDU tanh, all layers ends lower than the baseline (bpc test: -0.05 "
                     "[-0.08, -0.02]). 1 not resolved.",
                     "- **b** (cpu): did not hold: SDU tanh, all layers ends higher than the baseline (bpc test: "
                     "-0.05 [-0.08, -0.02])."]


def test_the_prose_templates_are_one_paragraph_each_filled_by_name():
    """report/prose.md: a section's wrapped lines are one line of the page, its $names filled; a name left out fails."""
    from highway_repro.report.prose import prose

    text = prose("anchor data", step=400, tol=0.15)
    assert text.startswith("**The data are the enwik8 prefix of the offline mirror") and text.endswith("(seed 1111).")
    assert "the corpus.** 400 steps of 22 x 512 tokens" in text and "within 0.15 bpc: yes" in text
    assert "\n" not in text and "  " not in text
    with pytest.raises(KeyError):
        prose("anchor data", step=400)
