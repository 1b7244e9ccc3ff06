"""One table style for both papers: a table is a `TableSpec` (rows, columns, claims and their tests, floors),
rendered by `render` into Markdown, CSV rows, claim rows (for results/summary.csv) and a figure.

- rows: runs are grouped by the spec's config `keys` (`("variant",)`, `("model.width", "model.kind")`),
  read from each run's overrides, else its config (`Run.get`);
- columns: small named constructors (`stat`, `best`, `paper`, `delta`, ...) over `Measure`s, one number per run;
- claims: `Claim`s, each tested by a 95 % interval (`stats.py`): two rows (difference of means, Welch) or a
  row against a number (one-sample t-interval); a random search's best trial or mean of its top k by a bootstrap
  over all of its trials; two-row comparisons get the equivalence margin delta (`papers.margin`) and the four
  verdicts; a claim is the paper's when `papers.PAPER_CLAIMS` states it (`papers.paper_claim`);
- the family of a table: its claim tests, Holm-adjusted (`stats.holm_verdicts`) beside the raw verdicts; a test
  on the same runs, measure and rows as a line of another table (a study reusing a table's runs) links to it;
- floors (`papers.FLOORS`): the level a reference row must reach at the cpu scale, tested like a claim.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from dataclasses import dataclass, field
from typing import Callable

from highway_repro.report import papers, stats
from highway_repro.report.papers import Floor, PaperTable
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


def interval(ci) -> str:
    return "no interval (n < 2 on a side)" if ci is None else f"95 % CI [{ci[0]:.4g}, {ci[1]:.4g}]"


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


# ------------------------------------------------------------------ columns
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


# ------------------------------------------------------------------ claims
@dataclass(frozen=True)
class Claim:
    """`row`'s `measure` lies on `side` of `against`: another row (difference of means, Welch; the difference is
    compared with `threshold`, 0 for "lower / higher than") or a number (one-sample). `row` / `against` may pool
    several rows (a tuple of row ids: their runs together). pick: all runs | "best" trial | "top" (mean of the
    `top_k` best trials, as many on both sides); best and top are a random search's statistics, tested by a
    bootstrap over all trials of the row (`bootstrap_test`)."""
    text: str
    row: tuple
    measure: Measure
    side: str  # lower | higher
    against: tuple | float
    threshold: float = 0.0  # the difference the claim is about: 0, or -2 on log10 for "100x lower"
    pick: str = "all"
    top_k: int = 10
    kind: str = "claim"  # claim | floor
    paper_value: float | None = None
    paper_note: str = ""
    reach: Measure | None = None  # a curve: steps the row needs to reach the other row's last point on it

    @property
    def statistic(self) -> str:
        """As papers.PaperClaim names it: "test/bpc", "auc(val/bpc)", "best log10(train/loss) x100"."""
        pick = {"best": "best ", "top": f"top{self.top_k} "}.get(self.pick, "")
        factor = f" x{10 ** abs(self.threshold):g}" if self.threshold and self.measure.how == "log10" else ""
        return f"{pick}{self.measure.name}{factor}"


def pooled(ids: tuple) -> bool:
    """A claim side that pools several rows: a tuple of row ids (each a tuple)."""
    return bool(ids) and isinstance(ids[0], tuple)


def side_row(rows: dict, ids) -> Row | None:
    """The row a claim side names: a row of the table, or the rows of a pooled side together (None if one lacks)."""
    if not isinstance(ids, tuple) or not pooled(ids):
        return rows.get(ids) if isinstance(ids, tuple) else None
    parts = [rows.get(i) for i in ids]
    if any(p is None for p in parts):
        return None
    return Row(ids, " + ".join(p.label for p in parts) + " (pooled)", [r for p in parts for r in p.runs])


def paper_claim_of(table: str, c: Claim) -> papers.PaperClaim | None:
    """The claim of papers.PAPER_CLAIMS on `table` that `c` tests (same rows, statistic and side), or None."""
    def flat(ids):
        return tuple(x for i in ids for x in i) if isinstance(ids, tuple) and pooled(ids) else ids
    return papers.paper_claim(table, flat(c.row), flat(c.against), c.statistic, c.side)


def floor_claim(f: Floor, measure: Measure) -> Claim:
    sign = "<=" if f.side == "lower" else ">="
    return Claim(f"reaches the floor {measure.label} {sign} {f.value:g}", f.row, measure,
                 f.side, f.value, pick="best" if f.best else "all", kind="floor")


def _values(row: Row, c: Claim) -> list[float]:
    """The values of the row that the claim tests: all, or the best run's (a floor on a random search)."""
    ranked = [v for v, _ in row.ranked(c.measure)]
    return ranked[:1] if c.pick == "best" else ranked


