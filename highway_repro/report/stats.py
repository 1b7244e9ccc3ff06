"""Means, 95 % intervals, the four verdicts, Holm, the seeds a decision needs, a random search's quantile tests.
scipy and statsmodels are imported where used: the runner and the GPU check import the constants without them."""

from __future__ import annotations

import gc
import math
import statistics
from functools import lru_cache, partial

HELD, NOT_HELD, NO_DIFFERENCE, NOT_RESOLVED = "HELD", "DID NOT HOLD", "NO DIFFERENCE", "NOT RESOLVED"
VERDICTS = (HELD, NOT_HELD, NO_DIFFERENCE, NOT_RESOLVED)
LEVEL = 0.95
# Runs added after a look are decided at SECOND_LOOK, not LEVEL (two looks at 95 % err up to 10 %, optional
# stopping): the two looks err at most 6 % (Bonferroni). The seeds a NOT RESOLVED comparison needs are counted at it.
SECOND_LOOK = 0.99
ALTERNATIVE = {"lower": "smaller", "higher": "larger"}  # a claim's side as statsmodels names the alternative
POWER = 0.8  # the chance of a decision that "seeds needed" asks for
# The cpu scale's budget: every table within 8 hours on 2 cores (2 jobs x 1 thread), runs it already has included.
TABLE_BUDGET_H, BUDGET_CORES = 8.0, 2


def pct(level: float) -> str:
    """A level as the report writes it: 0.95 -> "95 %"."""
    return f"{level * 100:g} %"


def mean_std(values) -> tuple[float, float]:
    """(mean, sample std); std nan for one value, (nan, nan) for none."""
    values = [float(v) for v in values]
    mean = statistics.fmean(values) if values else math.nan
    return mean, (statistics.stdev(values) if len(values) > 1 else math.nan)


def _finite(values) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def _check_side(side: str) -> None:
    if side not in ALTERNATIVE:
        raise ValueError(f"side={side!r} is not known (valid: lower, higher)")


def t_test(xs, ys=None, side: str = "lower", threshold: float = 0.0, delta: float | None = None,
           level: float = LEVEL) -> dict | None:
    """The t-test (statsmodels) that mean(xs), or with `ys` Welch's mean(xs) - mean(ys), lies on `side` of
    `threshold`: {"estimate", "ci" at `level`, "tests": one-sided p-values of the claim's side ("p_side"), of the
    other ("p_other"), of equivalence within threshold +-delta ("p_equiv": TOST; None without a margin)}. Paired
    rows: xs their per-seed differences. None when a side has fewer than two values; without spread (se 0) the
    interval is a point and p is 0 or 1 (1/2 on the threshold)."""
    from statsmodels.stats.weightstats import CompareMeans, DescrStatsW

    _check_side(side)
    xs, ys = _finite(xs), None if ys is None else _finite(ys)
    if len(xs) < 2 or (ys is not None and len(ys) < 2):
        return None
    if ys is None:
        one = DescrStatsW(xs)
        est, se = float(one.mean), float(one.std_mean)
        ci, test, tost = one.tconfint_mean, one.ttest_mean, one.ttost_mean
    else:
        two = CompareMeans(DescrStatsW(xs), DescrStatsW(ys))
        est, se = statistics.fmean(xs) - statistics.fmean(ys), float(two.std_meandiff_separatevar)
        ci, test, tost = (partial(f, usevar="unequal") for f in (two.tconfint_diff, two.ttest_ind, two.ttost_ind))
    other = "higher" if side == "lower" else "lower"
    if se == 0.0:  # no spread: the difference is known exactly
        def one_sided(value, alt):
            return 0.5 if est == value else float((est > value) == (alt == "smaller"))
        interval = (est, est)
        equiv = None if delta is None else max(one_sided(threshold - delta, "larger"),
                                               one_sided(threshold + delta, "smaller"))
    else:
        def one_sided(value, alt):
            return float(test(value=value, alternative=alt)[1])
        interval = tuple(float(e) for e in ci(alpha=1.0 - level))
        equiv = None if delta is None else float(tost(threshold - delta, threshold + delta)[0])
    tests = {"p_side": one_sided(threshold, ALTERNATIVE[side]), "p_other": one_sided(threshold, ALTERNATIVE[other]),
             "p_equiv": equiv}
    return {"estimate": est, "ci": interval, "tests": tests}


