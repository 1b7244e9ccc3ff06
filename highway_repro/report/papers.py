"""Every paper number, claim, margin and floor the tables compare with, from `papers.yaml` (its comments give the
sources), and the rules that read them: a claim's type, its margin, the paper's effect."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from highway_repro import files

DATA = Path(__file__).with_name("papers.yaml")


@dataclass(frozen=True)
class PaperTable:
    rows: dict = field(default_factory=dict)  # row id -> {field: value}, or variant -> (valid, test)
    note: str = ""
    no_claim_rows: tuple = ()  # rows whose paper number the discrepancy report explains (shown, not tested)


@dataclass(frozen=True)
class Floor:
    """A level the table's reference row must reach at the cpu scale (test split, mean over seeds)."""
    row: tuple  # row id, e.g. ("baseline",) or ("32", "highway")
    key: str  # metric key as the table shows it (test/acc in %)
    side: str  # "lower" (<=) or "higher" (>=)
    value: float
    best: bool = False  # True: the best run of the row (a random search), not the mean over seeds


@dataclass(frozen=True)
class Margin:
    value: float
    relative: bool  # True: a fraction of the compared row's mean
    reason: str


@dataclass(frozen=True)
class PaperClaim:
    table: str
    row: tuple
    against: tuple | float
    statistic: str
    side: str  # lower | higher
    says: str
    stated: str  # a key of STATED; the claim's type follows from it (`claim_type`)
    second_look: bool = False  # decided at the second look (stats.SECOND_LOOK)

    @property
    def claim_type(self) -> str:
        """CLAIM_TYPE_RULE: own (the paper states nothing of it); level, or artifact (the number of a row that the
        discrepancy report explains: its table's `no_claim_rows`); trend, or negligible (the paper's own effect under
        NEGLIGIBLE_SHARE of its compared value: `paper_effect`)."""
        if self.stated == "none":
            return "own"
        if self.stated == "number":
            table = HT.get(self.table)
            return "artifact" if table and set(self.row) & set(table.no_claim_rows) else "level"
        effect = paper_effect(self)
        return "negligible" if effect and effect[1] is not None and abs(effect[1]) < NEGLIGIBLE_SHARE else "trend"


def _row_id(key: str) -> tuple:
    return tuple(str(key).split("/"))


def _table(d: dict) -> PaperTable:
    rows = {_row_id(k) if isinstance(v, dict) else k: v if isinstance(v, dict) else tuple(v)
            for k, v in (d.get("rows") or {}).items()}
    return PaperTable(rows, d.get("note", ""), tuple(d.get("no_claim_rows", ())))


def _claim(table: str, d: dict) -> PaperClaim:
    against = tuple(d["against"]) if isinstance(d["against"], list) else float(d["against"])
    return PaperClaim(table, tuple(d["row"]), against, d["statistic"], d["side"], d["says"], d["stated"],
                      d.get("second_look", False))


_D = files.read_yaml(DATA, DATA.parent)  # plain data: no alias, no `${`
FIG1_TOP_K, FIG1_TRIALS, FIG1_QUANTILE, FIG1_TRAINS_BELOW, FIG1_HIGHWAY_FACTOR, FIG1_PLAIN_BELOW, FIG1_PAPER = (
    _D["fig1"][k] for k in ("top_k", "trials", "quantile", "trains_below", "highway_factor", "plain_below", "paper"))
HT = {name: _table(d) for name, d in _D["tables"].items() if name.startswith("ht_")}
HT.update({name: HT[like] for name, like in _D["same_as"].items()})
HN_TABLE1, HN_CIFAR = _table(_D["tables"]["hn_table1"]), _table(_D["tables"]["hn_cifar"])
TABLE1_CLAIM_STDS, CIFAR_CLAIM_AT_LEAST = _D["table1_claim_stds"], _D["cifar_claim_at_least"]
ENWIK8_L6_HOURS, ENWIK8_L6_LOG_STEPS = _D["enwik8_l6_hours"], _D["enwik8_l6_logs"]["steps"]
ENWIK8_L6_LOGS = {k: v for k, v in _D["enwik8_l6_logs"].items() if k != "steps"}
ANCHOR_STEP, ANCHOR_TOLERANCE_BPC = _D["anchor"]["step"], _D["anchor"]["tolerance_bpc"]
UNIGRAM, UNIGRAM_WARN = {k: tuple(v) for k, v in _D["unigram"].items()}, _D["unigram_warn"]
FLOORS = {t: [Floor(_row_id(f["row"]), f["key"], f["side"], f["value"], f.get("best", False)) for f in fs]
          for t, fs in _D["floors"].items()}
