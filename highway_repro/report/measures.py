"""What a table counts and shows: `Measure` (one number per run), `Row` (the runs of one row), the number formats,
the columns (a Markdown cell and CSV values per row) and a row's mean learning curve."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

from highway_repro.report import stats
from highway_repro.report.runs import Run

NA = "—"


def num(x, digits: int = 4, sci: bool = False) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return NA
    return f"{x:.{digits - 1}e}" if sci else f"{x:.{digits}f}"


def mean_pm(values: list[float], digits: int = 4, sci: bool = False) -> str:
    if not values:
        return NA
    m, s = stats.mean_std(values)
    return f"{num(m, digits, sci)} ± {num(s, digits, sci)}" if len(values) > 1 else num(m, digits, sci)


def pct(a: float, b: float) -> str:
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)) or b == 0:
        return NA
    return f"{100 * (a - b) / b:+.1f}%"


def interval(ci, level: float = stats.LEVEL) -> str:
    return "no interval (n < 2 on a side)" if ci is None else f"{stats.pct(level)} CI [{ci[0]:.4g}, {ci[1]:.4g}]"


@dataclass(frozen=True)
class Measure:
    """One number per run."""
    key: str  # a metrics.json key; for how="auc" / "rate" a metrics.jsonl key
    label: str  # as the table shows it: "test bpc"
    # final | log10 | auc (mean over the learning curve) | rate (mean over training logs but the first) | at (`step`'s)
    how: str = "final"
    scale: float = 1.0  # 100: a fraction shown in %
    digits: int = 4
    lower_is_better: bool = True
    step: int | None = None  # how="at": the step whose logged value is the run's number (metrics.jsonl)

    def __call__(self, run: Run) -> float:
        if self.how == "final":
            v = run.metric(self.key)
        elif self.how == "log10":
            v = run.metric(self.key)
            v = math.log10(v) if v > 0 else math.nan
        elif self.how == "at":
            v = dict(run.history_values(self.key)).get(self.step, math.nan)
        elif self.how == "auc":
            vals = [x for _, x in run.curve(self.key)]
            v = statistics.fmean(vals) if vals else math.nan
        elif self.how == "rate":  # the first interval includes start-up costs: left out where there are more
            vals = [x for _, x in run.history_values(self.key)]
            v = statistics.fmean(vals[1:] or vals) if vals else math.nan
        else:
            raise ValueError(f"Measure.how={self.how!r} is not known (valid: final, auc, rate, log10, at)")
        return v * self.scale

    @property
    def name(self) -> str:
        """A unique column name: `val/bpc`, `val/bpc@400` (at a step), `auc(val/bpc)` (derived)."""
        return f"{self.key}@{self.step}" if self.how == "at" else (
            self.key if self.how == "final" else f"{self.how}({self.key})")

    @property
    def split(self) -> str:
        return self.key.split("/")[0] if "/" in self.key else ""

    @property
    def metric(self) -> str:
        name = self.key.split("/", 1)[-1]
        return {"auc": f"mean {name} over evaluations", "log10": f"log10 {name}"}.get(self.how, name)


@dataclass
class Row:
    id: tuple
    label: str
    runs: list[Run]

    @property
    def done(self) -> list[Run]:
        return [r for r in self.runs if r.done]

    @property
    def failed(self) -> list[Run]:
        return [r for r in self.runs if not r.done]

    def values(self, m: Measure) -> list[float]:
        return [v for v in (m(r) for r in self.done) if math.isfinite(v)]

    def ranked(self, m: Measure) -> list[tuple[float, Run]]:
        pairs = [(v, r) for r in self.done if math.isfinite(v := m(r))]
        return sorted(pairs, key=lambda p: p[0], reverse=not m.lower_is_better)

    def mean(self, m: Measure) -> float:
        return stats.mean_std(self.values(m))[0]

    @property
    def name(self) -> str:
        """The label without Markdown (results/summary.csv)."""
        return self.label.replace("`", "")


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable  # (row, table) -> markdown cell
    csv: Callable = None  # (row, table) -> {csv column: value}


def column(header: str, name: str, value: Callable, show: Callable = str) -> Column:
    """A column of one value per row, `value(row, table)`: its cell `show(value)`, its CSV column `name`."""
    return Column(header, lambda row, t: show(value(row, t)), lambda row, t: {name: value(row, t)})


def params() -> Column:
    m = Measure("model/params", "params")
    return column("params", "params", lambda row, t: next((int(v) for v in row.values(m)), None),
                  lambda v: NA if v is None else f"{v:,}")


def _not_done(row: Row) -> str:
    """` (1 failed, 1 damaged)`: the row's runs that did not finish, the damaged apart (as the header counts them)."""
    damaged = sum(r.status == "damaged" for r in row.failed)  # a kept file not plain data: out of every statistic
    failed = len(row.failed) - damaged
    parts = [f"{failed} failed"] * bool(failed) + [f"{damaged} damaged"] * bool(damaged)
    return f" ({', '.join(parts)})" if parts else ""


