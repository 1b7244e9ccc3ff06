"""Curves in one or more panels, to a PNG (`plot`); `pyplot` and `save` for figures drawn by hand. A curve that is a
mean over seeds has a band: the 95 % t-interval of that mean, where at least two seeds have a value."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

from highway_repro import files
from highway_repro.report.measures import mean_curve
from highway_repro.report.stats import mean_interval

T_BAND = "band: 95 % t-interval of the mean over seeds"


@dataclass
class Panel:
    title: str
    series: dict  # label -> (steps, values)
    ylabel: str = ""
    logy: bool = False
    dashed: bool = False  # reference curves (another source): dashed, with markers
    colors: dict = field(default_factory=dict)  # label -> colour, to match series across panels
    xlabel: str = "step"
    styles: dict = field(default_factory=dict)  # label -> extra matplotlib line style, e.g. {"marker": "o"}
    bands: dict = field(default_factory=dict)  # label -> (xs, low, high): a shaded band in the series' colour
    vlines: dict = field(default_factory=dict)  # x -> legend text: a dotted vertical line
    band_label: str = ""  # what the bands are, in the legend


def pyplot():
    """matplotlib's pyplot on the Agg backend (files, no display), imported when a figure is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path) -> Path:
    """Save `fig` to `path` at 110 dpi and close it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    pyplot().close(fig)
    return files.write_atomic(Path(path), buf.getvalue())


def plot(path, panels: list[Panel], ncols: int | None = None, panel_size=(7.0, 4.5)) -> Path:
    """Draw `panels` on a grid of `ncols` columns (default: all in one row) and save to `path`."""
    plt = pyplot()
    ncols = ncols or len(panels)
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(panel_size[0] * ncols, panel_size[1] * nrows), squeeze=False)
    for ax, p in zip(axes.flat, panels):
        drawn = {}  # label -> the colour its line was drawn in
        for label, (xs, ys) in p.series.items():
            style = {"ls": "--", "marker": "o", "ms": 3, "alpha": 0.7} if p.dashed else {"lw": 1.5}
            style |= p.styles.get(label, {})
            drawn[label] = ax.plot(xs, ys, label=label, color=p.colors.get(label), **style)[0].get_color()
        for label, (xs, lo, hi) in p.bands.items():
            ax.fill_between(xs, lo, hi, color=p.colors.get(label) or drawn.get(label), alpha=0.2, lw=0)
        if p.bands and p.band_label:
            ax.fill_between([], [], [], color="0.5", alpha=0.2, lw=0, label=p.band_label)
        for x, text in p.vlines.items():
            ax.axvline(x, color="0.4", ls=":", lw=1, label=text)
        ax.set_xlabel(p.xlabel)
        ax.set_ylabel(p.ylabel)
        if p.logy:
            ax.set_yscale("log")
        ax.set_title(p.title, fontsize=9)
        ax.grid(alpha=0.3)
        if p.series:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    return save(fig, path)


def t_band(xs: list, samples: list[list[float]]) -> tuple[list, list, list] | None:
    """(xs, low, high): the 95 % t-interval of the mean of each x's sample, at the xs with two values or more."""
    ends = [(x, ci) for x, sample in zip(xs, samples) if (ci := mean_interval(sample))]
    return ([x for x, _ in ends], [ci[0] for _, ci in ends], [ci[1] for _, ci in ends]) if ends else None


def curve_panel(rows, key: str, title: str, logy=False) -> Panel:
    """One panel: each row's mean curve of `key` (its y label) over its finished runs, with its band."""
    series, bands = {}, {}
    for row in rows:
        xs, ys = mean_curve(row.done, key)
        if xs:
            label = row.label or "run"
            series[label] = (xs, ys)
            curves = [dict(r.curve(key)) for r in row.done]
            bands[label] = t_band(xs, [[c[x] for c in curves if x in c] for x in xs])
    return Panel(title, series, key, logy=logy, bands={k: b for k, b in bands.items() if b}, band_label=T_BAND)
