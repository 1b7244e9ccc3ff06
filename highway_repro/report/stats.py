"""Means, 95 % confidence intervals and the four verdicts.

- `mean_interval(xs)`: the t-interval of a mean (one sample, n - 1 degrees of freedom).
- `welch_interval(a, b)`: the interval of mean(a) - mean(b) with Welch's standard error and
  Welch-Satterthwaite degrees of freedom (no equal-variance assumption).
- `verdict(interval, side, threshold, delta)`: HELD when the interval lies wholly on the claim's side of the
  threshold, DID NOT HOLD when wholly on the other side, NO DIFFERENCE when it contains the threshold and lies
  wholly within +-delta of it (a comparison of two rows with an equivalence margin), NOT RESOLVED otherwise (and
  when an interval cannot be formed: fewer than 2 values on a side).

The t quantile is computed here (scipy is not a dependency): Student's t CDF through the regularised
incomplete beta function (continued fraction, Numerical Recipes 6.4), inverted by bisection. The tests
check it against closed forms (1 and 2 degrees of freedom) and published table values.
"""

from __future__ import annotations

import math
import statistics

HELD, NOT_HELD, NO_DIFFERENCE, NOT_RESOLVED = "HELD", "DID NOT HOLD", "NO DIFFERENCE", "NOT RESOLVED"
LEVEL = 0.95


def mean_std(values) -> tuple[float, float]:
    """(mean, sample std); std nan for one value (no spread is measured); (nan, nan) for none."""
    values = [float(v) for v in values]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else math.nan)


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 3e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` (> 0, not necessarily whole) degrees of freedom."""
    if math.isinf(df):
        return 0.5 * math.erfc(-t / math.sqrt(2.0))
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with t_cdf(t, df) = p (0 < p < 1), by bisection to 1e-12."""
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"t_quantile(p={p}, df={df}): need 0 < p < 1 and df > 0")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def _finite(values) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def mean_interval(values, level: float = LEVEL) -> tuple[float, float] | None:
    """t-interval of the mean; None for fewer than two values."""
    xs = _finite(values)
    if len(xs) < 2:
        return None
    m, s = mean_std(xs)
    half = t_quantile(0.5 + level / 2, len(xs) - 1) * s / math.sqrt(len(xs))
    return m - half, m + half


def welch_interval(a, b, level: float = LEVEL) -> tuple[float, float] | None:
    """Interval of mean(a) - mean(b) (Welch); None when a side has fewer than two values."""
    a, b = _finite(a), _finite(b)
    if len(a) < 2 or len(b) < 2:
        return None
    (ma, sa), (mb, sb) = mean_std(a), mean_std(b)
    va, vb = sa * sa / len(a), sb * sb / len(b)
    diff, se = ma - mb, math.sqrt(va + vb)
    if se == 0.0:  # both sides constant: the difference is known exactly
        return diff, diff
    df = (va + vb) ** 2 / (va * va / (len(a) - 1) + vb * vb / (len(b) - 1))
    half = t_quantile(0.5 + level / 2, df) * se
    return diff - half, diff + half


def verdict(interval: tuple[float, float] | None, side: str, threshold: float = 0.0,
            delta: float | None = None) -> str:
    """HELD if `interval` lies wholly on `side` ("lower" or "higher") of `threshold`, DID NOT HOLD if wholly on
    the other side (touching the threshold counts as not wholly; an interval on one side keeps its verdict even
    when it also lies within +-delta), NO DIFFERENCE if it lies within [threshold - delta, threshold + delta]
    (`delta`: the equivalence margin; None: no such verdict), NOT RESOLVED otherwise or without an interval."""
    if side not in ("lower", "higher"):
        raise ValueError(f"side={side!r} is not known (valid: lower, higher)")
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


def point_verdict(value: float, side: str, threshold: float) -> str:
    """A single value (a best trial) against a threshold: HELD or DID NOT HOLD (NOT RESOLVED if missing)."""
    if not math.isfinite(value):
        return NOT_RESOLVED
    return verdict((value, value), side, threshold) if value != threshold else NOT_HELD