MARGINS = {k: Margin(**m) for k, m in _D["margins"].items()}
PAPER_EFFECT_SHARE = _D["paper_effect_share"]
CLAIM_TYPES, CLAIM_TYPE_RULE, NEGLIGIBLE_SHARE = _D["claim_types"], _D["claim_type_rule"], _D["negligible_share"]
STATED = ("order", "number", "none")  # what the paper states of a claim: an order of rows, a number, nothing
PAPER_CLAIMS = [_claim(t, c) for t, cs in _D["claims"].items() for c in cs]
SECOND_LOOK_CLAIMS = [c for c in PAPER_CLAIMS if c.second_look]


def table1_threshold(p: dict) -> float:
    return round(p["mean"] - TABLE1_CLAIM_STDS * p["std"], 6)


def margin_key(metric: str) -> str | None:
    """The key of MARGINS that covers `metric` (a mean over the evaluations: its own), or None."""
    return next((k for k in MARGINS if k == metric or (k == "mean over evaluations" and metric.startswith("mean "))),
                None)


def margin(metric: str, baseline_mean: float, effect: tuple[float, float | None] | None = None) -> float | None:
    """The delta of a comparison on `metric` (Measure.metric: 'bpc', 'mean bpc over evaluations', 'log10 loss', ...)
    whose compared row has mean `baseline_mean`; None for a metric with no margin (no comparison of two rows).
    `effect`: the paper's effect for the claim (`paper_effect`: absolute, relative to its compared row): the delta
    is at most PAPER_EFFECT_SHARE of it, the relative effect taken on our compared row's mean (our scale's numbers
    differ from the paper's), so that NO DIFFERENCE never covers an effect of the paper's size. Set from the
    papers' numbers and the metric, never from our results."""
    key = margin_key(metric)
    if key is None:
        return None
    m = MARGINS[key]
    delta = m.value * abs(baseline_mean) if m.relative else m.value
    if effect is not None:
        absolute, relative = effect
        paper = abs(relative * baseline_mean) if relative is not None else abs(absolute)
        delta = min(delta, PAPER_EFFECT_SHARE * paper) if paper > 0 else delta
    return delta


def paper_claim(table: str, row: tuple, against: tuple | float, statistic: str, side: str) -> PaperClaim | None:
    """The paper's claim on `table` comparing `row` with `against` (pooled: its rows' keys, flat), or None (ours)."""
    return next((c for c in PAPER_CLAIMS if (c.table, c.row, c.statistic, c.side) == (table, row, statistic, side) and (
        c.against == against if isinstance(c.against, tuple) else
        not isinstance(against, tuple) and math.isclose(c.against, against, rel_tol=1e-9))), None)


def paper_effect(claim: PaperClaim) -> tuple[float, float | None] | None:
    """The effect the paper reports for a claim of two rows, on the scale of our difference, and relative to the
    paper's compared row: the paper's value of the row minus the compared row's (B2: the split the claim names; the
    paper-size anchor: the official logs at ANCHOR_STEP); Fig. 1: log10 of the factor (no relative value); None where
    the paper gives no number for both rows."""
    if claim.table == "hn_fig1" and isinstance(claim.against, tuple):
        return -math.log10(FIG1_HIGHWAY_FACTOR), None
    if claim.table == "ht_paper_anchor" and claim.statistic == f"val/bpc@{ANCHOR_STEP}":  # the official logs
        a, b = (ENWIK8_L6_LOGS.get(side[0]) for side in (claim.row, claim.against))
        at = ENWIK8_L6_LOG_STEPS.index(ANCHOR_STEP)
        return (a[at] - b[at], (a[at] - b[at]) / b[at]) if a and b else None
    table = HT.get(claim.table)
    if table is None or not isinstance(claim.against, tuple) or len(claim.row) != 1:
        return None
    split = 0 if claim.statistic.startswith("val/") else 1 if claim.statistic.startswith("test/") else None
    a, b = table.rows.get(claim.row[0]), table.rows.get(claim.against[0])
    if split is None or a is None or b is None or a[split] is None or b[split] is None:
        return None
    return a[split] - b[split], (a[split] - b[split]) / b[split]
