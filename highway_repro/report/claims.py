"""Claims and their tests (`test_claim`): two rows by the difference of their means (paired by seed, else Welch) with
the equivalence margin, a row against a number, a random search's quantile (exact order-statistic intervals); 99 % at
a comparison's second look, every other on its first look's runs; the table's family, Holm-adjusted (`family`)."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, replace
from typing import Callable

from highway_repro.report import papers, stats
from highway_repro.report.claims_list import PAPER_SCALE_ONLY, uncounted
from highway_repro.grids import SWEEP_DIR, grid_of
from highway_repro.report.measures import Measure, Row, interval, num, reach_steps
from highway_repro.report.papers import Floor
from highway_repro.report.prose import prose
from highway_repro.report.runs import Run


@dataclass(frozen=True)
class Claim:
    """`row`'s `measure` lies on `side` of `against`: another row or a number; a side may pool rows (a tuple of row
    ids). pick: all runs | "best" run (a floor on a random search) | "quantile": the `q`-quantile of the trials."""
    text: str
    row: tuple
    measure: Measure
    side: str  # lower | higher
    against: tuple | float
    threshold: float = 0.0  # the difference the claim is about: 0, or -2 on log10 for "100x lower"
    pick: str = "all"
    q: float = 0.0  # pick "quantile": which quantile of the trials
    kind: str = "claim"  # claim | floor
    paper_value: float | None = None
    paper_note: str = ""
    reach: Measure | None = None  # a curve: steps the row needs to reach the other row's last point on it

    @property
    def statistic(self) -> str:
        """As papers.PaperClaim names it: "test/bpc", "auc(val/bpc)", "q20 log10(train/loss) x100"."""
        pick = {"best": "best ", "quantile": f"q{self.q * 100:g} "}.get(self.pick, "")
        factor = f" x{10 ** abs(self.threshold):g}" if self.threshold and self.measure.how == "log10" else ""
        return f"{pick}{self.measure.name}{factor}"


def pooled(ids: tuple) -> bool:
    """A claim side that pools several rows: a tuple of row ids (each a tuple)."""
    return bool(ids) and isinstance(ids[0], tuple)


def side_row(rows: dict, ids) -> Row | None:
    """The row a claim side names, or a pooled side's rows together; None if one lacks."""
    if not isinstance(ids, tuple) or not pooled(ids):
        return rows.get(ids) if isinstance(ids, tuple) else None
    parts = [rows.get(i) for i in ids]
    return None if None in parts else Row(ids, " + ".join(p.label for p in parts) + " (pooled)",
                                          [r for p in parts for r in p.runs])


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


def seed_pairs(row: Row, other: Row, m: Measure) -> list[float] | None:
    """The per-seed differences row - other, where the design pairs the two rows: both finished the same seeds (a
    run's seed: its `seed` and `data.seed`, so the two runs of a pair see the same data order), at least 2. None
    otherwise (a run without `seed` or `data.seed`, a seed twice in a row, a seed one row has and the other lacks:
    rows of different seed counts keep Welch's test, which uses every run)."""
    def by_seed(r: Row) -> dict | None:
        out = {}
        for v, run in r.ranked(m):
            key = (run.get("seed"), run.get("data.seed"))
            if None in key or tuple(map(str, key)) in out:
                return None
            out[tuple(map(str, key))] = v
        return out

    a, b = by_seed(row), by_seed(other)
    if a is None or b is None or set(a) != set(b) or len(a) < 2:
        return None
    return [a[k] - b[k] for k in sorted(a)]


def second_look_grid(table: str, scale: str) -> dict[str, set[str]]:
    """The values each key of a table's second look at `scale` takes (its sweep file); {} without one."""
    path = SWEEP_DIR / table / f"{scale}-second_look.yaml"
    return {k: set(vs) for k, vs in grid_of(path).items()} if table and path.exists() else {}


def _scales(runs: list[Run]) -> set[str]:
    return {str(s) for s in (r.get("scale_name") for r in runs) if s is not None}


def _in_grid(r: Run, scale: str, grid: dict) -> bool:
    return str(r.get("scale_name")) == scale and all(str(r.get(k)) in vs for k, vs in grid.items())


def first_look(rows: dict, table: str) -> dict:
    """The rows without the runs of the table's second look."""
    out = {}
    for key, row in rows.items():
        grids = {s: grid for s in _scales(row.runs) if (grid := second_look_grid(table, s))}
        runs = [r for r in row.runs if not any(_in_grid(r, s, grid) for s, grid in grids.items())]
        out[key] = row if len(runs) == len(row.runs) else replace(row, runs=runs)
    return out


