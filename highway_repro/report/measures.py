"""What a table counts: `Measure` (one number per run), `Row` (the runs that share the spec's config keys), and
the number formats of the tables (`num`, `mean_pm`, `pct`, `interval`; `NA` for a missing value)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from highway_repro.report import stats
from highway_repro.report.runs import Run

NA = "—"


# ------------------------------------------------------------------ numbers and their format
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


# ------------------------------------------------------------------ measures and rows
@dataclass(frozen=True)
class Measure:
    """One number per run."""
    key: str  # a metrics.json key; for how="auc" / "rate" a metrics.jsonl key
    label: str  # as the table shows it: "test bpc"
    how: str = "final"  # final | auc (mean over the history) | rate (mean over training logs but the first) | log10
    #                     | at (the value logged at `step`)
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
        elif self.how == "auc":
            v = run.history_mean(self.key)
        elif self.how == "at":
            v = dict(run.history_values(self.key)).get(self.step, math.nan)
        elif self.how == "rate":  # the first interval includes start-up costs
            vals = [x for _, x in run.history_values(self.key)]
            vals = vals[1:] or vals
            v = statistics.fmean(vals) if vals else math.nan
        else:
            raise ValueError(f"Measure.how={self.how!r} is not known (valid: final, auc, rate, log10, at)")
        return v * self.scale

    @property
    def name(self) -> str:
        """A unique column name: the key, `val/bpc@400` for its value at a step, or `auc(val/bpc)` for a measure
        derived from it."""
        if self.how == "at":
            return f"{self.key}@{self.step}"
        return self.key if self.how == "final" else f"{self.how}({self.key})"

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

    @property
    def damaged(self) -> list[Run]:
        """The runs whose metrics.json cannot be parsed (among `failed`: out of every statistic)."""
        return [r for r in self.runs if r.status == "damaged"]

    def values(self, m: Measure) -> list[float]:
        return [v for v in (m(r) for r in self.done) if math.isfinite(v)]

    def ranked(self, m: Measure) -> list[tuple[float, Run]]:
        """(value, run) of the finished runs, best first."""
        pairs = [(m(r), r) for r in self.done]
        return sorted(((v, r) for v, r in pairs if math.isfinite(v)), key=lambda p: p[0],
                      reverse=not m.lower_is_better)

    def mean(self, m: Measure) -> float:
        return stats.mean_std(self.values(m))[0]

    @property
    def name(self) -> str:
        """The label without Markdown (results/summary.csv)."""
        return self.label.replace("`", "")
