"""The Highway Transformer tables (Chai et al., 2020) and the studies on them (the placement scan, the gate zoo, the
paper-size anchor): one row per gate variant, as the table's sweep files list them."""

from __future__ import annotations

import math
import statistics

from highway_repro.report import papers, stats
from highway_repro.grids import SWEEP_DIR, grid_of
from highway_repro.report.plots import T_BAND, Panel, curve_panel, plot, t_band
from highway_repro.report.prose import prose
from highway_repro.report.runs import Run
from highway_repro.report.claims import Claim
from highway_repro.report.measures import (NA, Column, Measure, column, count, mean_pm, params, paper, pct,
                                           ratio_to_baseline, rel_change, stat, steps_to_reach)
from highway_repro.report.spec import TableSpec

ZOO_MODELS = {"ht_char_ptb": "Transformer-L3, char-PTB", "ht_char_ptb_rt": "R-Transformer-L3, char-PTB",
              "ht_enwik8_l6": "Transformer-XL L6, enwik8 prefix"}


def sweep_rows(name: str) -> tuple[str, ...]:
    """Table `name`'s variants in display order, as `configs/sweep/<name>/` lists them (the paper scale's first)."""
    files = sorted((SWEEP_DIR / name).glob("*.yaml"), key=lambda f: (f.stem != "paper", f.stem))
    return tuple(dict.fromkeys(v for f in files for v in grid_of(f).get("variant", [])))


def _variant_label(row, v: str | None = None) -> str:
    """The runs' `variant_label` (configs/variant/<name>.yaml), else the variant's name (`v`, else the row's id)."""
    v = v or row.id[0]
    label = next((str(r.get("variant_label")) for r in row.runs if r.get("variant_label")), None)
    return f"{label} (`{v}`)" if label and label != v else f"`{v}`"


def _paper_num(x, metric: str) -> str | None:
    if x is None:
        return None
    return f"{x:.{max(3 if metric == 'bpc' else 2, len(repr(float(x)).partition('.')[2]))}f}"


def _settings(runs: list[Run]) -> str:
    """One line with the settings of the first run that kept its resolved config."""
    run = next((r for r in runs if (r.path / "config_resolved.yaml").exists()), None)
    if run is None:
        return "- settings used: unknown (no resolved config found)"
    m, d, o, t = (run.config.get(k, {}) for k in ("model", "data", "optim", "trainer"))
    extra = f", {m.get('rnn')} window {m.get('window')}" if m.get("rnn") else ""
    if m.get("mem_len") is not None:
        extra += f", mem {m.get('mem_len')} (eval tgt {m.get('eval_tgt_len')}, mem {m.get('eval_mem_len')})"
    sched, opt = o.get("scheduler") or {}, o.get("optimizer", {})
    cap, final = t.get("eval_max_batches"), t.get("final_max_batches")
    return prose("ht settings", data=d.get("name"), layers=m.get("n_layers"), d_model=m.get("d_model"),
                 heads=m.get("n_heads"), d_ff=m.get("d_ff", m.get("d_inner")), extra=extra, dropout=m.get("dropout"),
                 batch=d.get("batch_size"), seq=d.get("seq_len"), scored=d.get("score_len") or d.get("seq_len"),
                 eval_batch=d.get("eval_batch_size"), opt=str(opt.get("_target_", "?")).rsplit(".", 1)[-1],
                 lr=opt.get("lr"), schedule=sched.get("kind"),
                 horizon=f" over {sched['horizon']:,} steps" if sched.get("horizon") else "",
                 clip=t.get("grad_clip"), steps=t.get("max_steps"), every=t.get("eval_every"),
                 evals=f"intermediate evals {'complete' if cap is None else f'capped at {cap} batches'}",
                 final="final val/test complete" if final is None else
                 f"final val/test CAPPED at {final} batches: smoke numbers, not results")


