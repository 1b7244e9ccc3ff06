"""The Highway Networks tables (Srivastava et al., 2015): Fig. 1 (depth sweep), Table 1 (MNIST), Tables 2/3
(CIFAR-10), Figs. 2-4 (gate analyses) and the demo; a row's trials or seeds are its runs."""

from __future__ import annotations

import math

from highway_repro.report import papers, power, stats
from highway_repro.report.plots import Panel, curve_panel, plot
from highway_repro.report.prose import prose
from highway_repro.report.claims import Claim, trials
from highway_repro.report.measures import (Column, Measure, best, best_key, count, mean_curve, num, params, paper, stat,
                                           top_mean)
from highway_repro.report.spec import TableSpec

TEST_ACC = Measure("test/acc", "test accuracy %", scale=100.0, digits=2, lower_is_better=False)
TRAIN_LOSS = Measure("train/loss", "final training loss", digits=4)


def _best_of_k_band(xs: list[float]) -> tuple[list, list]:
    """The expected best of k trials' 95 % band over 1,000 bootstrap resamples of the trials (descriptive)."""
    import numpy as np

    w = np.array(stats.best_of_k_weights(len(xs)))
    curves = np.sort(np.random.default_rng(0).choice(xs, (1000, len(xs))), axis=1) @ w.T
    lo, hi = np.percentile(curves, [2.5, 97.5], axis=0)
    return lo.tolist(), hi.tolist()


def _fig1_figure(t, path):
    """Per depth: the best trial's training curve, the mean curve of the top k, and the expected best final training
    loss of k trials (Dodge et al. 2019), its band the 95 % of 1,000 bootstrap resamples of the trials (descriptive,
    not a test)."""
    depths, common = sorted({row.id[0] for row in t.rows}, key=float), _common_k(t)
    colors = {"plain": "tab:red", "highway": "tab:blue", "residual": "tab:green"}
    best = [Panel(f"depth {d}: best", {}, logy=True, colors=colors) for d in depths]
    top = [Panel(f"depth {d}: mean of top {papers.FIG1_TOP_K}", {}, logy=True, colors=colors) for d in depths]
    expected = [Panel(f"depth {d}: expected best of k trials", {}, logy=True, colors=colors, xlabel="trials k")
                for d in depths]
    for d, bp, tp, ep in zip(depths, best, top, expected):
        for k, xs in _depth_trials(t, d).items():
            ranked = t.by_id[(d, k)].ranked(TRAIN_LOSS)
            if ranked:
                hist = ranked[0][1].history_values("train/loss", only_training=True)  # running means, as logged
                if hist:
                    bp.series[k] = tuple(map(list, zip(*hist)))
                tp.series[k] = mean_curve([r for _, r in ranked[:papers.FIG1_TOP_K]], "train/loss", only_training=True)
            if xs:
                ks = list(range(1, len(xs) + 1))
                ep.series[k] = (ks, stats.expected_best(xs))
                ep.bands[k] = (ks, *_best_of_k_band(xs))
        if any(len(xs) > common for xs, _ in ep.series.values()):
            ep.vlines[common] = f"k = {common}, the common k"
    best[0].ylabel = "training loss (running mean)"
    expected[0].ylabel = "final training loss\n(band: bootstrap, descriptive)"
    plot(path, best + top + expected, ncols=len(depths), panel_size=(3.2, 3.0))


def _depth_trials(t, depth: str) -> dict:
    """kind -> the final training loss of each trial at `depth`, a failure at the worst that depth reached."""
    rows = [row for row in t.rows if row.id[0] == depth]
    finished = [v for row in rows for v in row.values(TRAIN_LOSS)]
    return {row.id[1]: trials(row, TRAIN_LOSS, max(finished)) for row in rows} if finished else {}


def _common_k(t) -> int:
    """The trials every row has: the k at which rows of different depths compare."""
    return min((sum(r.status != "missing" for r in row.runs) for row in t.rows), default=0)


def expected_best_at_common_k() -> Column:
    """The expected best final training loss at the common k, so that depths with more trials compare at equal k."""
    def value(row, t):
        k, xs = _common_k(t), _depth_trials(t, row.id[0]).get(row.id[1])
        return stats.expected_best(xs)[k - 1] if xs and k else math.nan

    return Column("expected best of k trials (common k)",
                  lambda row, t: f"{num(value(row, t), TRAIN_LOSS.digits, sci=True)} (k {_common_k(t)})",
                  lambda row, t: {"expected_best_common_k": value(row, t), "common_k": _common_k(t)})


FIG1_TEST = prose("fig1 test", quantile=stats.pct(papers.FIG1_QUANTILE), draws=f"{power.FIG1_POWER_DRAWS:,}",
                  seed=power.FIG1_POWER_SEED,  # each rate to two significant figures: 0.26442 -> "26 %"
                  **{f"{name}_{d}": f"{float(f'{power.FIG1_POWER[d][name] * 100:.2g}'):g} %" for d in ("50", "100")
                     for name in ("error", "error_not_held", "power", "refuted")})


