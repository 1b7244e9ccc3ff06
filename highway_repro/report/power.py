"""The power of Fig. 1's claim "highway is more than 100x below plain" (Srivastava et al. 2015) as the table tests it
(`stats.quantile_test` on the 20 % quantile of log10 final training loss), simulated at the kept runs' trials.

Each row's law is its measured trials (a failure stays a failure), highway's finished values shifted on log10 so that
its 20 % quantile lies `gap` from plain's; a draw takes n trials a row with replacement and counts a failure at the
draw's worst finished value (as `claims.trials` does). power: P(HELD) at a gap of -3 (1,000x); error: P(HELD) at
exactly -2, the claim false at its boundary (at most (1 - level) / 2 whatever the law), error_not_held: P(DID NOT HOLD)
there; refuted: P(DID NOT HOLD) at a gap of 0. Recompute (about 2 minutes on one core):
`python -c "from highway_repro.report import power; print(power.fig1_power())"`.
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
DESIGN = {"50": (papers.FIG1_TRIALS, stats.SECOND_LOOK), "100": (26, stats.LEVEL)}  # depth -> (trials a row, level)
COUNTED = {"power": (-3.0, stats.HELD), "error": (THRESHOLD, stats.HELD), "error_not_held": (THRESHOLD, stats.NOT_HELD),
           "refuted": (0.0, stats.NOT_HELD)}  # name -> (true gap, the verdict counted)

# a rate p's Monte Carlo standard error is sqrt(p (1 - p) / FIG1_POWER_DRAWS): 0.0014 for depth 100's power
FIG1_POWER_DRAWS, FIG1_POWER_SEED = 100_000, 0
FIG1_POWER = {"50": {"power": 0.01537, "error": 0.00003, "error_not_held": 0.00023, "refuted": 1.0},
              "100": {"power": 0.26442, "error": 0.00602, "error_not_held": 0.00125, "refuted": 0.12133}}


def measured_trials(depth: str, runs_dir: Path = RUNS) -> dict[str, list[float]]:
    """kind -> the log10 final training loss of each kept trial of (depth, kind); a failure as inf."""
    out = {}
    for kind in ("highway", "plain"):
        runs = [load_run(p) for p in sorted(Path(runs_dir).glob(f"model.depth={depth},model.kind={kind},trial=*"))]
        out[kind] = trials(Row((depth, kind), kind, runs), LOG_LOSS, math.inf)
    if not all(out.values()):
        raise FileNotFoundError(f"no kept trials of depth {depth} under {runs_dir} "
                                f"(found: {', '.join(f'{k} {len(v)}' for k, v in out.items())})")
    return out


def verdict_rates(highway: list[float], plain: list[float], gap: float, n: int, level: float, draws: int,
                  seed: int) -> dict[str, float]:
    """verdict -> its share of `draws` draws of `n` trials a row, highway shifted so the quantiles differ by `gap`."""
    import numpy as np  # inside the function, as scipy is in `stats`

    q = papers.FIG1_QUANTILE
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
        ci = stats.quantile_test(xs.tolist(), q, THRESHOLD, "lower", ys.tolist(), level)["ci"]
        counts[stats.verdict(ci, "lower", THRESHOLD)] += 1
    return {v: c / draws for v, c in counts.items()}


def fig1_power(draws: int = FIG1_POWER_DRAWS, seed: int = FIG1_POWER_SEED, runs_dir: Path = RUNS,
               depths=tuple(DESIGN)) -> dict:
    """depth -> {name: rate} for the names of `COUNTED` at the depth's `DESIGN`: FIG1_POWER at its draws and seed."""
    out = {}
    for depth in depths:
        n, level = DESIGN[depth]
        t = measured_trials(depth, runs_dir)
        rates = {gap: verdict_rates(t["highway"], t["plain"], gap, n, level, draws, seed)
                 for gap in {gap for gap, _ in COUNTED.values()}}
        out[depth] = {name: rates[gap][v] for name, (gap, v) in COUNTED.items()}
    return out