def _unigram_note(runs: list[Run], metric: str, base) -> str:
    """The unigram level of the runs' data (papers.UNIGRAM), with a warning where our baseline ends near it."""
    data = next((r.get("data.name") for r in runs if r.get("data.name")), None)
    u = papers.UNIGRAM.get(data or "")
    if not u or u[0] != metric:
        return ""
    line = prose("ht unigram", data=data, val=u[1], test=u[2], metric=metric)
    test = base.mean(Measure(f"test/{metric}", "")) if base else math.nan
    if math.isfinite(test):
        ratio = test / u[2] if metric == "bpc" else math.log(test) / math.log(u[2])
        if ratio > papers.UNIGRAM_WARN:
            line += prose("ht unigram warning", test=f"{test:.4g}", metric=metric)
    return line


def ht_table(name: str, metric: str, time_column: bool = False, reference_curves: bool = False,
             extra_figure=None) -> TableSpec:
    """A Highway Transformer table: one row per gate variant, claims 'ends lower' and 'converges faster' per row;
    `extra_figure(t) -> [Panel]` draws after the validation curves."""
    pt, title = papers.HT[name], prose(f"title {name}")
    digits, auc_label = (4, "bpc") if metric == "bpc" else (2, "loss (nats)")
    val = Measure(f"val/{metric}", f"val {metric}", digits=digits)
    test = Measure(f"test/{metric}", f"test {metric}", digits=digits)
    auc = Measure("val/bpc" if metric == "bpc" else "val/loss", f"mean val {auc_label} over evals (AUC)", how="auc")
    base_p = pt.rows.get("baseline", (None, None))

    def paper_pair(row_id):
        return pt.rows.get(row_id[0], (None, None))

    def claim_measure(row, t=None):  # the paper compares a row on val only where it gives no test value
        p = (None, None) if row.id[0] in pt.no_claim_rows else paper_pair(row.id)  # our claim: on test
        return val if (p[1] is None and p[0] is not None) else test

    def paper_rel(row_id):
        p = paper_pair(row_id)
        i = 1 if (p[1] is not None and base_p[1] is not None) else 0
        if row_id[0] == "baseline" or p[i] is None or base_p[i] is None:
            return None, None
        return pct(p[i], base_p[i]) + ("" if i == 1 else " (val)"), p[i] < base_p[i]

    columns = [params(), count(), stat(val), stat(test),
               rel_change(claim_measure, "Δ test vs baseline", "rel_vs_baseline")]
    if pt.rows:
        columns += [paper(f"paper val {metric}", lambda i: _paper_num(paper_pair(i)[0], metric), "paper_val"),
                    paper(f"paper test {metric}", lambda i: _paper_num(paper_pair(i)[1], metric), "paper_test"),
                    paper("paper Δ vs baseline", lambda i: paper_rel(i)[0], "paper_rel_vs_baseline")]
    columns += [stat(auc), rel_change(auc, "Δ AUC vs baseline", "rel_auc_vs_baseline"),
                steps_to_reach(val, f"steps to reach the baseline's last eval's val {metric}")]
    if time_column:
        columns += [ratio_to_baseline(Measure("perf/tokens_per_s", "tokens/s", how="rate", lower_is_better=False),
                                      "time/step vs baseline"),
                    ratio_to_baseline(Measure("perf/cpu_s_per_step", "CPU-s per step", how="rate"),
                                      "CPU time/step vs baseline")]
    if time_column and reference_curves:  # the paper gives training hours for the 6-layer runs only
        hours = papers.ENWIK8_L6_HOURS
        columns.append(paper("paper time vs baseline", lambda i: f"{hours[i[0]] / hours['baseline']:.3f}x "
                             f"({hours[i[0]]} h)" if i[0] in hours else None, "paper_hours"))

    def claims(by_id) -> list[Claim]:
        out = []
        for row_id in (i for i in by_id if i != ("baseline",)):
            p, m = paper_pair(row_id), claim_measure(by_id[row_id])
            rel, lower = (None, None) if row_id[0] in pt.no_claim_rows else paper_rel(row_id)
            side = "lower" if lower in (True, None) else "higher"
            out.append(Claim(f"ends {side} than the baseline", row_id, m, side, ("baseline",),
                             paper_note=f"; paper {rel}" if rel else "", paper_value=p[1] if m is test else p[0]))
            out.append(Claim("converges faster than the baseline", row_id, auc, "lower", ("baseline",), reach=val))
        measures = {val.name: val, test.name: test}
        for pc in papers.PAPER_CLAIMS:  # the paper's comparisons of two gated rows (placement: bottom vs top)
            if pc.table == name and pc.against != ("baseline",):
                row = tuple((v,) for v in pc.row) if len(pc.row) > 1 else pc.row  # several rows: pooled
                against = tuple((v,) for v in pc.against) if len(pc.against) > 1 else pc.against
                out.append(Claim(f"ends {pc.side} than {' + '.join(pc.against)}: {pc.says}", row,
                                 measures[pc.statistic], pc.side, against))
        return out

    def notes(runs, t) -> str:
        best = any(r.config.get("trainer", {}).get("final_eval") == "best" for r in runs)
        weights = prose("ht best weights") if best else "after the last step"
        text = (prose("ht columns", metric=metric, weights=weights, auc_label=auc_label) + "\n\n" + _settings(runs)
                + "\n" + _unigram_note(runs, metric, t.baseline_row))
        return text + ("\n\n" + prose("ht time") if time_column else "")

    def figure(t, path):
        ours = curve_panel(t.rows, val.key, title.split(": ", 1)[-1].split(" (")[0]
                           + f"\nours: val {metric} by step, mean over seeds", logy=metric == "ppl")
        if not reference_curves:
            extra = extra_figure(t) if extra_figure else []
            return plot(path, [ours] + extra, ncols=min(3, 1 + len(extra)))
        label = {row.id[0]: row.label for row in t.rows}
        ours.colors = {row.label: f"C{i % 10}" for i, row in enumerate(t.rows)}
        ours.title = "ours (this scale): val bpc by step"
        ref = Panel("PAPER SCALE reference: official training logs (d 512, 40k steps), val bpc",
                    {f"{label.get(v, v)} (official log)": (papers.ENWIK8_L6_LOG_STEPS, ys)
                     for v, ys in papers.ENWIK8_L6_LOGS.items()}, val.key, dashed=True)
        ref.colors = {f"{label.get(v, v)} (official log)": ours.colors.get(label.get(v)) for v in papers.ENWIK8_L6_LOGS}
        return plot(path, [ours, ref], panel_size=(6.0, 4.5))

    return TableSpec(title, keys=("variant",), columns=tuple(columns), primary=test, claims=claims,
                     order={"variant": sweep_rows(name)}, baseline=("baseline",), label=_variant_label,
                     label_header="variant", paper=pt,
                     paper_of=lambda row_id, split: paper_pair(row_id)[0 if split == "val" else 1],
                     notes=notes, figure=figure)