def mean_interval(values, level: float = LEVEL) -> tuple[float, float] | None:
    return (t_test(values, level=level) or {}).get("ci")


def verdict(interval: tuple[float, float] | None, side: str, threshold: float = 0.0,
            delta: float | None = None) -> str:
    """HELD if `interval` lies wholly on `side` of `threshold`, DID NOT HOLD if wholly on the other (touching the
    threshold is not wholly; a side wins over +-delta), NO DIFFERENCE if it lies within threshold +-delta (`delta`:
    the equivalence margin, None: no such verdict), NOT RESOLVED otherwise or without an interval."""
    _check_side(side)
    if interval is None:
        return NOT_RESOLVED
    lo, hi = interval
    below, above = hi < threshold, lo > threshold
    if (below and side == "lower") or (above and side == "higher"):
        return HELD
    if below or above:
        return NOT_HELD
    if delta is not None and threshold - delta <= lo and hi <= threshold + delta:
        return NO_DIFFERENCE
    return NOT_RESOLVED


def second_look_p(tests: dict | None, level: float) -> dict | None:
    """One-sided p-values read at `level`, on LEVEL's scale (x (1 - LEVEL) / (1 - level), at most 1: Bonferroni), so
    that p < (1 - LEVEL) / 2 says what the `level` interval says, in the raw verdict and in Holm's alike."""
    if tests is None or level == LEVEL:
        return tests
    factor = (1.0 - LEVEL) / (1.0 - level)
    return {k: None if p is None else min(1.0, p * factor) for k, p in tests.items()}


def holm(pvalues: list[float]) -> list[float]:
    """Holm's (1979) step-down adjusted p-values, in the input order (family-wise error at alpha, any dependence)."""
    if len(pvalues) < 2:  # a family of one is its own adjustment
        return [min(1.0, float(p)) for p in pvalues]
    from statsmodels.stats.multitest import multipletests

    # multipletests' Holm branch runs gc.collect() (0.05-0.3 s with torch loaded): frozen, it sees its own garbage
    gc.freeze()
    try:
        return [float(p) for p in multipletests(pvalues, method="holm")[1]]
    finally:
        gc.unfreeze()


def holm_verdicts(tests: list[dict], alpha: float = 1.0 - LEVEL) -> list[str]:
    """The verdicts of a family of tests (`t_test`'s "tests", None: NOT RESOLVED) after Holm's adjustment of each
    p-value list: a verdict where its adjusted p < alpha / 2, so a family of one gives the raw verdicts back. NO
    DIFFERENCE also needs neither raw one-sided p below alpha / 2: a difference the raw interval shows is never
    called no difference once the family widens it."""
    idx = [i for i, t in enumerate(tests) if t is not None]
    adj = {k: holm([tests[i][k] for i in idx]) for k in ("p_side", "p_other")}
    eq = [i for i in idx if tests[i].get("p_equiv") is not None]
    adj_eq = dict(zip(eq, holm([tests[i]["p_equiv"] for i in eq])))
    out = [NOT_RESOLVED] * len(tests)
    for j, i in enumerate(idx):
        if adj["p_side"][j] < alpha / 2:
            out[i] = HELD
        elif adj["p_other"][j] < alpha / 2:
            out[i] = NOT_HELD
        elif i in adj_eq and adj_eq[i] < alpha / 2 and min(tests[i]["p_side"], tests[i]["p_other"]) >= alpha / 2:
            out[i] = NO_DIFFERENCE
    return out