def second_look_complete(row: Row, table: str, keys: tuple) -> bool:
    """Whether every run the table's second look plans for `row` (by the table's row `keys`) has a metrics.json."""
    scales = _scales(row.runs)
    if not keys or pooled(row.id) or len(scales) != 1:
        return False
    scale = scales.pop()
    if not (grid := second_look_grid(table, scale)):
        return False
    planned = math.prod(len(vs & {row.id[keys.index(k)]}) if k in keys else len(vs) for k, vs in grid.items())
    ended = sum(r.status != "missing" for r in row.runs if _in_grid(r, scale, grid))
    return ended >= planned


LAST_LOOK = "its second look has all its runs and was the last: NOT RESOLVED at this scale"  # no look follows
UNTESTED = "not testable yet"  # a claim's detail when a side has no finished runs (its verdict: NOT RESOLVED)


def run_id(r: Run) -> str:
    """A run across tables: a study that reuses a table's run keeps its experiment and folder name."""
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


def _cpu_run_seconds(runs: list) -> float | None:
    """Mean wall seconds of a CPU run with a core to itself (its CPU time per thread); None when none recorded it."""
    secs = [cpu / r.threads[0] for r in runs
            if math.isfinite(cpu := r.metric("time/cpu_s")) and not r.run_info.get("cuda_device")]
    return statistics.fmean(secs) if secs else None


@dataclass
class ClaimResult:
    """A claim tested on a table's rows; `key`: the comparison's identity (each side's runs and the statistic)."""
    claim: Claim
    row: Row | None
    label: str
    level: float
    under_way: str = ""  # the sweep files of a second look whose runs have not all ended
    mean: float = math.nan
    std: float = math.nan
    n: int = 0
    other_label: str | None = None
    other_mean: float = math.nan
    other_n: int = 0
    diff: float = math.nan
    ci: tuple | None = None
    ci_unpaired: tuple | None = None
    delta: float | None = None
    tests: dict | None = None
    verdict: str = stats.NOT_RESOLVED
    detail: str = ""
    how: str = ""  # the test of two rows: "paired" (by seed), "Welch", or "" (too few runs)
    pairs: int = 0  # paired: the seeds both rows finished
    key: str | None = None
    experiment: str = ""
    seeds_needed: int | None = None
    points_to: str = ""  # NOT RESOLVED: the verdict the estimate points to (`stats.points_to`)
    need_unit: str = "seeds"
    decision: tuple | None = None
    last_look: bool = False
    paper: bool = False
    paper_effect: tuple | None = None
    paper_id: int | None = None
    claim_type: str = "own"
    scale: str = ""
    cpus: str = ""  # the processors of each side's runs (`cpu_models`)
    same_as: dict | None = None
    family_size: int | None = None
    holm: str | None = None

    @property
    def line(self) -> str:
        return result_line(self)