UNTESTED = "not testable yet"  # a claim's detail when a side has no finished runs (its verdict: NOT RESOLVED)
RESAMPLES = 10000  # bootstrap resamples of a random search's trials


def run_id(r: Run) -> str:
    """A run across tables: its experiment (config `name`) and folder name; a study that reuses a table's run
    keeps both (the runner restores a kept run under its folder name)."""
    return f"{r.get('name', '')}/{r.path.name}"


def trials(row: Row, m: Measure, worst: float) -> list[float]:
    """Every trial of a random-search row: a finished run's value, and `worst` for a run that failed, diverged or
    ended non-finite (a failure counts, it is never dropped); runs with no metrics.json are not trials yet."""
    out = []
    for r in row.runs:
        if r.status == "missing":
            continue
        v = m(r) if r.done else math.nan
        out.append(v if math.isfinite(v) else worst)
    return out


def pick_statistic(c: Claim, k: int):
    """The random search's statistic of a list of trial values: the best, or the mean of the k best."""
    best_first = (lambda xs: sorted(xs)) if c.measure.lower_is_better else (lambda xs: sorted(xs, reverse=True))
    if c.pick == "best":
        return min if c.measure.lower_is_better else max
    return lambda xs: statistics.fmean(best_first(xs)[:k])


def bootstrap_test(c: Claim, row: Row, other: Row | None) -> dict:
    """A random search's best trial or top-k mean, against another row's or a number: the statistic on all trials
    (failures at the worst value that a finished trial of the compared rows reached), and a 95 % percentile
    interval of it (of the difference for two rows) over RESAMPLES bootstrap resamples of the trials of each row.
    One-sided p-values: the share of resampled values on the wrong side of the threshold."""
    m = c.measure
    finished = row.values(m) + (other.values(m) if other else [])
    worst = (max if m.lower_is_better else min)(finished)
    xs = trials(row, m, worst)
    ys = trials(other, m, worst) if other else []
    k = min(c.top_k, len(xs), *([len(ys)] if other else []))
    f = pick_statistic(c, k)
    boot = stats.bootstrap(xs, f, RESAMPLES, seed=1)
    threshold = c.threshold if other else float(c.against)
    out = {"trials": (len(xs), len(ys)), "k": k, "mean": f(xs), "other_mean": f(ys) if other else math.nan}
    if other:
        boot = [a - b for a, b in zip(boot, stats.bootstrap(ys, f, RESAMPLES, seed=2))]
    out["estimate"] = out["mean"] - out["other_mean"] if other else out["mean"]
    out["ci"] = stats.percentile_interval(boot)
    below = sum(b < threshold for b in boot) / len(boot)
    above = sum(b > threshold for b in boot) / len(boot)
    lower = c.side == "lower"
    out["tests"] = {"p_side": 1 - (below if lower else above), "p_other": 1 - (above if lower else below),
                    "p_equiv": None}
    return out