def seeds_needed(sd_a: float, sd_b: float, diff: float, delta: float | None, level: float = LEVEL,
                 start: int = 2, cap: int = 1000, power: float = POWER) -> int | None:
    """Seeds per row (n >= `start`) at which Welch's test at `level` decides with probability `power` (normal-shift
    approximation) if the rows kept their spreads and difference; paired: sd_a of the differences, sd_b 0."""
    va, vb = sd_a * sd_a, sd_b * sd_b
    if not all(math.isfinite(x) for x in (va, vb, diff)) or va + vb == 0.0:
        return None
    target = max(abs(diff), (delta - abs(diff)) if delta is not None else 0.0)
    if target <= 0.0 or max(2, start) > cap:
        return None
    import numpy as np
    from scipy.stats import t

    n = np.arange(max(2, start), cap + 1)
    df = (n - 1) * (va + vb) ** 2 / (va * va + vb * vb)
    half = (t.ppf(0.5 + level / 2, df) + t.ppf(power, df)) * np.sqrt((va + vb) / n)
    decides = np.flatnonzero(half < target)
    return int(n[decides[0]]) if decides.size else None


def points_to(diff: float, side: str, threshold: float = 0.0, delta: float | None = None) -> str:
    """The verdict more runs would likely give if the estimate held: NO DIFFERENCE where delta - |gap| > |gap|."""
    _check_side(side)
    gap = diff - threshold
    if not math.isfinite(gap):
        return NOT_RESOLVED
    if delta is not None and delta - abs(gap) > abs(gap):
        return NO_DIFFERENCE
    return HELD if (gap < 0) == (side == "lower") and gap != 0 else NOT_HELD


def decision_cost(seeds: int, have: tuple[int, int], run_s: float,
                  table_s: float = 0.0) -> tuple[int, float, float, bool]:
    """Both rows to `seeds` from `have` (a run: `run_s` core-seconds; the table's runs: `table_s`) -> (runs to add,
    their hours on BUDGET_CORES cores, the table's hours with them, over TABLE_BUDGET_H)."""
    more = max(0, seeds - have[0]) + max(0, seeds - have[1])
    hours = more * run_s / BUDGET_CORES / 3600
    total = table_s / BUDGET_CORES / 3600 + hours
    return more, hours, total, total > TABLE_BUDGET_H


@lru_cache(maxsize=4096)
def binom_cdf(n: int, q: float) -> tuple[float, ...]:
    """P(B <= k) for k = 0..n, B ~ Binomial(n, q)."""
    from scipy.stats import binom
    return tuple(float(c) for c in binom.cdf(range(n + 1), n, q))


@lru_cache(maxsize=4096)
def quantile_ranks(n: int, q: float, miss: float) -> tuple[int, int]:
    """(r, s): order statistics x_(r) <= Q <= x_(s) of n trials bounding their law's q-quantile Q, each missing below
    `miss` whatever the law (David & Nagaraja, "Order Statistics", 3rd ed. 2003, sec. 7.1); r = 0, s = n + 1: no end."""
    cdf = binom_cdf(n, q)
    return sum(c < miss for c in cdf[:n]), next((k for k in range(1, n + 1) if 1.0 - cdf[k - 1] < miss), n + 1)


def quantile(values, q: float) -> float:
    """The q-quantile of `values`: their order statistic x_(ceil(q n))."""
    xs = sorted(values)
    return xs[max(1, math.ceil(round(q * len(xs), 9))) - 1]


def _bounds(xs: list[float], q: float, miss: float) -> tuple[float, float]:
    """scipy.stats.quantile_test's interval at 1 - 2 miss from cached ranks (the simulations call it ~10^5 times)."""
    r, s = quantile_ranks(len(xs), q, miss)
    return xs[r - 1] if r else -math.inf, xs[s - 1] if s <= len(xs) else math.inf