def test_claim(c: Claim, rows: dict, table: str = "", keys: tuple = ()) -> ClaimResult:
    """The claim's result on `rows`, its numbers and verdict (its line: `result_line`). `table`: for
    papers.PAPER_CLAIMS and its second look (a comparison of papers.SECOND_LOOK_CLAIMS reads every run at
    stats.SECOND_LOOK once all of that look's runs have ended, until then its first look's); `keys`: the table's row
    keys, which tell when a second look has all its runs."""
    pc = paper_claim_of(table, c)
    side_rows = [rows.get(i) for i in (c.row, c.against) if isinstance(i, tuple) and not pooled(i)]
    scales = _scales([r for row in side_rows if row for r in row.runs])
    looks = [s for s in sorted(scales) if second_look_grid(table, s)]
    level = stats.SECOND_LOOK if pc in papers.SECOND_LOOK_CLAIMS and looks else stats.LEVEL
    under_way = level == stats.SECOND_LOOK and not all(second_look_complete(r, table, keys) for r in side_rows if r)
    if under_way:  # read at its planned size only: until then, its first look
        level = stats.LEVEL
    table_rows = rows  # every run: the table's hours
    if level == stats.LEVEL:
        rows = first_look(rows, table)
    row = side_row(rows, c.row)
    m = c.measure
    label = row.label if row else "/".join(map(str, c.row))
    res = ClaimResult(c, row, label, level, under_way=", ".join(
        f"configs/sweep/{table}/{s}-second_look.yaml" for s in looks) if under_way else "")
    res.paper, res.paper_effect = pc is not None, papers.paper_effect(pc) if pc else None
    res.paper_id = papers.PAPER_CLAIMS.index(pc) if pc else None
    res.claim_type, res.scale = pc.claim_type if pc else "own", ", ".join(sorted(scales))  # a floor: own
    two_rows = isinstance(c.against, tuple)
    other = side_row(rows, c.against) if two_rows else None
    res.other_label = other.label if other else None
    if row is None or not row.values(m) or (two_rows and (other is None or not other.values(m))):
        side = "the row it is compared with" if row is not None and row.values(m) else "this row"
        res.detail = f"{UNTESTED}: no finished runs for {side}"
        return res
    used = [r for r in row.runs if r.done] + ([r for r in other.runs if r.done] if other else [])
    res.experiment = next((str(r.get("name")) for r in used if r.get("name")), "")
    sides = (sorted(map(run_id, row.runs)), sorted(map(run_id, other.runs)) if other else [repr(c.against)])
    res.key = f"{c.pick}{c.q if c.pick == 'quantile' else ''}|{m.name}|" + "|".join(",".join(s) for s in sides)
    if c.kind == "claim" and c.pick == "quantile":  # a second look under way: its runs so far count
        have = [sum(r.status != "missing" for r in s.runs) for s in side_rows] if under_way else None
        quantile_claim(res, row, other, have, table_rows)
    elif two_rows:
        two_rows_claim(res, row, other, used, table_rows)
    elif c.pick == "best":
        best_run_claim(res, row)
    else:
        one_sample_claim(res, row)
    res.cpus = cpu_models([[r for r in side.runs if r.status != "missing"] for side in (row, other) if side])
    res.last_look = (res.level == stats.SECOND_LOOK and res.verdict == stats.NOT_RESOLVED and
                     all(second_look_complete(r, table, keys) for r in (row, other) if r is not None))
    return res


def quantile_claim(res: ClaimResult, row: Row, other: Row | None, have: list | None, table_rows: dict) -> None:
    """The q-quantile of a random search's trials (failed ones at the worst value) against a number or another
    row's: `stats.quantile_test`, exact order-statistic intervals."""
    c, m, level = res.claim, res.claim.measure, res.level
    worst = (max if m.lower_is_better else min)(row.values(m) + (other.values(m) if other else []))
    xs, ys = trials(row, m, worst), trials(other, m, worst) if other else None
    threshold = c.threshold if other else float(c.against)
    qt = stats.quantile_test(xs, c.q, threshold, c.side, ys, level)
    res.mean, res.other_mean, res.n, res.other_n = *qt["quantiles"], len(xs), len(ys or [])
    res.ci, res.tests = _interval_and_p(qt, level)
    res.verdict = stats.verdict(qt["ci"], c.side, threshold)
    if other:
        res.diff = qt["estimate"]
    if res.verdict == stats.NOT_RESOLVED:
        res.seeds_needed, res.need_unit = stats.quantile_trials_needed(xs, c.q, threshold, ys), "trials"
        res.points_to = stats.points_to(qt["estimate"], c.side, threshold)
        if other:
            _decision(res, row.runs + other.runs, have if have is not None else (res.n, res.other_n), table_rows)


def two_rows_claim(res: ClaimResult, row: Row, other: Row, used: list, table_rows: dict) -> None:
    """The difference of two rows' means: paired by seed where the design pairs them (`seed_pairs`), else Welch,
    with the equivalence margin of a claim about 0 (`papers.margin`)."""
    c, m, level = res.claim, res.claim.measure, res.level
    xs, ys = _values(row, c), _values(other, c)
    res.mean, res.std = stats.mean_std(xs)
    res.n = len(row.done) if c.pick == "best" else len(xs)
    res.other_mean, res.other_n = statistics.fmean(ys), len(ys)
    if c.threshold == 0:
        res.delta = papers.margin(m.metric, res.other_mean, res.paper_effect)
    test = welch = stats.t_test(xs, ys, c.side, c.threshold, res.delta, level)
    sds, res.how = (res.std, stats.mean_std(ys)[1]), "Welch" if welch else ""
    pairs = seed_pairs(row, other, m) if c.pick == "all" and not (pooled(c.row) or pooled(c.against)) else None
    if pairs:  # the seeds both rows finished: the paired t-test of their differences
        test, res.ci_unpaired = stats.t_test(pairs, None, c.side, c.threshold, res.delta, level), welch["ci"]
        sds, res.how, res.pairs = (stats.mean_std(pairs)[1], 0.0), "paired", len(pairs)
    res.diff = test["estimate"] if test else res.mean - res.other_mean
    res.ci, res.tests = _interval_and_p(test, level)
    res.verdict = stats.verdict(res.ci, c.side, c.threshold, res.delta)
    if res.verdict == stats.NOT_RESOLVED:
        res.seeds_needed = stats.seeds_needed(*sds, res.diff, res.delta, stats.SECOND_LOOK,
                                              start=max(len(xs), len(ys)))
        res.points_to = stats.points_to(res.diff, c.side, c.threshold, res.delta)
        _decision(res, used, (len(xs), len(ys)), table_rows)
    if c.reach:
        steps, goal = reach_steps(row, other, c.reach)
        res.detail = f"steps to reach {other.label}'s last evaluation's {c.reach.label} ({goal:.4g}): {steps}"