def placement_panels(t) -> list[Panel]:
    """Final test bpc and AUC against the gated layer k, with the baseline and the all-layers row as flat lines over
    every k of the grid (trained or not); each a mean over seeds with its band."""
    test, auc = Measure("test/bpc", "test bpc"), Measure("val/bpc", "", how="auc")

    def layer(v: str) -> int | None:
        return int(v[len("tanh_l"):]) if v.startswith("tanh_l") and v[len("tanh_l"):].isdigit() else None

    ks = sorted(k for (v,), row in t.by_id.items() if (k := layer(v)) is not None and row.done)
    grid = {layer(v) for v in (*t.spec.order.get("variant", ()), *(v for (v,) in t.by_id))} - {None}
    k_only, flat = "SDU tanh in layer k only", {"baseline": "baseline (no gate)", "sdu_tanh": "SDU tanh, all layers"}
    lines = {}  # label -> (xs, the row at each x)
    if ks:
        lines[k_only] = (ks, [t.by_id[(f"tanh_l{k}",)] for k in ks])
        for v, label in flat.items():
            if (row := t.by_id.get((v,))) and row.done:
                lines[label] = ([min(grid), max(grid)], [row] * 2)
    colors = {k_only: "black", flat["baseline"]: "C0", flat["sdu_tanh"]: "C1"}  # the flat rows: as in panel 1
    styles = {k_only: {"marker": "o", "ms": 5}} | {label: {"ls": "--"} for label in flat.values()}
    panels = []
    for m, title in ((test, "final test bpc vs the one gated layer k"), (auc, "mean val bpc over the run (AUC) vs k")):
        bands = {label: t_band(xs, [row.values(m) for row in rows]) for label, (xs, rows) in lines.items()}
        panels.append(Panel(title, {label: (xs, [row.mean(m) for row in rows]) for label, (xs, rows) in lines.items()},
                            "bpc", xlabel="gated layer k", colors=colors, styles=styles,
                            bands={k: b for k, b in bands.items() if b}, band_label=T_BAND))
    return panels


