"""The Highway Networks tables and figures (Srivastava et al., 2015) as `TableSpec`s: Fig. 1 (depth sweep),
Table 1 (MNIST), Tables 2/3 (CIFAR-10), Figs. 2-4 (gate analyses) and the demo. Rows come from `model.depth`,
`model.width`, `model.kind` (trials and seeds are the runs of a row); paper numbers from `papers.py`.
"""

from __future__ import annotations

import math

from highway_repro.report import papers
from highway_repro.report.plots import Panel, curve_panel, plot
from highway_repro.report.spec import (Claim, Measure, TableSpec, best, best_key, count, mean_curve, params, paper,
                                       stat, top_mean)

# ------------------------------------------------------------------ measures shared by the tables
TEST_ACC = Measure("test/acc", "test accuracy %", scale=100.0, digits=2, lower_is_better=False)
TRAIN_LOSS = Measure("train/loss", "final training loss", digits=4)


def _fig1_figure(t, path):
    depths = sorted({row.id[0] for row in t.rows}, key=float)
    kinds = [k for k in ("plain", "highway", "residual") if any(row.id[1] == k for row in t.rows)]
    colors = {"plain": "tab:red", "highway": "tab:blue", "residual": "tab:green"}
    best_panels, top_panels = [], []
    for d in depths:
        bp = Panel(f"depth {d}: best", {}, logy=True)
        tp = Panel(f"depth {d}: mean of top {papers.FIG1_TOP_K}", {}, logy=True)
        for k in kinds:
            row = t.by_id.get((d, k))
            ranked = row.ranked(TRAIN_LOSS) if row else []
            if not ranked:
                continue
            hist = ranked[0][1].history_values("train/loss", only_training=True)  # running means, as logged
            if hist:
                bp.series[k] = tuple(map(list, zip(*hist)))
            tp.series[k] = mean_curve([r for _, r in ranked[:papers.FIG1_TOP_K]], "train/loss", only_training=True)
            bp.colors[k] = tp.colors[k] = colors[k]
        best_panels.append(bp)
        top_panels.append(tp)
    best_panels[0].ylabel = "training loss (running mean)"
    plot(path, best_panels + top_panels, ncols=len(depths), panel_size=(3.2, 3.0))


def _fig1_claims(by_id) -> list[Claim]:
    """Fig. 1 as the paper states it, for both of its statistics (the best trial, the mean of the top 10): at depths
    50 and 100 highway ends more than FIG1_HIGHWAY_FACTOR below plain (log10 final training loss); plain nets of 10
    and 20 layers reach FIG1_PLAIN_BELOW. Ours: both kinds train at depth 10."""
    log_loss = Measure("train/loss", "log10 final training loss", how="log10", digits=3)
    factor = papers.FIG1_HIGHWAY_FACTOR
    out = [Claim(f"is more than {factor:g}x lower than plain ({'best trial' if pick == 'best' else 'top-10 mean'})",
                 (d, "highway"), log_loss, "lower", (d, "plain"), threshold=-math.log10(factor), pick=pick,
                 top_k=papers.FIG1_TOP_K, trials=papers.FIG1_TRIALS) for d in ("50", "100") for pick in ("best", "top")]
    out += [Claim(f"reaches a training loss below {papers.FIG1_PLAIN_BELOW:g} "
                  f"({'best trial' if pick == 'best' else 'top-10 mean'})", (d, "plain"), TRAIN_LOSS, "lower",
                  papers.FIG1_PLAIN_BELOW, pick=pick, top_k=papers.FIG1_TOP_K) for d in ("10", "20")
            for pick in ("best", "top")]
    out += [Claim(f"trains (best final training loss < {papers.FIG1_TRAINS_BELOW}, a tenth of the initial ln 10)",
                  ("10", k), TRAIN_LOSS, "lower", papers.FIG1_TRAINS_BELOW, pick="best") for k in ("plain", "highway")]
    return out


HN_FIG1 = TableSpec(
    "Highway Networks, Fig. 1: FC depth sweep on MNIST (training loss)",
    keys=("model.depth", "model.kind"), order={"model.kind": ("plain", "highway", "residual")},
    columns=(count(trials=True), best(TRAIN_LOSS, "best final training loss", sci=True),
             *top_mean(TRAIN_LOSS, papers.FIG1_TOP_K, "mean of top-k", sci=True),
             best_key(TRAIN_LOSS, "trial", "best trial")),
    primary=TRAIN_LOSS, primary_pick="best", claims=_fig1_claims, floors=tuple(papers.FLOORS["hn_fig1"]),
    measures={"train/loss": TRAIN_LOSS},
    notes="Final training loss = cross-entropy of the final weights on all 60,000 training images; top-k = the "
          f"k <= {papers.FIG1_TOP_K} best finished trials. The claims test the paper's two statistics, the best trial "
          f"and the mean of the top {papers.FIG1_TOP_K}, on all trials of a (depth, kind): a trial that diverged "
          "counts as a failure at the worst final loss a trial of the compared rows reached, never dropped; the "
          "95 % interval is a percentile bootstrap over the trials (the statistic on resamples of each row's "
          "trials). Depth 50's highway vs plain is read at its second look: the paper's 100 trials a row (trials "
          "26-99 added to plain and highway), a 99 % interval; a row's cells count all of its trials (the trials "
          "column). The plain nets' 'below 1e-4' stands beside our cpu floor (best trial <= 1e-2). "
          "Paper: 100 random-search runs per (depth, kind), budget unpublished; "
          f"{papers.FIG1_PAPER}. Residual nets were not in the paper.",
    figure=_fig1_figure)