def best_run_claim(res: ClaimResult, row: Row) -> None:
    """The best run of a row against a number: a single value, HELD or DID NOT HOLD."""
    c = res.claim
    res.mean, res.std = stats.mean_std(_values(row, c))
    res.n, thr = len(row.done), float(c.against)
    res.verdict = (stats.NOT_RESOLVED if not math.isfinite(res.mean) else stats.NOT_HELD if res.mean == thr
                   else stats.verdict((res.mean, res.mean), c.side, thr))


def one_sample_claim(res: ClaimResult, row: Row) -> None:
    """A row's mean against a number: the one-sample t interval."""
    c, xs = res.claim, _values(row, res.claim)
    res.mean, res.std = stats.mean_std(xs)
    res.n = len(xs)
    test = stats.t_test(xs, None, c.side, float(c.against), None, res.level)
    res.ci, res.tests = _interval_and_p(test, res.level)
    res.verdict = stats.verdict(res.ci, c.side, float(c.against))
    if res.verdict == stats.NOT_RESOLVED:
        res.seeds_needed = stats.seeds_needed(res.std, 0.0, res.mean - float(c.against), None,
                                              stats.SECOND_LOOK, start=len(xs))
        res.points_to = stats.points_to(res.mean, c.side, float(c.against))


def result_line(res: ClaimResult) -> str:
    """A claim result's line: the numbers, the test and its interval, the processors and the verdict."""
    c, m, d, label = res.claim, res.claim.measure, res.claim.measure.digits, res.label
    if res.key is None:  # untested
        return f"{label} {c.text}: {res.detail}"
    at = "" if res.level == stats.LEVEL else " (the second look)"
    what, ci = f"{m.label}{c.paper_note}", interval(res.ci, res.level)
    two_rows, must = isinstance(c.against, tuple), "<" if c.side == "lower" else ">"
    if c.kind == "claim" and c.pick == "quantile":
        sci = m.how != "log10" and abs(res.mean) < 1e-2
        how = ("the rows' exact order-statistic intervals at the Bonferroni level" if two_rows
               else "exact, from order statistics")
        tested = f"{ci.replace('CI', 'interval')}{at}; {how}, over all trials (failed ones at the worst value)"
        line = f"{label} {c.text} ({what}): {stats.pct(c.q)} quantile of {res.n} trials {num(res.mean, d, sci)}"
        if two_rows:
            line += (f" vs {res.other_label} {num(res.other_mean, d, sci)} ({res.other_n} trials); difference "
                     f"{res.diff:+.4g} (must be {must} {c.threshold:g}), {tested}")
        else:
            line += f"; {tested}"
    elif two_rows:
        must_be = f" (must be {must} {c.threshold:g})" if c.threshold else ""
        paired = (f" over {res.pairs} seeds (Welch's: [{res.ci_unpaired[0]:.4g}, {res.ci_unpaired[1]:.4g}])"
                  if res.how == "paired" else "")
        band = f", delta ±{res.delta:.3g}" if res.delta is not None else ""
        line = (f"{label} {c.text} ({what}): {num(res.mean, d)} (n {1 if c.pick == 'best' else res.n}) vs "
                f"{res.other_label} {num(res.other_mean, d)} (n {res.other_n}); difference {res.diff:+.4g}{must_be}, "
                f"{res.how + ' ' if res.how else ''}{ci}{at}{paired}{band}")
        line += f"; {res.detail}" if c.reach else ""
    elif c.pick == "best":
        line = (f"{label} {c.text}: best of {res.n} runs {num(res.mean, d, sci=abs(res.mean) < 1e-2)} (a single value, "
                "no interval)")
    else:
        note = f" ({c.paper_note.lstrip('; ')})" if c.paper_note else ""
        ours = f"{num(res.mean, d)} ± {num(res.std, d)}" if res.n > 1 else num(res.mean, d)
        line = f"{label} {c.text}{note}: ours {ours} (n {res.n}), {ci.replace('CI', 'CI of the mean')}{at}"
    return f"{line}; {res.cpus}: **{res.verdict}**" if res.cpus else f"{line}: **{res.verdict}**"


