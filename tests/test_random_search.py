"""A random search's statistics (Fig. 1 of Highway Networks, Srivastava et al. 2015): the expected best of k trials
(Dodge et al. 2019, "Show Your Work") against its definition, the claims' quantile test
(`stats.quantile_test`) simulated under a true null: the threshold exactly true, the table's trials per row, at
one look (26 trials, 95 %) and over depth 50's two (26 trials at 95 %, then 100 at 99 %: `stats.SECOND_LOOK`),
and the power and error that the table states (`power.FIG1_POWER`) recomputed at the measured trial distributions."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest

from highway_repro.report import papers, power, stats

Q = papers.FIG1_QUANTILE
FIRST, SECOND = 26, 100  # trials a row at the first look (configs/experiment_scale/hn_fig1/cpu.yaml), the second


def test_expected_best_of_k_is_the_mean_best_over_every_k_subset_of_the_trials():
    """E[best of k] is the mean, over every k of the N trials, of their best: the mean at k = 1, the best trial at
    k = N (the paper's "best run"), falling with k; lower is better, or higher with lower_is_better=False."""
    xs = [0.31, 0.02, 2.30, 0.07, 0.90, 0.02, 0.15]
    curve = stats.expected_best(xs)
    for k in range(1, len(xs) + 1):
        subsets = list(itertools.combinations(xs, k))
        assert curve[k - 1] == pytest.approx(statistics.fmean(min(s) for s in subsets))
    assert curve[0] == pytest.approx(statistics.fmean(xs)) and curve[-1] == min(xs)
    assert all(a >= b for a, b in zip(curve, curve[1:]))
    assert stats.expected_best(xs, lower_is_better=False)[-1] == pytest.approx(max(xs))
    assert all(sum(row) == pytest.approx(1.0) for row in stats.best_of_k_weights(SECOND))


def _trials(rng: random.Random, n: int, quantile: float, sd: float, failed: float = 0.0) -> list[float]:
    """n trials (log10 final training loss) whose law has its Q-quantile exactly at `quantile`: normal (log-normal
    losses) for the finished ones, and a share `failed` of failures above every finished trial, which the claims
    count at the worst finished value (`claims.trials`)."""
    mu = quantile - sd * statistics.NormalDist().inv_cdf(Q / (1.0 - failed))
    return [rng.gauss(mu, sd) if rng.random() >= failed else math.inf for _ in range(n)]


def _at_worst(*rows: list[float]) -> list[list[float]]:
    worst = max(x for row in rows for x in row if math.isfinite(x))
    return [[x if math.isfinite(x) else worst for x in row] for row in rows]


def _decides(xs, ys, threshold: float, level: float, side: str = "lower") -> bool:
    """Whether the claim's interval gives HELD or DID NOT HOLD: under a true null, an error either way."""
    qt = stats.quantile_test(xs, Q, threshold, side, ys, level)
    return stats.verdict(qt["ci"], side, threshold) != stats.NOT_RESOLVED


def error_rates(sims: int, seed: int, highway, plain, side: str = "lower") -> tuple[float, float]:
    """(one look, two looks) error rates of "highway's Q-quantile is 100x below plain's" (log10 difference -2),
    the null exactly true: `highway(rng, n)` and `plain(rng, n)` draw trials whose quantiles differ by -2. One look:
    the first 26 trials a row at 95 %; two looks: that verdict if it decides, else all 100 trials a row at 99 %."""
    rng, one, two = random.Random(seed), 0, 0
    threshold = -math.log10(papers.FIG1_HIGHWAY_FACTOR)
    for _ in range(sims):
        h, p = highway(rng, SECOND), plain(rng, SECOND)
        first = _decides(*_at_worst(h[:FIRST], p[:FIRST]), threshold, stats.LEVEL, side)
        one += first
        two += first or _decides(*_at_worst(h, p), threshold, stats.SECOND_LOOK, side)
    return one / sims, two / sims


def _at_most(rate: float, level_error: float, sims: int) -> bool:
    """rate <= the nominal error plus 3 Monte Carlo standard errors (of a rate at the nominal error)."""
    return rate <= level_error + 3 * math.sqrt(level_error * (1 - level_error) / sims)


ONE_LOOK, TWO_LOOKS = 1 - stats.LEVEL, (1 - stats.LEVEL) + (1 - stats.SECOND_LOOK)  # 5 %, 6 % (Bonferroni)


def test_the_quantile_test_errs_at_most_its_level_under_a_true_null():
    """Log-normal trials whose Q-quantiles lie exactly at the claims' thresholds, as many as the table's rows.
    A row against a number (plain < 1e-4, "trains"): 26 trials at 95 %; its error is exactly the binomial tail of
    the interval's ranks (4.6 %), which the simulation must meet within 3 standard errors. Highway 100x below plain
    (log10 difference -2): at one look and over the two looks of depth 50, at most 5 % and 6 % (plus 3 standard
    errors)."""
    sims, rng = 4000, random.Random(0)
    rate = sum(_decides(_trials(rng, FIRST, -4.0, 1.0), None, -4.0, stats.LEVEL) for _ in range(sims)) / sims
    r, s = stats.quantile_ranks(FIRST, Q, (1 - stats.LEVEL) / 2)
    cdf = stats.binom_cdf(FIRST, Q)
    exact = cdf[r - 1] + (1.0 - cdf[s - 1])  # P(B <= r - 1) + P(B >= s), B ~ Binomial(26, Q)
    assert (r, s) == (2, 10) and exact == pytest.approx(0.0459, abs=1e-4)
    assert abs(rate - exact) <= 3 * math.sqrt(exact * (1 - exact) / sims) and _at_most(rate, ONE_LOOK, sims)
    one, two = error_rates(sims, 1, lambda rng, n: _trials(rng, n, -3.0, 0.8),
                           lambda rng, n: _trials(rng, n, -1.0, 0.5))
    assert _at_most(one, ONE_LOOK, sims) and _at_most(two, TWO_LOOKS, sims), (one, two)


@pytest.mark.slow
@pytest.mark.parametrize("law", ["log-normal, 30 % failed", "the measured depth-50 trials"])
def test_the_quantile_test_errs_at_most_its_level_on_failures_and_the_measured_trials(law):
    """As the fast test, with 20,000 simulations: log-normal trials with 30 % failures (counted at the worst finished
    value), and trials drawn from the kept runs' measured depth-50 trials (100 a kind, failures at the worst), highway
    shifted on log10 so that the two laws' Q-quantiles differ by exactly -2. (Either side of the claim errs on the
    same draws: a decision either way is an error under the null.)"""
    sims = 20000
    if law.startswith("log-normal"):
        highway = lambda rng, n: _trials(rng, n, -3.0, 0.8, failed=0.3)  # noqa: E731
        plain = lambda rng, n: _trials(rng, n, -1.0, 0.5, failed=0.3)  # noqa: E731
    else:
        from conftest import REPO
        from highway_repro.report import load_runs
        from highway_repro.report.claims import trials
        from highway_repro.report.hn_tables import HN_FIG1
        from highway_repro.report.measures import Measure
        from highway_repro.report.spec import group

        m = Measure("train/loss", "log10 loss", how="log10")
        runs = [r for r in load_runs(REPO / "results" / "highway_networks" / "runs" / "hn_fig1-cpu")
                if str(r.get("model.depth")) == "50"]
        rows = {row.id[1]: row for row in group(HN_FIG1, runs)}
        worst = max(rows["plain"].values(m) + rows["highway"].values(m))
        h, p = (trials(rows[k], m, worst) for k in ("highway", "plain"))
        # the law of a draw is the measured trials: its Q-quantile is their order statistic x_(ceil(Q N))
        shift = -2.0 - (stats.quantile(h, Q) - stats.quantile(p, Q))
        highway = lambda rng, n: [rng.choice(h) + shift for _ in range(n)]  # noqa: E731
        plain = lambda rng, n: [rng.choice(p) for _ in range(n)]  # noqa: E731
    one, two = error_rates(sims, 2, highway, plain)
    assert _at_most(one, ONE_LOOK, sims) and _at_most(two, TWO_LOOKS, sims), (one, two)


def test_the_stated_power_and_error_of_the_fig1_claim_are_those_of_the_measured_trials():
    """power.FIG1_POWER (the power, error and refutation rates that FIG1_TEST states) recomputed with fewer draws
    (depth 50's 100 trials a row cost more a draw) and another seed at the kept runs' trial distributions, each depth
    at its own design (depth 100: 26 trials a row at 95 %; depth 50: 100 at 99 %, its second look): each rate within
    4 standard errors of the difference of the two Monte Carlo estimates (the stated one's draws and these; a rate of
    0 or 1 counted as 1 / draws from it)."""
    from conftest import REPO

    runs_dir = REPO / "results" / "highway_networks" / "runs" / "hn_fig1-cpu"
    kept = {d: len(list(runs_dir.glob(f"model.depth={d},model.kind=plain,trial=*"))) for d in power.DESIGN}
    assert kept == {"50": SECOND, "100": FIRST}, kept
    assert power.DESIGN == {"50": (SECOND, stats.SECOND_LOOK), "100": (FIRST, stats.LEVEL)}
    off = {}
    for depth, draws in {"50": 1000, "100": 3000}.items():
        measured = power.fig1_power(draws, power.FIG1_POWER_SEED + 1, runs_dir, depths=(depth,))
        for name, stated in power.FIG1_POWER[depth].items():
            p = min(max(stated, 1 / draws), 1 - 1 / draws)
            tol = 4 * math.sqrt(p * (1 - p) * (1 / draws + 1 / power.FIG1_POWER_DRAWS))
            if abs(measured[depth][name] - stated) > tol:
                off[(depth, name)] = (stated, measured[depth][name], round(tol, 4))
    assert not off, off  # (stated, measured here, tolerance)