def _p_below(xs: list[float], ys: list[float] | None, q: float, t: float) -> float:
    """p of "Q(xs) - Q(ys) < t" (ys None: "Q(xs) < t"), xs and ys sorted: the least Bonferroni miss of the bounds."""
    cx = binom_cdf(len(xs), q)
    if ys is None:
        k = sum(x < t for x in xs)
        return 1.0 - cx[k - 1] if k else 1.0
    cy, best, j = binom_cdf(len(ys), q), 1.0, 0
    for i, x in enumerate(xs):
        while j < len(ys) and not x - ys[j] < t:  # the lowest y_(j) that keeps the pair below t: rises with x
            j += 1
        if j == len(ys):
            break
        best = min(best, 2.0 * max(1.0 - cx[i], cy[j]))
    return min(1.0, best)


def quantile_test(xs, q: float, threshold: float, side: str, ys=None, level: float = LEVEL) -> dict:
    """A claim that the q-quantile Q of a random search's trials, Q(xs) or with `ys` Q(xs) - Q(ys), lies on `side` of
    `threshold`, by exact, distribution-free order-statistic intervals at `level` (a difference: the rows' intervals
    at the Bonferroni level, each end missing below (1 - level) / 4); a one-sided p is below (1 - level) / 2 exactly
    when the interval lies on that side. -> {"quantiles": (Q(xs), Q(ys) or nan), "estimate", "ci", "tests"}."""
    _check_side(side)
    xs, ys = sorted(xs), sorted(ys) if ys is not None else None
    miss = (1.0 - level) / 2 / (1 if ys is None else 2)
    (lo, hi), qs = _bounds(xs, q, miss), (quantile(xs, q), quantile(ys, q) if ys is not None else math.nan)
    if ys is None:
        below, above = _p_below(xs, None, q, threshold), binom_cdf(len(xs), q)[sum(x <= threshold for x in xs)]
    else:
        (ylo, yhi) = _bounds(ys, q, miss)
        lo, hi = lo - yhi, hi - ylo
        below, above = _p_below(xs, ys, q, threshold), _p_below(ys, xs, q, -threshold)
    p_side, p_other = (below, above) if side == "lower" else (above, below)
    return {"quantiles": qs, "estimate": qs[0] - (qs[1] if ys is not None else 0.0), "ci": (lo, hi),
            "tests": {"p_side": min(1.0, p_side), "p_other": min(1.0, p_other), "p_equiv": None}}


def quantile_trials_needed(xs, q: float, threshold: float, ys=None, level: float = SECOND_LOOK,
                           cap: int = 1000) -> int | None:
    """Trials per row at which `quantile_test` at `level` decides if the trials kept their law; None: no n <= cap."""
    rows = [sorted(xs)] + ([sorted(ys)] if ys is not None else [])
    miss = (1.0 - level) / 2 / len(rows)
    for n in range(max(map(len, rows)), cap + 1):
        r, s = quantile_ranks(n, q, miss)
        ends = [(v[-(-r * len(v) // n) - 1] if r else -math.inf, v[-(-s * len(v) // n) - 1] if s <= n else math.inf)
                for v in rows]
        lo, hi = ends[0] if len(rows) == 1 else (ends[0][0] - ends[1][1], ends[0][1] - ends[1][0])
        if hi < threshold or lo > threshold:
            return n
    return None


@lru_cache(maxsize=64)
def best_of_k_weights(n: int) -> tuple[tuple[float, ...], ...]:
    """w[k - 1][i - 1] = C(n - i, k - 1) / C(n, k): the chance that the i-th best of n is the best of k of them."""
    return tuple(tuple(math.comb(n - i, k - 1) / math.comb(n, k) for i in range(1, n + 1)) for k in range(1, n + 1))


def expected_best(values, lower_is_better: bool = True) -> list[float]:
    """The expected best of k of the N trials, k = 1..N, over their k-subsets (Dodge et al. 2021, "Expected Validation
    Performance and Estimation of a Random Variable's Maximum"; their 2019 "Show Your Work" draws with replacement)."""
    xs = sorted(values, reverse=not lower_is_better)
    return [sum(w * x for w, x in zip(row, xs)) for row in best_of_k_weights(len(xs))]