def _fig1_claims(by_id) -> list[Claim]:
    """Fig. 1's claims, each on the FIG1_QUANTILE-quantile of a (depth, kind)'s trials, not the paper's best trial
    (FIG1_TEST says why); ours: both kinds train at depth 10."""
    q, factor = papers.FIG1_QUANTILE, papers.FIG1_HIGHWAY_FACTOR
    of = f"at the {stats.pct(q)} quantile of the trials"
    log_loss = Measure("train/loss", "log10 final training loss", how="log10", digits=3)
    out = [Claim(f"is more than {factor:g}x lower than plain {of}", (d, "highway"), log_loss, "lower", (d, "plain"),
                 threshold=-math.log10(factor), pick="quantile", q=q) for d in ("50", "100")]
    out += [Claim(f"reaches a training loss below {papers.FIG1_PLAIN_BELOW:g} {of}", (d, "plain"), TRAIN_LOSS, "lower",
                  papers.FIG1_PLAIN_BELOW, pick="quantile", q=q) for d in ("10", "20")]
    out += [Claim(f"trains (final training loss < {papers.FIG1_TRAINS_BELOW}, a tenth of the initial ln 10, {of})",
                  ("10", k), TRAIN_LOSS, "lower", papers.FIG1_TRAINS_BELOW, pick="quantile", q=q)
            for k in ("plain", "highway")]
    return out


HN_FIG1 = TableSpec(
    "Highway Networks, Fig. 1: FC depth sweep on MNIST (training loss)",
    keys=("model.depth", "model.kind"), order={"model.kind": ("plain", "highway", "residual")},
    columns=(count(trials=True), best(TRAIN_LOSS, "best final training loss", sci=True),
             *top_mean(TRAIN_LOSS, papers.FIG1_TOP_K, "mean of top-k", sci=True), expected_best_at_common_k(),
             best_key(TRAIN_LOSS, "trial", "best trial")),
    primary=TRAIN_LOSS, primary_pick="best", claims=_fig1_claims,
    notes=prose("fig1 notes", top_k=papers.FIG1_TOP_K, test=FIG1_TEST, trials=papers.FIG1_TRIALS,
                paper=papers.FIG1_PAPER),
    figure=_fig1_figure)


def _paper_accuracy(table: papers.PaperTable) -> tuple[Column, Column]:
    """The paper's best and mean ± std accuracy of each row of `table`."""
    def cell(fmt):
        return lambda row_id: fmt(table.rows[row_id]) if row_id in table.rows else None

    return (paper("paper best", cell(lambda p: f"{p['best']:.2f}"), "paper_best"),
            paper("paper mean ± std", cell(lambda p: f"{p['mean']:.2f} ± {p['std']:.2f}"), "paper_mean_std"))


HN_TABLE1 = TableSpec(
    "Highway Networks, Table 1: 10-layer conv net on MNIST",
    keys=("model.width", "model.kind"),
    columns=(params(), count(), stat(TEST_ACC, "test accuracy % (ours, mean ± std)"), best(TEST_ACC),
             *_paper_accuracy(papers.HN_TABLE1)),
    primary=TEST_ACC,
    claims=tuple(Claim(f"reaches the paper's accuracy ({TEST_ACC.label} >= paper mean - {papers.TABLE1_CLAIM_STDS:g} "
                       f"paper std = {papers.table1_threshold(p):.2f})", row, TEST_ACC, "higher",
                       papers.table1_threshold(p), paper_value=p["mean"],
                       paper_note=f"; paper {p['mean']} ± {p['std']}")
                 for row, p in papers.HN_TABLE1.rows.items()),
    paper=papers.HN_TABLE1, paper_of=lambda row_id, split: (papers.HN_TABLE1.rows.get(row_id) or {}).get("mean"))


HN_CIFAR = TableSpec(
    "Highway Networks, Tables 2/3: 19-layer conv net on CIFAR-10",
    keys=("model.kind",), order={"model.kind": ("highway", "plain")},
    columns=(params(), count(), stat(TEST_ACC, "test accuracy % (ours)"), *_paper_accuracy(papers.HN_CIFAR)),
    primary=TEST_ACC,
    claims=(Claim(f"reaches about the paper's accuracy ({TEST_ACC.label} >= {papers.CIFAR_CLAIM_AT_LEAST})",
                  ("highway",), TEST_ACC, "higher", papers.CIFAR_CLAIM_AT_LEAST,
                  paper_value=papers.HN_CIFAR.rows[("highway",)]["mean"]),
            Claim("is ahead of the plain net of equal depth", ("highway",), TEST_ACC, "higher", ("plain",))),
    paper=papers.HN_CIFAR, paper_of=lambda row_id, split: (papers.HN_CIFAR.rows.get(row_id) or {}).get("mean"),
    notes=prose("cifar notes"))

HN_ANALYSIS = TableSpec(
    "Highway Networks, Figs. 2-4: gate analyses of a trained FC highway net on MNIST",
    keys=("model.kind",), columns=(params(), count(), stat(TRAIN_LOSS), stat(TEST_ACC)),
    primary=TEST_ACC)

DEMO = TableSpec(
    "Demo: plain vs highway MLP on MNIST",
    keys=("model.depth", "model.kind"),
    columns=(params(), count(), stat(TRAIN_LOSS), stat(TEST_ACC)),
    primary=TRAIN_LOSS,
    notes="Training loss = running mean of the last log interval (50 steps).",
    figure=lambda t, path: plot(path, [curve_panel(t.rows, "train/loss", "MLP on MNIST: training loss", logy=True)]))