def test_claim(c: Claim, rows: dict, table: str = "") -> dict:
    """The claim's result: ours, the other side, the interval, delta, the verdict, its p-values (`tests`), the
    comparison's identity (`key`: the runs of each side and the statistic), the seeds a decision would need, and
    one Markdown line. `table`: the table's name, for papers.PAPER_CLAIMS."""
    row = side_row(rows, c.row)
    m = c.measure
    label = row.label if row else "/".join(map(str, c.row))
    res = {"claim": c, "row": row, "label": label, "mean": math.nan, "std": math.nan, "n": 0, "ci": None,
           "other_mean": math.nan, "other_n": 0, "diff": math.nan, "verdict": stats.NOT_RESOLVED, "detail": "",
           "delta": None, "tests": None, "key": None, "seeds_needed": None, "experiment": ""}
    pc = paper_claim_of(table, c)
    res["paper"], res["paper_effect"] = pc is not None, papers.paper_effect(pc) if pc else None
    res["paper_id"] = papers.PAPER_CLAIMS.index(pc) if pc else None
    two_rows = isinstance(c.against, tuple)
    other = side_row(rows, c.against) if two_rows else None
    res["other_label"] = other.label if other else None
    if row is None or not row.values(m) or (two_rows and (other is None or not other.values(m))):
        side = "the row it is compared with" if row is not None and row.values(m) else "this row"
        res["detail"] = f"{UNTESTED}: no finished runs for {side}"
        res["line"] = f"{label} {c.text}: {res['detail']}"
        return res
    used = [r for r in row.runs if r.done] + ([r for r in other.runs if r.done] if other else [])
    res["experiment"] = next((str(r.get("name")) for r in used if r.get("name")), "")
    sides = (sorted(map(run_id, row.runs)), sorted(map(run_id, other.runs)) if other else [repr(c.against)])
    res["key"] = f"{c.pick}{c.top_k if c.pick == 'top' else ''}|{m.name}|" + "|".join(",".join(s) for s in sides)
    what, d = f"{m.label}{c.paper_note}", m.digits
    if c.kind == "claim" and c.pick in ("best", "top"):
        b = bootstrap_test(c, row, other)
        res.update(mean=b["mean"], other_mean=b["other_mean"], n=b["trials"][0], other_n=b["trials"][1],
                   ci=b["ci"], tests=b["tests"])
        threshold = c.threshold if other else float(c.against)
        res["verdict"] = stats.verdict(b["ci"], c.side, threshold)
        stat = "best trial" if c.pick == "best" else f"mean of the best {b['k']}"
        sci = m.how != "log10" and abs(b["mean"]) < 1e-2
        must = f" (must be {'<' if c.side == 'lower' else '>'} {threshold:g})" if other else ""
        diff_text = f"difference {b['estimate']:+.4g}{must}, " if other else ""
        tested = (f"{diff_text}95 % bootstrap interval [{b['ci'][0]:.4g}, {b['ci'][1]:.4g}] over all trials (failed "
                  "ones at the worst value)")
        if other:
            res["diff"] = b["estimate"]
            line = (f"{label} {c.text} ({what}): {stat} of {b['trials'][0]} trials {num(b['mean'], d, sci)} vs "
                    f"{other.label} {num(b['other_mean'], d, sci)} ({b['trials'][1]} trials); {tested}")
        else:
            line = f"{label} {c.text} ({what}): {stat} of {b['trials'][0]} trials {num(b['mean'], d, sci)}; {tested}"
        res["line"] = f"{line}: **{res['verdict']}**"
        return res
    xs = _values(row, c)
    res["mean"], res["std"] = stats.mean_std(xs)
    res["n"] = len(row.done) if c.pick == "best" else len(xs)
    if two_rows:
        ys = _values(other, c)
        res["other_mean"], res["other_n"] = statistics.fmean(ys), len(ys)
        res["diff"] = res["mean"] - res["other_mean"]
        res["ci"] = stats.welch_interval(xs, ys)
        if c.threshold == 0:
            res["delta"] = papers.margin(m.metric, res["other_mean"])
        res["verdict"] = stats.verdict(res["ci"], c.side, c.threshold, res["delta"])
        se_df = stats.welch_se_df(xs, ys)
        if se_df:
            res["tests"] = _t_tests(res["diff"], *se_df, c.side, c.threshold, res["delta"])
        if res["verdict"] == stats.NOT_RESOLVED:
            res["seeds_needed"] = stats.seeds_needed(res["std"], stats.mean_std(ys)[1], res["diff"], res["delta"],
                                                     start=max(len(xs), len(ys)))
        must = f" (must be {'<' if c.side == 'lower' else '>'} {c.threshold:g})" if c.threshold else ""
        band = f", delta ±{res['delta']:.3g}" if res["delta"] is not None else ""
        tested = f"difference {res['diff']:+.4g}{must}, {interval(res['ci'])}{band}"
        line = (f"{label} {c.text} ({what}): {num(res['mean'], d)} (n {len(xs)}) vs "
                f"{other.label} {num(res['other_mean'], d)} (n {len(ys)}); {tested}")
        if c.reach:
            steps, goal = reach_steps(row, other, c.reach)
            res["detail"] = f"steps to reach {other.label}'s last evaluation's {c.reach.label} ({goal:.4g}): {steps}"
            line += f"; {res['detail']}"
    elif c.pick == "best":
        res["verdict"] = stats.point_verdict(res["mean"], c.side, float(c.against))
        value = num(res["mean"], d, sci=abs(res["mean"]) < 1e-2)
        line = f"{label} {c.text}: best of {res['n']} runs {value} (a single value, no interval)"
    else:
        res["ci"] = stats.mean_interval(xs)
        res["verdict"] = stats.verdict(res["ci"], c.side, float(c.against))
        if len(xs) > 1:
            res["tests"] = _t_tests(res["mean"], res["std"] / math.sqrt(len(xs)), len(xs) - 1, c.side,
                                    float(c.against), None)
        if res["verdict"] == stats.NOT_RESOLVED:
            res["seeds_needed"] = stats.seeds_needed(res["std"], 0.0, res["mean"] - float(c.against), None,
                                                     start=len(xs))
        note = f" ({c.paper_note.lstrip('; ')})" if c.paper_note else ""
        line = (f"{label} {c.text}{note}: ours {mean_pm(xs, d)} (n {len(xs)}), "
                f"{interval(res['ci']).replace('CI', 'CI of the mean')}")
    res["line"] = f"{line}: **{res['verdict']}**"
    return res


