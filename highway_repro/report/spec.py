"""One table style for both papers: a `TableSpec` (rows grouped by config `keys`, columns, claims, floors), rendered
into Markdown, CSV and the tested claims."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from typing import Callable

from highway_repro.report.prose import prose
from highway_repro.report.claims import Claim, ClaimResult, claim_line, family, floor_claim, pooled, test_claim
from highway_repro.report.measures import Measure, Row
from highway_repro.report import papers
from highway_repro.report.papers import PaperTable
from highway_repro.report.runs import Run


@dataclass(frozen=True)
class TableSpec:
    title: str
    keys: tuple  # config keys that place a run in a row
    columns: tuple  # Column, ... (after the row's key cells)
    primary: Measure  # the row's number in results/summary.csv; the floors' measure (papers.FLOORS)
    claims: tuple | Callable = ()  # Claim, ... or fn(rows: dict id -> Row) -> [Claim]
    order: dict = field(default_factory=dict)  # key -> values in display order (others after, sorted)
    baseline: tuple | None = None  # the row deltas and ratios compare with
    label: Callable | None = None  # fn(row) -> str; None: the key values, one column each
    label_header: str = ""
    primary_pick: str = "all"  # "best": the summary gives the row's best run (a random search)
    paper: PaperTable | None = None
    paper_of: Callable | None = None  # fn(row id, split) -> the paper's number for the row (summary.csv)
    notes: str | Callable = ""  # text, or fn(runs, table: Rendered) -> text
    figure: Callable | None = None  # fn(table: Rendered, path)


@dataclass
class Rendered:
    spec: TableSpec
    rows: list[Row]
    by_id: dict
    baseline_row: Row | None
    results: list[ClaimResult]  # claims, then floors


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


def claims_of(spec: TableSpec, by_id: dict, name: str) -> list[Claim]:
    """The spec's claims and table `name`'s floors on the rows the runs have (a smoke sweep may have others)."""
    claims = list(spec.claims(by_id) if callable(spec.claims) else spec.claims)
    claims += [floor_claim(f, spec.primary) for f in papers.FLOORS.get(name, ())]
    return [c for c in claims if (all(i in by_id for i in c.row) if pooled(c.row) else c.row in by_id)]


def render(spec: TableSpec, runs: list[Run], name: str = "", elsewhere: Callable | None = None
           ) -> tuple[Rendered, str, str]:
    """-> (rendered table, Markdown body (no header), CSV text); `elsewhere`: the comparisons another table holds."""
    rows = group(spec, runs)
    by_id = {r.id: r for r in rows}
    t = Rendered(spec, rows, by_id, by_id.get(spec.baseline) if spec.baseline else None, [])
    t.results = [test_claim(c, by_id, name, spec.keys) for c in claims_of(spec, by_id, name)]
    family(t.results, elsewhere)
    key_heads = [spec.label_header] if spec.label else [k.split(".")[-1] for k in spec.keys]
    head = key_heads + [c.header for c in spec.columns]
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    csv_rows = []
    for row in rows:
        keys = [row.label] if spec.label else list(row.id)
        md.append("| " + " | ".join(keys + [c.cell(row, t) for c in spec.columns]) + " |")
        csv_rows.append({**dict(zip(spec.keys, row.id)), "label": row.name,
                         **{k: v for c in spec.columns if c.csv for k, v in c.csv(row, t).items()},
                         "failed": "; ".join(f"{r.path.name}: {r.error}" for r in row.failed)})
    failed = [f"- {row.label}, `{r.path.name}`: {r.error}".replace("|", "/") for row in rows for r in row.failed]
    if failed:
        md += ["", "Runs that did not finish (their rows count only the finished runs):", *failed]
    claims = [r for r in t.results if r.claim.kind == "claim"]
    floors = [r for r in t.results if r.claim.kind == "floor"]
    if claims:
        md += ["", f"**Claims** (95 % intervals, 99 % at a second look; {prose('verdicts')}):"]
        md += [f"- {claim_line(r)}" for r in claims]
    if floors:
        md += ["", "**Floors** of the cpu scale (met = the mean, or the best run, on the floor's side):"]
        md += [f"- {r.line}; met: **{'yes' if floor_met(r) else 'no'}**" for r in floors]
    notes = spec.notes(runs, t) if callable(spec.notes) else spec.notes
    paper_note = spec.paper.note if spec.paper else ""
    body = "\n".join(md) + "\n" + "".join(f"\n{n.strip()}\n" for n in (notes, paper_note) if n and n.strip())
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for r in csv_rows for k in r)))
    w.writeheader()
    w.writerows(csv_rows)
    return t, body, buf.getvalue()


def floor_met(res: ClaimResult) -> bool:
    c, v = res.claim, res.mean
    return math.isfinite(v) and (v <= c.against if c.side == "lower" else v >= c.against)