def processor(r: Run) -> str:
    """A run's GPU, else its CPU model, in short: "Intel(R) Xeon(R) Processor" -> "Intel Xeon"."""
    name = r.run_info.get("cuda_device") or r.run_info.get("cpu_model") or "?"
    return " ".join(str(name).replace("(R)", "").replace("(TM)", "").replace(" Processor", "").split())


def cpu_models(sides: list[list[Run]]) -> str:
    """What each side ran on: "on AMD EPYC", else "on 5 AMD EPYC vs 3 AMD EPYC + 2 Intel Xeon, not balanced" (the
    same share of each processor or not; the processor's effect: docs/gpu.md, cross-CPU twins)."""
    counts = [Counter(processor(r) for r in side) for side in sides if side]
    names = sorted(set().union(*counts)) if counts else []
    if len(names) <= 1:
        return f"on {names[0]}" if names else ""
    shares = {tuple(round(c[n] / sum(c.values()), 6) for n in names) for c in counts}
    mix = " vs ".join(" + ".join(f"{c[n]} {n}" for n in names if c[n]) for c in counts)
    return f"on {mix}, {'balanced' if len(shares) == 1 else 'not balanced'}"


def _interval_and_p(test: dict | None, level: float) -> tuple:
    """(interval, p-values on the first look's scale) of a `stats` test; (None, None) without one."""
    return (test["ci"], stats.second_look_p(test["tests"], level)) if test else (None, None)


def _decision(res: ClaimResult, runs: list, have, table_rows: dict) -> None:
    """What the runs a decision needs would cost; a row without CPU times (made on a GPU) at the table's mean."""
    run_s = _cpu_run_seconds(runs)
    if res.seeds_needed and run_s:
        per_row = [(_cpu_run_seconds(r.runs), len(r.runs)) for r in table_rows.values()]
        known = [s for s, _ in per_row if s]
        fallback = statistics.fmean(known) if known else 0.0
        res.decision = stats.decision_cost(res.seeds_needed, tuple(have), run_s,
                                           sum(n * (s or fallback) for s, n in per_row))


def family(results: list[ClaimResult], elsewhere: Callable | None = None) -> None:
    """Each result's `same_as`, another table's line on its comparison (`elsewhere(key, experiment)`), and the
    others' Holm verdicts over the table's claim tests."""
    for r in results:
        r.same_as = elsewhere(r.key, r.experiment) if r.claim.kind == "claim" and r.key and elsewhere else None
    tests = [r for r in results if r.claim.kind == "claim" and not r.same_as and r.tests is not None]
    for r, v in zip(tests, stats.holm_verdicts([r.tests for r in tests])):
        r.family_size, r.holm = len(tests), v


def claim_line(r: ClaimResult) -> str:
    """The Markdown line of a claim result: its test and Holm verdict, the seeds a decision would need."""
    if r.same_as:
        return prose("claim elsewhere", line=f"{r.label} {r.claim.text}", **r.same_as)
    if why := uncounted(vars(r)):
        return prose("claim uncounted", line=r.line.removesuffix(f": **{r.verdict}**"), why=why, reason=prose(
            "claim paper scale only" if why == PAPER_SCALE_ONLY else "claim negligible"))
    line = r.line + (f" (Holm over the table's {r.family_size} tests: **{r.holm}**)" if r.holm is not None else "")
    if r.seeds_needed:
        line += prose(f"claim {r.need_unit} needed", n=r.seeds_needed, power=stats.pct(stats.POWER),
                      level=stats.pct(stats.SECOND_LOOK))
        if r.decision and not r.last_look:
            more, hours, total, beyond = r.decision
            line += " " + prose("claim decision", more=more, hours=f"{hours:.1f}", cores=stats.BUDGET_CORES,
                                total=f"{total:.1f}", beyond=f", beyond the {stats.TABLE_BUDGET_H:g} h a table may "
                                "take at the cpu scale" if beyond else "")
    line += f"; the estimate points to {r.points_to}" if r.points_to and r.verdict == stats.NOT_RESOLVED else ""
    line += f"; its second look (the runs of {r.under_way}) is under way" if r.under_way else ""
    return line + (f"; {LAST_LOOK}" if r.last_look else "")