def _t_tests(estimate: float, se: float, df: float, side: str, threshold: float, delta: float | None) -> dict:
    """The one-sided p-values of a t-test result (stats.holm_verdicts' input): the claim's side, the other side,
    and equivalence within +-delta (two one-sided tests, the larger p)."""
    other = "higher" if side == "lower" else "lower"
    equiv = None if delta is None else max(stats.side_p(estimate, se, df, "lower", threshold + delta),
                                           stats.side_p(estimate, se, df, "higher", threshold - delta))
    return {"p_side": stats.side_p(estimate, se, df, side, threshold),
            "p_other": stats.side_p(estimate, se, df, other, threshold), "p_equiv": equiv}


def family(results: list[dict], elsewhere: Callable | None = None) -> None:
    """Mark each claim result with `same_as`, the line of another table that holds the same comparison
    (`elsewhere(key, experiment) -> {"table", "file", "row", "claim"} or None`), and give the others the family
    size and the Holm-adjusted verdict (over the table's claim tests with a p-value; a test without one: None)."""
    tests = []
    for r in results:
        own = r["claim"].kind == "claim" and r["key"] and elsewhere
        r["same_as"] = elsewhere(r["key"], r["experiment"]) if own else None
        if r["claim"].kind == "claim" and not r["same_as"] and r["tests"] is not None:
            tests.append(r)
    holm = stats.holm_verdicts([r["tests"] for r in tests])
    for r in results:
        r["family_size"], r["holm"] = None, None
    for r, v in zip(tests, holm):
        r["family_size"], r["holm"] = len(tests), v


def claim_line(r: dict) -> str:
    """The Markdown line of a claim result: the test, the Holm verdict beside the raw one, the seeds a decision
    would need; a comparison tested in another table: a link to it."""
    if r.get("same_as"):
        s = r["same_as"]
        return (f"{r['label']} {r['claim'].text}: the same runs, measure and rows as "
                f"[{s['table']}]({s['file']}) ({s['row']} {s['claim']}): counted there")
    line = r["line"]
    if r.get("holm") is not None:
        line += f" (Holm over the table's {r['family_size']} tests: **{r['holm']}**)"
    if r.get("seeds_needed"):
        line += f"; a decision needs about {r['seeds_needed']} seeds per row at the measured spread"
    return line


# ------------------------------------------------------------------ the table spec
@dataclass(frozen=True)
class TableSpec:
    title: str
    keys: tuple  # config keys that place a run in a row
    columns: tuple  # Column, ... (after the row's key cells)
    primary: Measure  # the row's number in results/summary.csv
    claims: tuple | Callable = ()  # Claim, ... or fn(rows: dict id -> Row) -> [Claim]
    floors: tuple = ()  # papers.Floor, ...
    measures: dict = field(default_factory=dict)  # metric key -> Measure, for floors
    order: dict = field(default_factory=dict)  # key -> values in display order (others after, sorted)
    baseline: tuple | None = None  # the row deltas and ratios compare with
    label: Callable | None = None  # fn(row) -> str; None: the key values, one column each
    label_header: str = ""
    primary_pick: str = "all"  # "best": the summary gives the row's best run (a random search)
    paper: PaperTable | None = None
    paper_of: Callable | None = None  # fn(row id, split) -> the paper's number for the row (summary.csv)
    notes: str | Callable = ""  # text, or fn(runs, rows: dict) -> text
    figure: Callable | None = None  # fn(table: Rendered, path)


