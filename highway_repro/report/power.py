"""The power of Fig. 1's claim "highway is more than 100x below plain" (Highway Networks, Srivastava et al. 2015) as
the table tests it (`stats.quantile_test` on the 20 % quantile of log10 final training loss), simulated at the
trial distributions of the kept runs.

The laws: each row's law is its measured trials (a failure stays a failure), highway's finished values shifted on
log10 so that its 20 % quantile lies `gap` from plain's (-3: highway 1,000x below, -2: exactly the claim's 100x,
0: no difference); a draw takes n trials a row from the two laws with replacement, counts a failure at the worst
finished value of the draw's two rows (as `claims.trials` does) and reads the test's verdict at the row's level.

- power: P(HELD) at a true gap of -3 (1,000x);
- error: P(HELD) at a true gap of exactly -2, where the claim "more than 100x" is false at its boundary: the test's
  type-I error at that law (at most (1 - level) / 2 whatever the law); error_not_held: P(DID NOT HOLD) there, the
  interval's miss on the other side;
- refuted: P(DID NOT HOLD) at a true gap of 0, the claim false by two decades.

numpy is imported inside the functions, as scipy is in `stats`. Recompute the stated numbers (about 2 minutes on
one core): `python -c "from highway_repro.report import power; print(power.fig1_power())"`.
"""

from __future__ import annotations

import math
from pathlib import Path

from highway_repro.report import papers, stats
from highway_repro.report.claims import trials
from highway_repro.report.measures import Measure, Row
from highway_repro.report.runs import load_run

RUNS = Path(__file__).resolve().parents[2] / "results" / "highway_networks" / "runs" / "hn_fig1-cpu"
LOG_LOSS = Measure("train/loss", "log10 final training loss", how="log10")
THRESHOLD = -math.log10(papers.FIG1_HIGHWAY_FACTOR)  # -2: "more than 100x below"
# depth -> (trials a row, level) of its verdict: depth 100 on its 26 trials at 95 %; depth 50 at its second look,
# 100 trials a row at stats.SECOND_LOOK
DESIGN = {"50": (papers.FIG1_TRIALS, stats.SECOND_LOOK), "100": (26, stats.LEVEL)}
# name -> (true gap, the verdict counted): the docstring's definitions
COUNTED = {"power": (-3.0, stats.HELD), "error": (THRESHOLD, stats.HELD), "error_not_held": (THRESHOLD, stats.NOT_HELD),
           "refuted": (0.0, stats.NOT_HELD)}

# `fig1_power()`'s numbers: FIG1_POWER_DRAWS draws at seed FIG1_POWER_SEED; a rate p's Monte Carlo standard error is
# sqrt(p (1 - p) / FIG1_POWER_DRAWS): 0.0014 for depth 100's power, 0.0004 for depth 50's, 0.0002 for depth 100's error
FIG1_POWER_DRAWS, FIG1_POWER_SEED = 100_000, 0
FIG1_POWER = {"50": {"power": 0.01537, "error": 0.00003, "error_not_held": 0.00023, "refuted": 1.0},
              "100": {"power": 0.26442, "error": 0.00602, "error_not_held": 0.00125, "refuted": 0.12133}}


def measured_trials(depth: str, runs_dir: Path = RUNS) -> dict[str, list[float]]:
    """kind -> the log10 final training loss of every kept trial of (depth, kind), kinds highway and plain; a
    failure as inf (`claims.trials` with an infinite worst value: a draw places it at its own worst)."""
    out = {}
    for kind in ("highway", "plain"):
        runs = [load_run(p) for p in sorted(Path(runs_dir).glob(f"model.depth={depth},model.kind={kind},trial=*"))]
        out[kind] = trials(Row((depth, kind), kind, runs), LOG_LOSS, math.inf)
    if not all(out.values()):
        raise FileNotFoundError(f"no kept trials of depth {depth} under {runs_dir} "
                                f"(found: {', '.join(f'{k} {len(v)}' for k, v in out.items())})")
    return out


def verdict_rates(highway: list[float], plain: list[float], gap: float, n: int, level: float, draws: int,
                  seed: int, q: float = papers.FIG1_QUANTILE, threshold: float = THRESHOLD) -> dict[str, float]:
    """verdict -> its share of `draws` draws of `n` trials a row (HELD, DID NOT HOLD, NOT RESOLVED) of the claim
    "Q(highway) - Q(plain) < threshold" (`stats.quantile_test` at `level`), the laws the measured trials (failures
    inf) with highway's finished values shifted so that the laws' q-quantiles differ by exactly `gap`."""
    import numpy as np

    h, p = np.array(highway, dtype=float), np.array(plain, dtype=float)
    qh, qp = stats.quantile(h, q), stats.quantile(p, q)
    if not (math.isfinite(qh) and math.isfinite(qp)):
        raise ValueError(f"the {stats.pct(q)} quantile of a row's trials is a failure (highway {qh}, plain {qp}): "
                         "no finished value to shift; use a law with fewer failures or a lower quantile")
    h = h + (gap - (qh - qp))  # inf stays inf
    rng = np.random.default_rng(seed)
    counts = dict.fromkeys((stats.HELD, stats.NOT_HELD, stats.NOT_RESOLVED), 0)
    for _ in range(draws):
        xs, ys = rng.choice(h, n), rng.choice(p, n)
        both = np.concatenate([xs, ys])
        worst = both[np.isfinite(both)].max()
        xs, ys = np.where(np.isfinite(xs), xs, worst), np.where(np.isfinite(ys), ys, worst)
        ci = stats.quantile_test(xs.tolist(), q, threshold, "lower", ys.tolist(), level)["ci"]
        counts[stats.verdict(ci, "lower", threshold)] += 1
    return {v: c / draws for v, c in counts.items()}


def fig1_power(draws: int = FIG1_POWER_DRAWS, seed: int = FIG1_POWER_SEED, runs_dir: Path = RUNS,
               depths=tuple(DESIGN)) -> dict:
    """depth -> {name: rate} for the names of `COUNTED` (the docstring's definitions), at the depth's trials a row and
    level (`DESIGN`) and the laws of its kept trials: FIG1_POWER at its draws and seed."""
    out = {}
    for depth in depths:
        n, level = DESIGN[depth]
        t = measured_trials(depth, runs_dir)
        rates = {gap: verdict_rates(t["highway"], t["plain"], gap, n, level, draws, seed)
                 for gap in {gap for gap, _ in COUNTED.values()}}
        out[depth] = {name: rates[gap][v] for name, (gap, v) in COUNTED.items()}
    return out
