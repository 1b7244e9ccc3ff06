"""Interleaved timing: every comparison is measured side by side in one process, in rounds.

A round runs each contender once (`inner` steps), alternating the order from round to
round, so a load change on a shared machine hits all contenders alike. A ratio is the
median over rounds of the per-round ratio; a throughput is items / median step time.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable

Step = Callable[[], "float | None"]  # runs one step; may return its own measured seconds (a subprocess)

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = {"name": "wall", "fn": time.perf_counter}


def set_clock(name: str) -> None:
    """'wall' (perf_counter) or 'cpu' (process CPU time: on a shared machine it leaves out the time
    other jobs hold the core; meaningful with one thread, where no thread spins in a barrier)."""
    _clock.update(name=name, fn=CLOCKS[name])


def clock_name() -> str:
    return _clock["name"]


def now() -> float:
    return _clock["fn"]()


def _timed(step: Step) -> float:
    t0 = now()
    own = step()
    dt = now() - t0
    return float(own) if own is not None else dt


def interleaved(steps: dict[str, Step], *, warmup: int = 2, min_rounds: int = 3, max_rounds: int = 9,
                budget_s: float = 60.0, inner: int = 1, floor_rounds: int = 2) -> dict[str, list[float]]:
    """Seconds per step of each contender, one entry per round (after `warmup` steps each).

    The number of rounds is set after the warm-up from its step times: as many as fit in
    `budget_s`, at most `max_rounds`, at least `min_rounds` when they fit, never fewer than
    `floor_rounds` (a loaded machine gets fewer rounds, not a longer run).
    """
    names = list(steps)
    last: dict[str, float] = {}
    for name in names:
        for _ in range(warmup):
            last[name] = _timed(steps[name])
    est_round = sum(last.values()) * inner if last else 0.0
    fit = int(budget_s // est_round) if est_round > 0 else max_rounds
    rounds = max(floor_rounds, min(max_rounds, fit))
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            times[name].append(sum(_timed(steps[name]) for _ in range(inner)) / inner)
    return times


def median(xs) -> float:
    return float(statistics.median(xs))


def ratio(times: dict[str, list[float]], num: str, den: str) -> float:
    """Median over rounds of times[num] / times[den] (> 1: num is slower)."""
    return median([a / b for a, b in zip(times[num], times[den])])


def spread(xs) -> tuple[float, float]:
    return float(min(xs)), float(max(xs))


def median_ci(xs, level: float = 0.95) -> tuple[float, float] | None:
    """Distribution-free confidence interval of the median: the order statistics x_(k), x_(n+1-k)
    (1-based) with the largest k whose binomial tail P(Bin(n, 1/2) <= k-1) is at most (1-level)/2,
    so the coverage is at least `level`. None when n is too small for any k (n < 6 at 95%)."""
    s = sorted(xs)
    n = len(s)
    k, tail = 0, 0.0
    while k < n // 2:
        tail += math.comb(n, k) / 2 ** n  # P(X <= k)
        if tail > (1.0 - level) / 2:
            break
        k += 1
    return (float(s[k - 1]), float(s[n - k])) if k >= 1 else None
