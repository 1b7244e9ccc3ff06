"""The columns of a table: small named constructors (`stat`, `best`, `paper`, `rel_change`, ...) over `Measure`s,
each a Markdown cell and CSV values per row; and the mean learning curve of a row (`mean_curve`, `reach_steps`)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

from highway_repro.report import stats
from highway_repro.report.measures import NA, Measure, Row, mean_pm, num, pct
from highway_repro.report.runs import Run


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable  # (row, table) -> markdown cell
    csv: Callable = None  # (row, table) -> {csv column: value}


def params() -> Column:
    m = Measure("model/params", "params")

    def value(row, t):
        vals = row.values(m)
        return int(vals[0]) if vals else None

    return Column("params", lambda row, t: f"{value(row, t):,}" if value(row, t) is not None else NA,
                  lambda row, t: {"params": value(row, t)})


def _not_done(row: Row) -> str:
    """` (1 failed, 1 damaged)`: the row's runs that did not finish, those whose metrics.json cannot be parsed apart
    (as the header counts them)."""
    damaged = len(row.damaged)
    failed = len(row.failed) - damaged
    parts = [f"{failed} failed"] * bool(failed) + [f"{damaged} damaged"] * bool(damaged)
    return f" ({', '.join(parts)})" if parts else ""


def count(trials: bool = False) -> Column:
    """n finished runs (trials: "done/failed")."""
    if trials:
        return Column("trials (done/failed)", lambda row, t: f"{len(row.done)}/{len(row.failed)}",
                      lambda row, t: {"n": len(row.done), "n_failed": len(row.failed)})
    return Column("n", lambda row, t: str(len(row.done)) + _not_done(row),
                  lambda row, t: {"n": len(row.done), "n_failed": len(row.failed)})


def stat(m: Measure | Callable, header: str | None = None, name: str | None = None) -> Column:
    """mean ± std over the row's finished runs (the mean alone for one run). `m` may pick a measure per row."""
    pick = m if not isinstance(m, Measure) else (lambda row, t: m)

    def cell(row, t):
        mm = pick(row, t)
        if not row.done and row.failed:
            return "failed: " + "; ".join(f"{r.path.name}: {r.error}" for r in row.failed).replace("|", "/")
        return mean_pm(row.values(mm), mm.digits)

    def out(row, t):
        mm = pick(row, t)
        mean, std = stats.mean_std(row.values(mm))
        return {f"{name or mm.name}_mean": mean, f"{name or mm.name}_std": std}

    return Column(header or m.label, cell, out)


def best(m: Measure, header: str = "best", sci: bool = False) -> Column:
    def value(row):
        r = row.ranked(m)
        return r[0][0] if r else math.nan

    return Column(header, lambda row, t: num(value(row), m.digits, sci), lambda row, t: {f"{m.name}_best": value(row)})


def top_mean(m: Measure, k: int, header: str, sci: bool = False) -> list[Column]:
    """Mean of the k best runs, and the k used."""
    def vals(row):
        return [v for v, _ in row.ranked(m)[:k]]

    return [Column(header, lambda row, t: num(statistics.fmean(vals(row)) if vals(row) else math.nan, m.digits, sci),
                   lambda row, t: {f"{m.name}_top_mean": statistics.fmean(vals(row)) if vals(row) else math.nan}),
            Column("k", lambda row, t: str(len(vals(row))), lambda row, t: {"k": len(vals(row))})]


def best_key(m: Measure, key: str, header: str) -> Column:
    """The config value `key` of the row's best run (a random search: which trial won)."""
    def value(row):
        r = row.ranked(m)
        return str(r[0][1].get(key, "")) if r else ""

    return Column(header, lambda row, t: value(row), lambda row, t: {f"best_{key}": value(row)})


def rel_change(m: Measure | Callable, header: str, name: str) -> Column:
    """Relative change of the row's mean against the baseline row (negative = lower)."""
    pick = m if not isinstance(m, Measure) else (lambda row, t: m)

    def value(row, t):
        base = t.baseline_row
        if base is None or row is base:
            return NA
        mm = pick(row, t)
        return pct(row.mean(mm), base.mean(mm)) + (f" ({mm.split})" if mm.split != pick(base, t).split else "")

    return Column(header, value, lambda row, t: {name: value(row, t)})


def ratio_to_baseline(m: Measure, header: str) -> Column:
    """The row's time per step relative to the baseline's: baseline mean / row mean of a rate (higher is better,
    `m.lower_is_better` False), row mean / baseline mean of a time per step."""
    def value(row, t):
        base = t.baseline_row
        if base is None:
            return math.nan
        a, b = row.mean(m), base.mean(m)
        if m.lower_is_better:
            a, b = b, a
        return b / a if math.isfinite(a) and math.isfinite(b) and a > 0 else math.nan

    return Column(header, lambda row, t: f"{value(row, t):.2f}x" if math.isfinite(value(row, t)) else NA,
                  lambda row, t: {m.name: row.mean(m), f"{m.name}_row_time_over_baseline": value(row, t)})


def paper(header: str, value: Callable, name: str) -> Column:
    """A paper number for the row: `value(row_id) -> str or number or None` (from papers.py)."""
    def cell(row, t):
        v = value(row.id)
        return NA if v is None else str(v)

    return Column(header, cell, lambda row, t: {name: value(row.id)})


def steps_to_reach(curve: Measure, header: str) -> Column:
    def cell(row, t):
        if t.baseline_row is None or row is t.baseline_row:
            return NA
        return reach_steps(row, t.baseline_row, curve)[0]

    return Column(header, cell, lambda row, t: {"steps_to_baseline_last_eval": cell(row, t)})


def mean_curve(runs: list[Run], key: str, only_training: bool = False) -> tuple[list, list]:
    """(steps, mean of `key` over the runs at each step), from each run's learning curve (`Run.curve`)."""
    by_step: dict[int, list[float]] = {}
    for r in runs:
        for step, v in r.curve(key, only_training):
            by_step.setdefault(step, []).append(v)
    steps = sorted(by_step)
    return steps, [statistics.fmean(by_step[s]) for s in steps]


def reach_steps(row: Row, base: Row, curve: Measure) -> tuple[str, float]:
    """First step at which the row's mean `curve` (over seeds) reaches the last point of the baseline's mean curve
    (its last evaluation on the same data, not a final pass over more of it): ("1200", goal) or
    ("not reached", goal)."""
    _, base_ys = mean_curve(base.done, curve.key)
    goal = base_ys[-1] if base_ys else math.nan
    steps, ys = mean_curve(row.done, curve.key)
    if not math.isfinite(goal) or not steps:
        return NA, goal
    for s, y in zip(steps, ys):
        if (y <= goal) if curve.lower_is_better else (y >= goal):
            return str(s), goal
    return "not reached", goal