def count(trials: bool = False) -> Column:
    def cell(row, t):
        return f"{len(row.done)}/{len(row.failed)}" if trials else str(len(row.done)) + _not_done(row)

    return Column("trials (done/failed)" if trials else "n", cell,
                  lambda row, t: {"n": len(row.done), "n_failed": len(row.failed)})


def stat(m: Measure, header: str | None = None) -> Column:
    """mean ± std over the row's finished runs (the mean alone for one run)."""
    def cell(row, t):
        if not row.done and row.failed:
            return "failed: " + "; ".join(f"{r.path.name}: {r.error}" for r in row.failed).replace("|", "/")
        return mean_pm(row.values(m), m.digits)

    def out(row, t):
        mean, std = stats.mean_std(row.values(m))
        return {f"{m.name}_mean": mean, f"{m.name}_std": std}

    return Column(header or m.label, cell, out)


def best(m: Measure, header: str = "best", sci: bool = False) -> Column:
    return column(header, f"{m.name}_best", lambda row, t: next(iter(row.ranked(m)), (math.nan,))[0],
                  lambda v: num(v, m.digits, sci))


def top_mean(m: Measure, k: int, header: str, sci: bool = False) -> list[Column]:
    def vals(row):
        return [v for v, _ in row.ranked(m)[:k]]

    return [column(header, f"{m.name}_top_mean", lambda row, t: statistics.fmean(vals(row)) if vals(row) else math.nan,
                   lambda v: num(v, m.digits, sci)),
            column("k", "k", lambda row, t: len(vals(row)))]


def best_key(m: Measure, key: str, header: str) -> Column:
    """The config value `key` of the row's best run (a random search: which trial won)."""
    return column(header, f"best_{key}", lambda row, t: str(next((r.get(key, "") for _, r in row.ranked(m)), "")))


def rel_change(m: Measure | Callable, header: str, name: str) -> Column:
    """Relative change of the row's mean against the baseline row (negative = lower)."""
    pick = m if not isinstance(m, Measure) else (lambda row, t: m)

    def value(row, t):
        base = t.baseline_row
        if base is None or row is base:
            return NA
        mm = pick(row, t)
        return pct(row.mean(mm), base.mean(mm)) + (f" ({mm.split})" if mm.split != pick(base, t).split else "")

    return column(header, name, value)


def ratio_to_baseline(m: Measure, header: str) -> Column:
    """The row's time per step over the baseline's: from a rate (higher is better) or a time per step."""
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
    """A paper number for the row: `value(row_id) -> str or number or None` (from papers.yaml)."""
    return column(header, name, lambda row, t: value(row.id), lambda v: NA if v is None else str(v))


def steps_to_reach(curve: Measure, header: str) -> Column:
    return column(header, "steps_to_baseline_last_eval", lambda row, t: NA if t.baseline_row is None
                  or row is t.baseline_row else reach_steps(row, t.baseline_row, curve)[0])


def mean_curve(runs: list[Run], key: str, only_training: bool = False) -> tuple[list, list]:
    by_step: dict[int, list[float]] = {}
    for r in runs:
        for step, v in r.curve(key, only_training):
            by_step.setdefault(step, []).append(v)
    steps = sorted(by_step)
    return steps, [statistics.fmean(by_step[s]) for s in steps]


def reach_steps(row: Row, base: Row, curve: Measure) -> tuple[str, float]:
    """("1200" or "not reached", goal): the first step at which the row's mean `curve` reaches the last point of the
    baseline's (its last evaluation on the same data, not a final pass over more of it)."""
    _, base_ys = mean_curve(base.done, curve.key)
    goal = base_ys[-1] if base_ys else math.nan
    steps, ys = mean_curve(row.done, curve.key)
    if not math.isfinite(goal) or not steps:
        return NA, goal
    better = (lambda y: y <= goal) if curve.lower_is_better else (lambda y: y >= goal)
    return next((str(s) for s, y in zip(steps, ys) if better(y)), "not reached"), goal