@dataclass
class Rendered:
    spec: TableSpec
    rows: list[Row]
    by_id: dict
    baseline_row: Row | None
    results: list[dict]  # claim results (claims, then floors)


def _sort_key(spec: TableSpec, row_id: tuple):
    out = []
    for k, v in zip(spec.keys, row_id):
        known = list(spec.order.get(k, ()))
        numeric = v.lstrip("-").replace(".", "", 1).isdigit()
        out.append((known.index(v) if v in known else len(known), 0 if numeric else 1,
                    float(v) if numeric else 0.0, v))
    return tuple(out)


def group(spec: TableSpec, runs: list[Run]) -> list[Row]:
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        groups.setdefault(tuple(str(r.get(k, "")) for k in spec.keys), []).append(r)
    rows = [Row(i, "", rs) for i, rs in sorted(groups.items(), key=lambda kv: _sort_key(spec, kv[0]))]
    for row in rows:
        row.label = spec.label(row) if spec.label else ", ".join(
            f"{k.split('.')[-1]}={v}" for k, v in zip(spec.keys, row.id))
    return rows


def claims_of(spec: TableSpec, by_id: dict) -> list[Claim]:
    """The spec's claims and floors on the rows the runs have (a smoke sweep may have other rows)."""
    claims = list(spec.claims(by_id) if callable(spec.claims) else spec.claims)
    claims += [floor_claim(f, spec.measures[f.key]) for f in spec.floors]
    return [c for c in claims if (all(i in by_id for i in c.row) if pooled(c.row) else c.row in by_id)]


def render(spec: TableSpec, runs: list[Run], name: str = "", elsewhere: Callable | None = None
           ) -> tuple[Rendered, str, str]:
    """-> (rendered table, Markdown body (no header), CSV text). `name`: the table's name (its paper claims);
    `elsewhere`: the comparisons that another table holds (`family`)."""
    rows = group(spec, runs)
    by_id = {r.id: r for r in rows}
    t = Rendered(spec, rows, by_id, by_id.get(spec.baseline) if spec.baseline else None, [])
    t.results = [test_claim(c, by_id, name) for c in claims_of(spec, by_id)]
    family(t.results, elsewhere)
    key_heads = [spec.label_header] if spec.label else [k.split(".")[-1] for k in spec.keys]
    head = key_heads + [c.header for c in spec.columns]
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    csv_rows = []
    for row in rows:
        keys = [row.label] if spec.label else list(row.id)
        md.append("| " + " | ".join(keys + [c.cell(row, t) for c in spec.columns]) + " |")
        out = {**dict(zip(spec.keys, row.id)), "label": row.name}
        for c in spec.columns:
            out.update(c.csv(row, t) if c.csv else {})
        out["failed"] = "; ".join(f"{r.path.name}: {r.error}" for r in row.failed)
        csv_rows.append(out)
    failed = [f"- {row.label}, `{r.path.name}`: {r.error}".replace("|", "/") for row in rows for r in row.failed]
    if failed:
        md += ["", "Runs that did not finish (their rows count only the finished runs):", *failed]
    claims = [r for r in t.results if r["claim"].kind == "claim"]
    floors = [r for r in t.results if r["claim"].kind == "floor"]
    if claims:
        md += ["", f"**Claims** (95 % intervals; {stats.VERDICTS_EXPLAINED}):"]
        md += [f"- {claim_line(r)}" for r in claims]
    if floors:
        md += ["", "**Floors** of the cpu scale (met = the mean, or the best run, on the floor's side):"]
        md += [f"- {r['line']}; met: **{'yes' if floor_met(r) else 'no'}**" for r in floors]
    notes = spec.notes(runs, by_id) if callable(spec.notes) else spec.notes
    paper_note = spec.paper.note if spec.paper else ""
    body = "\n".join(md) + "\n" + "".join(f"\n{n.strip()}\n" for n in (notes, paper_note) if n and n.strip())
    buf = io.StringIO()
    fields = list(dict.fromkeys(k for r in csv_rows for k in r))
    w = csv.DictWriter(buf, fieldnames=fields)
    w.writeheader()
    w.writerows(csv_rows)
    return t, body, buf.getvalue()


def floor_met(res: dict) -> bool:
    c = res["claim"]
    v = res["mean"]
    return math.isfinite(v) and (v <= c.against if c.side == "lower" else v >= c.against)
