"""`results/claims.png`: a forest plot of every distinct comparison (the `claim` lines of results/summary.csv), one
panel per unit since the tables compare different things."""

from __future__ import annotations

import math
import re
from pathlib import Path

from highway_repro.report import stats
from highway_repro.report.claims_list import NO_CLAIM, PAPER_SCALE_ONLY, counted
from highway_repro.report.plots import pyplot, save

COLORS = {stats.HELD: "tab:green", stats.NOT_HELD: "tab:red", stats.NO_DIFFERENCE: "tab:blue",
          stats.NOT_RESOLVED: "0.55"}
UNCOUNTED = "tab:purple"  # a level claim at another scale than the paper's: its numbers, no verdict
PANELS = {"relative": "Highway Transformer: difference, % of the compared row's mean (< 0: the row is lower)",
          "log10 loss": "Highway Networks Fig. 1: log10 final training loss, highway - plain",
          "acc": "Highway Networks: test accuracy, points above the compared row or the paper's threshold",
          "loss": "Highway Networks Fig. 1: training loss vs the paper's threshold, log10(ours / threshold)"}


def _f(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _opt(x: float) -> float | None:
    return x if math.isfinite(x) else None


def placed(r: dict) -> tuple[str, float, float, float, float | None, float | None] | None:
    """(panel, x, interval low, interval high, delta, paper effect) of a claim line on its panel's scale, or None."""
    diff, lo, hi, delta, paper = (_f(r.get(k)) for k in ("diff", "ci_low", "ci_high", "delta", "paper_effect"))
    metric = r["metric"]
    if metric in ("bpc", "ppl") or metric.startswith("mean "):
        base = _f(r.get("compared_mean"))
        scale = 100.0 / base if math.isfinite(base) and base else math.nan
        return ("relative", diff * scale, lo * scale, hi * scale, _opt(delta * scale),
                _opt(100.0 * _f(r.get("paper_effect_rel"))))
    if metric == "log10 loss":
        return "log10 loss", diff, lo, hi, _opt(delta), _opt(paper)
    threshold = _f(r.get("threshold"))
    if metric == "acc":
        if math.isfinite(_f(r.get("compared_mean"))) or math.isfinite(diff):  # two rows, else a row vs a threshold
            return "acc", diff, lo, hi, _opt(delta), None
        return "acc", *(v - threshold for v in (_f(r.get("mean")), lo, hi)), None, None
    if metric == "loss" and threshold > 0:
        def orders(v):
            return math.log10(v / threshold) if v > 0 else math.nan
        return "loss", orders(_f(r.get("mean"))), orders(lo), orders(hi), None, None
    return None


def short(row: str) -> str:
    """A row by its variant names: "SDU tanh, layer 1 (tanh_l1)" -> "tanh_l1", a model prefix ("...: ") kept."""
    names = re.findall(r"\((\w+)\)", row)
    return (row.split(": ")[0] + ": " if ": " in row else "") + "+".join(names) if names else row


def label(r: dict) -> str:
    two_rows = math.isfinite(_f(r.get("compared_mean")))
    against = short(str(r.get("compared_with") or "")).split(": ")[-1]  # its model is the row's
    what = f"{short(r['row'])} vs {against}" if two_rows else short(r["row"])
    level = f", {float(r['level']) * 100:g} %" if r.get("level") and float(r["level"]) != 0.95 else ""
    kind = r.get("claim_type") or "own"
    return f"{r['table']}: {what} ({r['metric']}{'' if kind == 'own' else ', ' + kind}{level})"


def forest(rows: list[dict], path: Path) -> Path | None:
    """Draw the claim lines of `rows` (summary rows, kind `claim`) to `path`; None when there are none."""
    claims = [(r, *p) for r in rows if r["kind"] == "claim" and (p := placed(r)) is not None]
    by_panel = {}
    for r, panel, *rest in claims:
        by_panel.setdefault(panel, []).append((r, *rest))
    groups = {k: by_panel[k] for k in PANELS if k in by_panel}
    if not groups:
        return None
    plt = pyplot()
    from matplotlib.patches import Patch

    heights = [len(v) + 2 for v in groups.values()]
    height = 0.22 * sum(heights) + 1.2
    fig, axes = plt.subplots(len(groups), 1, figsize=(12, height),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (panel, lines) in zip(axes[:, 0], groups.items()):
        for y, (r, x, lo, hi, delta, paper) in enumerate(reversed(lines)):
            color = COLORS.get(r["verdict"], "0.55") if counted(r) else UNCOUNTED
            if delta:
                ax.fill_betweenx([y - 0.35, y + 0.35], -delta, delta, color="tab:blue", alpha=0.12, lw=0)
            if math.isfinite(lo) and math.isfinite(hi):
                ax.plot([lo, hi], [y, y], color=color, lw=1.6)
            if math.isfinite(x):
                ax.plot([x], [y], "o", color=color, ms=4)
            else:
                ax.text(0, y, "  no finished runs on a side", fontsize=6, va="center", color="0.4")
            if paper is not None:
                ax.plot([paper], [y], "D", mfc="none", mec="black", ms=4.5)
        ax.axvline(0, color="black", lw=0.7)
        ax.set_yticks(range(len(lines)))
        ax.set_yticklabels([label(r) for r, *_ in reversed(lines)], fontsize=6)
        ax.set_ylim(-0.8, len(lines) - 0.2)
        ax.set_title(PANELS[panel], fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="x", alpha=0.3)
    handles = [plt.Line2D([], [], color=c, marker="o", lw=1.6, label=v) for v, c in
               (*COLORS.items(), (f"{PAPER_SCALE_ONLY} or {NO_CLAIM} (no verdict)", UNCOUNTED))]
    handles += [plt.Line2D([], [], color="black", marker="D", mfc="none", lw=0, label="the paper's effect"),
                Patch(color="tab:blue", alpha=0.12, label="+-delta (equivalence margin)")]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=7, frameon=False)
    fig.subplots_adjust(left=0.42, right=0.98, top=1 - 0.6 / height, bottom=0.3 / height,
                        hspace=3.0 * len(groups) / sum(heights))
    return save(fig, path)