def paper_anchor_table() -> TableSpec:
    """The 6-layer Transformer-XL at the paper's size and recipe, its first ANCHOR_STEP steps on the enwik8 prefix,
    beside the official training logs of the paper's Table 4 runs (Chai et al. 2020)."""
    step, tol = papers.ANCHOR_STEP, papers.ANCHOR_TOLERANCE_BPC
    at = {s: Measure("val/bpc", f"val bpc, step {s}", how="at", step=s) for s in (100, 200, 300, step)}
    last = at[step]
    test = Measure("test/bpc", f"test bpc after step {step}")

    def official(row_id):
        ys = papers.ENWIK8_L6_LOGS.get(row_id[0])
        return ys[papers.ENWIK8_L6_LOG_STEPS.index(step)] if ys else None

    def gap(row):  # (mean - official, its 95 % t-interval or None)
        ref, vals = official(row.id), row.values(last)
        if ref is None or not vals:
            return None, None
        ci = stats.mean_interval(vals)
        return statistics.fmean(vals) - ref, (ci[0] - ref, ci[1] - ref) if ci else None

    def gap_cell(row, t):
        d, ci = gap(row)
        return NA if d is None else f"{d:+.4f}" + (f" [{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else " (1 seed)")

    def within_cell(row, t):
        d, ci = gap(row)
        if d is None:
            return NA
        lo, hi = ci or (d, d)
        word = "yes" if -tol <= lo and hi <= tol else "no" if hi < -tol or lo > tol else "undecided"
        return word + ("" if ci else " (1 seed, no interval)")

    columns = (params(), count(), *(stat(m) for m in at.values()),
               paper(f"official log, step {step}", official, "official_val_bpc"),
               Column("ours - official (95 % interval)", gap_cell, lambda row, t: {"minus_official": gap(row)[0]}),
               column(f"within {tol} bpc", "within_tolerance", within_cell),
               stat(test))

    def claims(by_id) -> list[Claim]:
        return [Claim(f"ends {pc.side} than {'the baseline' if pc.against == ('baseline',) else pc.against[0]} at step "
                      f"{step}: {pc.says}", pc.row, last, pc.side, pc.against)
                for pc in papers.PAPER_CLAIMS if pc.table == "ht_paper_anchor"]

    def notes(runs, t) -> str:
        return prose("anchor data", step=step, tol=tol) + "\n\n" + _settings(runs)

    def figure(t, path):
        ours = curve_panel(t.rows, "val/bpc", "ours, paper size, enwik8 prefix: val bpc by step (mean over seeds)")
        ours.colors = {row.label: f"C{i % 10}" for i, row in enumerate(t.rows)}
        label = {row.id[0]: row.label for row in t.rows}
        for v in papers.ENWIK8_L6_LOGS:  # the official logs' step-400 points, as stars in the row's color
            name = f"{label.get(v, v)} (official log, full corpus)"
            ours.series[name] = ([step], [official((v,))])
            ours.colors[name] = ours.colors.get(label.get(v))
            ours.styles[name] = {"ls": "none", "marker": "*", "ms": 11}
        plot(path, [ours])

    return TableSpec(prose("title ht_paper_anchor"), keys=("variant",), columns=columns, primary=last,
                     claims=claims, order={"variant": sweep_rows("ht_paper_anchor")}, baseline=("baseline",),
                     label=_variant_label, label_header="variant",
                     paper_of=lambda row_id, split: official(row_id) if split == "val" else None, notes=notes,
                     figure=figure)


def gate_zoo_table() -> TableSpec:
    """The gate zoo: every gate kind on every model, each gated row against its model's baseline and its
    parameter-matched baseline; a pivot of the verdicts per (kind, model) cell."""
    test = Measure("test/bpc", "test bpc")
    auc = Measure("val/bpc", "mean val bpc over evals (AUC)", how="auc")
    rows = sweep_rows(f"ht_zoo_{next(iter(ZOO_MODELS)).removeprefix('ht_')}")  # every part has the same rows

    def label(row) -> str:
        return f"{ZOO_MODELS.get(row.id[0], row.id[0])}: {_variant_label(row, row.id[1])}"

    def delta_vs(other: str, header: str, name: str) -> Column:
        def value(row, t):
            base = t.by_id.get((row.id[0], other))
            return NA if base is None or base is row else pct(row.mean(test), base.mean(test))
        return column(header, name, value)

    def claims(by_id) -> list[Claim]:
        bases = {"baseline": "the baseline", "baseline_matched": "the parameter-matched baseline"}
        return ([Claim(f"ends lower than {bases[b]}", (m, v), test, "lower", (m, b)) for m, v in by_id
                 if v not in bases for b in bases]
                + [Claim("ends lower than the baseline", (m, v), test, "lower", (m, "baseline")) for m, v in by_id
                   if v == "baseline_matched"])

    def cell(row, results: dict) -> str:
        if row is None or not row.done:
            return NA
        text = mean_pm(row.values(test), 4)
        for other, short in (("baseline", "vs base"), ("baseline_matched", "vs matched")):
            r = results.get((row.id, other))
            if r and r.ci is not None:
                text += f"; {short} {r.diff:+.3f} [{r.ci[0]:+.3f}, {r.ci[1]:+.3f}] {r.verdict}"
            elif r and math.isfinite(r.diff):
                text += f"; {short} {r.diff:+.3f} ({r.verdict})"
        return text

    def notes(runs, t) -> str:
        results = {(r.claim.row, r.claim.against[1]): r for r in t.results if r.claim.kind == "claim"}
        models = [m for m in ZOO_MODELS if any(k[0] == m for k in t.by_id)]
        lines = [prose("zoo verdicts"), "",
                 "| gate | " + " | ".join(ZOO_MODELS[m] for m in models) + " |", "|---|" + "---|" * len(models)]
        lines += [f"| `{v}` | " + " | ".join(cell(t.by_id.get((m, v)), results) for m in models) + " |" for v in rows]
        return "\n".join(lines) + "\n\n" + "\n".join(_settings([r for r in runs if r.get("name") == m])
                                                     for m in models)

    return TableSpec(prose("title ht_gate_zoo"), keys=("name", "variant"), label=label, label_header="model: variant",
                     columns=(params(), count(), stat(test),
                              delta_vs("baseline", "Δ test vs baseline", "rel_vs_baseline"),
                              delta_vs("baseline_matched", "Δ test vs matched baseline", "rel_vs_matched"),
                              stat(auc)),
                     primary=test, claims=claims,
                     order={"name": tuple(ZOO_MODELS), "variant": rows}, paper=papers.HT["ht_gate_zoo"],
                     notes=notes)