def _paper_accuracy(table, field):
    """A cell with the paper's accuracy of a row of `table` (papers.HN_TABLE1 / HN_CIFAR): `best`, or `mean_std`."""
    def value(row_id):
        p = table.rows.get(row_id)
        if p is None:
            return None
        return f"{p['mean']:.2f} ± {p['std']:.2f}" if field == "mean_std" else f"{p[field]:.2f}"

    return value


HN_TABLE1 = TableSpec(
    "Highway Networks, Table 1: 10-layer conv net on MNIST",
    keys=("model.width", "model.kind"),
    columns=(params(), count(), stat(TEST_ACC, "test accuracy % (ours, mean ± std)"), best(TEST_ACC),
             paper("paper best", _paper_accuracy(papers.HN_TABLE1, "best"), "paper_best"),
             paper("paper mean ± std", _paper_accuracy(papers.HN_TABLE1, "mean_std"), "paper_mean_std")),
    primary=TEST_ACC,
    claims=tuple(Claim(f"reaches the paper's accuracy ({TEST_ACC.label} >= paper mean - {papers.TABLE1_CLAIM_STDS:g} "
                       f"paper std = {papers.table1_threshold(p):.2f})", row, TEST_ACC, "higher",
                       papers.table1_threshold(p), paper_value=p["mean"],
                       paper_note=f"; paper {p['mean']} ± {p['std']}")
                 for row, p in papers.HN_TABLE1.rows.items()),
    floors=tuple(papers.FLOORS["hn_table1"]), measures={"test/acc": TEST_ACC},
    paper=papers.HN_TABLE1, paper_of=lambda row_id, split: (papers.HN_TABLE1.rows.get(row_id) or {}).get("mean"))


HN_CIFAR = TableSpec(
    "Highway Networks, Tables 2/3: 19-layer conv net on CIFAR-10",
    keys=("model.kind",), order={"model.kind": ("highway", "plain")},
    columns=(params(), count(), stat(TEST_ACC, "test accuracy % (ours)"),
             paper("paper best", _paper_accuracy(papers.HN_CIFAR, "best"), "paper_best"),
             paper("paper mean ± std", _paper_accuracy(papers.HN_CIFAR, "mean_std"), "paper_mean_std")),
    primary=TEST_ACC,
    claims=(Claim(f"reaches about the paper's accuracy ({TEST_ACC.label} >= {papers.CIFAR_CLAIM_AT_LEAST})",
                  ("highway",), TEST_ACC, "higher", papers.CIFAR_CLAIM_AT_LEAST,
                  paper_value=papers.HN_CIFAR.rows[("highway",)]["mean"]),
            Claim("is ahead of the plain net of equal depth", ("highway",), TEST_ACC, "higher", ("plain",))),
    floors=tuple(papers.FLOORS["hn_cifar"]), measures={"test/acc": TEST_ACC},
    paper=papers.HN_CIFAR, paper_of=lambda row_id, split: (papers.HN_CIFAR.rows.get(row_id) or {}).get("mean"),
    notes="Data: at `cpu` scale the offline mirror's CIFAR-10 subset (data_batch_1 only: 10,000 training images, "
          "JPEG'd once) and the full 10,000-image test batch, so accuracies are comparable in trend only. "
          "CIFAR-100 (`data=cifar100`) needs the public download.")

HN_ANALYSIS = TableSpec(
    "Highway Networks, Figs. 2-4: gate analyses of a trained FC highway net on MNIST",
    keys=("model.kind",), columns=(params(), count(), stat(TRAIN_LOSS), stat(TEST_ACC)),
    primary=TEST_ACC, floors=tuple(papers.FLOORS["hn_analysis"]), measures={"test/acc": TEST_ACC})

DEMO = TableSpec(
    "Demo: plain vs highway MLP on MNIST",
    keys=("model.depth", "model.kind"),
    columns=(params(), count(), stat(TRAIN_LOSS), stat(TEST_ACC)),
    primary=TRAIN_LOSS,
    notes="Training loss = running mean of the last log interval (50 steps).",
    figure=lambda t, path: plot(path, [curve_panel(t.rows, "train/loss", "MLP on MNIST: training loss",
                                                    "train/loss", logy=True)]))
