"""Highway Transformer (Chai et al., ACL 2020, arXiv 2004.08178) tables, built from run folders.

Imported by `tables._load_extra_tables` (tables register themselves with
`@register`) and by `reproduce._register_ht_targets` (`TARGETS`). Every sweep
selects its row with the one key `variant` (configs/experiment/ht_*.yaml maps it
to the model's gate options) and repeats it over `seed`.

Each table states, per variant: final val/test metric (mean ± std over seeds),
the relative change against the baseline next to the paper's relative change, the
mean validation metric over the evaluation history (area under the curve / number
of evaluations: lower = converges faster), and, per gated variant, whether the
two claims held at this scale: "ends lower than the baseline" (final test, or val
where the paper gives no test value) and "converges faster" (lower mean val over the
history). Paper numbers: ../shared/REFERENCE.md B2 (UNVERIFIED there unless marked).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from highway_repro.report import Run, aggregate, curves, fmt, plot_curves
from highway_repro.reproduce import Target
from highway_repro.tables import Table, _pct, register

# ------------------------------------------------------------------ targets
_SMOKE = ["seed=0"]
_PTB = {"paper": ["seed=1111"], "smoke": _SMOKE}  # cpu: the sweep's seeds 0,1,2
_ENWIK8 = {"paper": ["seed=1111"], "cpu": ["seed=0"], "smoke": _SMOKE}  # cpu: one seed

TARGETS = {
    "ht_char_ptb": Target("highway_transformer/char_ptb_l3", "ht_char_ptb", "ht_char_ptb", _PTB),
    "ht_word_ptb": Target("highway_transformer/word_ptb_rt", "ht_word_ptb", "ht_word_ptb", _PTB),
    "ht_char_ptb_rt": Target("highway_transformer/char_ptb_rt", "ht_char_ptb_rt", "ht_char_ptb_rt", _PTB),
    "ht_word_ptb_l3": Target("highway_transformer/word_ptb_l3", "ht_word_ptb_l3", "ht_word_ptb_l3", _PTB),
    "ht_enwik8_l6": Target("highway_transformer/enwik8_l6", "ht_enwik8_l6", "ht_enwik8_l6", _ENWIK8),
    "ht_enwik8_l12": Target("highway_transformer/enwik8_l12", "ht_enwik8_l12", "ht_enwik8_l12", _ENWIK8),
}

# ------------------------------------------------------------------ labels and paper values
LABELS = {
    "baseline": "baseline (no gate)",
    "sdu_sigmoid": "SDU sigmoid, all layers",
    "sdu_tanh": "SDU tanh, all layers",
    "highway": "highway gate, all layers",
    "gated_attn": "gated MHDPA, all layers",
    "tanh_l1_3": "SDU tanh, layers 1-3",
    "tanh_l3_6": "SDU tanh, layers 3-6",
    "tanh_attn_only": "SDU tanh, layers 1-6, attention only (no FFN gates)",
    "tanh_l1": "SDU tanh, layer 1",
    "tanh_l1_2": "SDU tanh, layers 1-2",
    "tanh_all": "SDU tanh, all 12 layers",
    "sigmoid_l1_2": "SDU sigmoid, layers 1-2",
}

# enwik8 6 layers, validation bpc by step from the official training logs (REFERENCE.md B2, VERIFIED)
ENWIK8_L6_LOG_STEPS = [400, 4000, 10000, 20000, 30000, 40000]
ENWIK8_L6_LOGS = {
    "baseline": [2.5668, 1.5726, 1.4345, 1.3396, 1.2912, 1.2758],
    "sdu_tanh": [2.4276, 1.5515, 1.4082, 1.3110, 1.2565, 1.2410],
    "sdu_sigmoid": [2.4486, 1.5534, 1.4086, 1.3059, 1.2534, 1.2374],
    "highway": [2.4669, 1.5555, 1.4165, 1.3220, 1.2706, 1.2541],
}
# training time, 6 layers, hours (REFERENCE.md B2)
ENWIK8_L6_HOURS = {"baseline": 21.16, "sdu_tanh": 21.45, "sdu_sigmoid": 21.87, "highway": 21.93, "gated_attn": 21.10}


# Unigram reference (add-one smoothed training-split counts scored on val / test; measured from the data
# layer's streams): the level a model reaches by learning symbol frequencies only.
UNIGRAM = {"ptb_char_raw": ("bpc", 4.3052, 4.3151), "ptb_word": ("ppl", 684.73, 639.79),
           "enwik8_prefix": ("bpc", 5.0253, 5.0853)}


@dataclass
class Spec:
    title: str
    metric: str  # bpc | ppl
    variants: list[str]
    paper: dict = field(default_factory=dict)  # variant -> (valid or None, test or None)
    notes: str = ""
    time_column: bool = False
    reference_curves: bool = False


SPECS = {
    "ht_char_ptb": Spec(
        "Highway Transformer: Transformer-L3 on char-PTB (bpc)", "bpc",
        ["baseline", "sdu_sigmoid", "sdu_tanh", "highway", "gated_attn"],
        {"baseline": (1.541, 1.495), "sdu_sigmoid": (1.410, 1.371), "sdu_tanh": (1.401, 1.364)},
        "Data: `ptb_char_raw`, the R-Transformer/TCN form of char-PTB (the word-level files read as a raw "
        "character stream, each line end one `<eos>` symbol; vocabulary 50), the form the paper most likely "
        "used (UNVERIFIED, REFERENCE.md C). Paper values: REFERENCE.md B2 (UNVERIFIED; a secondary source labels "
        "them 'PPL', they are bpc). The highway-gate and gated-MHDPA rows are our extra rows (no paper value)."),
    "ht_word_ptb": Spec(
        "Highway Transformer: R-Transformer-L3 on word-PTB (perplexity)", "ppl",
        ["baseline", "sdu_sigmoid", "sdu_tanh"],
        {"baseline": (None, 92.31), "sdu_sigmoid": (None, 87.88), "sdu_tanh": (None, 84.92)},
        "Paper values: test perplexity, REFERENCE.md B2 (UNVERIFIED; the R-Transformer paper itself reports "
        "84.38 for its baseline). The paper gives no validation perplexities."),
    "ht_char_ptb_rt": Spec(
        "Highway Transformer: R-Transformer-L3 on char-PTB (bpc; no paper numbers)", "bpc",
        ["baseline", "sdu_sigmoid", "sdu_tanh"], {},
        "The paper reports no R-Transformer result on char-PTB: this table is our extra, so no paper column "
        "and no 'paper claim' for it; the claim lines test the paper's general claim (SDU gates end lower "
        "and converge faster) on this pair. Data: `ptb_char_raw` (R-Transformer/TCN form)."),
    "ht_word_ptb_l3": Spec(
        "Highway Transformer: Transformer-L3 on word-PTB (perplexity; no paper numbers)", "ppl",
        ["baseline", "sdu_sigmoid", "sdu_tanh"], {},
        "The paper reports no Transformer-L3 result on word-PTB: this table is our extra, so no paper column; "
        "the claim lines test the paper's general claim (SDU gates end lower and converge faster) on this pair."),
    "ht_enwik8_l6": Spec(
        "Highway Transformer: 6-layer Transformer-XL on enwik8 (bpc), gate kinds and placement", "bpc",
        ["baseline", "sdu_sigmoid", "sdu_tanh", "highway", "gated_attn", "tanh_l1_3", "tanh_l3_6",
         "tanh_attn_only"],
        {"baseline": (1.276, 1.24339), "sdu_sigmoid": (1.237, 1.21123), "sdu_tanh": (1.241, 1.21424),
         "highway": (1.2541, None), "tanh_l1_3": (1.249, None), "tanh_l3_6": (1.277, None)},
        "Paper values: REFERENCE.md B2 (UNVERIFIED, except the highway-gate valid 1.2541 at 40k steps, read "
        "from the official training logs, VERIFIED). The paper's 'layers 3-6' valid 1.277 equals the baseline "
        "because the official code's placement works for prefixes only (the first ungated layer turns gating "
        "off for all later layers), so that run most likely trained the baseline; ours gates exactly layers 3-6. "
        "The official 'attention only, no FFN gate' mode exits at the first step, so the paper has no number "
        "for it. Gated MHDPA: training time only. Training-time column: time per step relative to the "
        "baseline = baseline tokens/s / variant tokens/s (mean of the runs' perf/tokens_per_s), against the "
        "paper's hours (baseline 21.16 h).", time_column=True, reference_curves=True),
    "ht_enwik8_l12": Spec(
        "Highway Transformer: 12-layer Transformer-XL on enwik8 (bpc), gate placement", "bpc",
        ["baseline", "tanh_l1", "tanh_l1_2", "tanh_all", "sigmoid_l1_2"],
        {"baseline": (None, 1.07160), "tanh_l1": (None, 1.06960), "tanh_l1_2": (None, 1.06904),
         "tanh_all": (None, 1.12797), "sigmoid_l1_2": (None, 1.07148)},
        "Paper values: test bpc, REFERENCE.md B2 (UNVERIFIED). Paper's claim: gates in the first one or two "
        "layers help a deep model a little, tanh gates in all 12 layers hurt (+5.3 %); the claim lines test "
        "the direction of each row's change against the baseline.", time_column=True),
}


# ------------------------------------------------------------------ helpers
def _variant(r: Run) -> str:
    return r.overrides.get("variant", "baseline")


def _history_mean(r: Run, key: str) -> float:
    """Mean of `key` over the run's evaluation records (area under the curve / number of evaluations)."""
    vals = [float(h[key]) for h in r.history if isinstance(h.get(key), (int, float)) and math.isfinite(h[key])]
    return statistics.fmean(vals) if vals else math.nan


def _tokens_per_s(r: Run) -> float:
    vals = [float(h["perf/tokens_per_s"]) for h in r.history if isinstance(h.get("perf/tokens_per_s"), (int, float))]
    vals = vals[1:] or vals  # the first interval includes start-up costs
    return statistics.fmean(vals) if vals else math.nan


def _ms(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _data_name(runs: list[Run]) -> str | None:
    import yaml

    for r in runs:
        p = r.path / "config_resolved.yaml"
        if p.exists():
            return ((yaml.safe_load(p.read_text()) or {}).get("data") or {}).get("name")
    return None


def _unigram_note(runs: list[Run], metric: str, base: dict | None) -> str:
    u = UNIGRAM.get(_data_name(runs) or "")
    if not u or u[0] != metric:
        return ""
    line = (f"- unigram reference on `{_data_name(runs)}` (training-split symbol frequencies only, measured): "
            f"val {u[1]} / test {u[2]} {metric}")
    if base and base["row"]["n"] and math.isfinite(base["test"][0]):
        ratio = base["test"][0] / u[2] if metric == "bpc" else math.log(base["test"][0]) / math.log(u[2])
        if ratio > 0.95:
            line += (f". **Our baseline ends at {base['test'][0]:.4g} test {metric}, within 5 % of (or above) the "
                     "unigram level: at this scale the models have learned little beyond symbol frequencies, so "
                     "the comparison only speaks about the very first phase of training, not about the paper's "
                     "converged numbers.**")
    return line + "\n"


def _settings(runs: list[Run]) -> str:
    """One line with the settings the runs actually used (from the first run's resolved config)."""
    import yaml

    for r in runs:
        p = r.path / "config_resolved.yaml"
        if p.exists():
            c = yaml.safe_load(p.read_text()) or {}
            m, d, o, t = c.get("model", {}), c.get("data", {}), c.get("optim", {}), c.get("trainer", {})
            opt = str(o.get("optimizer", {}).get("_target_", "?")).rsplit(".", 1)[-1]
            width = f"d {m.get('d_model')}, {m.get('n_heads')} heads, d_ff {m.get('d_ff', m.get('d_inner'))}"
            extra = f", {m.get('rnn')} window {m.get('window')}" if m.get("rnn") else ""
            if m.get("mem_len") is not None:
                extra += f", mem {m.get('mem_len')} (eval tgt {m.get('eval_tgt_len')}, mem {m.get('eval_mem_len')})"
            return (f"- settings used: data `{d.get('name')}`, {m.get('n_layers')} layers, {width}{extra}, dropout "
                    f"{m.get('dropout')}; batch {d.get('batch_size')} x seq {d.get('seq_len')} (scored "
                    f"{d.get('score_len') or d.get('seq_len')}), eval batch {d.get('eval_batch_size')}; {opt} lr "
                    f"{o.get('optimizer', {}).get('lr')}, schedule {o.get('scheduler', {}).get('kind')}, clip "
                    f"{t.get('grad_clip')}; {t.get('max_steps')} steps, val every {t.get('eval_every')} "
                    f"(intermediate evals capped at {t.get('eval_max_batches')} batches; "
                    + ("final val/test complete)" if t.get("final_max_batches") is None else
                       f"final val/test CAPPED at {t.get('final_max_batches')} batches: smoke numbers, not results)"))
    return "- settings used: unknown (no resolved config found)"


def _paper_num(x, metric: str) -> str:
    if x is None:
        return "—"
    dec = len(repr(float(x)).split(".")[1])
    return f"{x:.{max(3 if metric == 'bpc' else 2, dec)}f}"


def _verdict(better: bool, gap: float, spread: float, seeds: int) -> str:
    """HELD / DID NOT HOLD, and NOT RESOLVED when the gap is inside the seeds' spread (std)."""
    if not better:
        return "DID NOT HOLD"
    if seeds < 2:
        return "HELD (one seed: no error bar)"
    if gap <= spread:
        return f"NOT RESOLVED (better in the mean by {gap:.3g}, inside the seed std {spread:.3g})"
    return f"HELD (gap {gap:.3g} > seed std {spread:.3g})"


def _label(v: str) -> str:
    return f"{LABELS.get(v, v)} (`{v}`)"


def _ht_table(spec: Spec, runs: list[Run]) -> Table:
    metric = spec.metric
    val_key, test_key = f"val/{metric}", f"test/{metric}"
    auc_key = "val/bpc" if metric == "bpc" else "val/loss"  # word level: mean val loss (= mean log ppl)
    for r in runs:  # aggregate() groups by overrides: make sure every run has a `variant`
        r.overrides.setdefault("variant", "baseline")
    agg = {row["key"]["variant"]: row for row in aggregate(runs, ["variant"], [val_key, test_key, "model/params"])}
    order = [v for v in spec.variants if v in agg] + sorted(v for v in agg if v not in spec.variants)
    stats = {}
    for v in order:
        row = agg[v]
        done = [r for r in row["runs"] if r.status == "done"]
        auc = _ms([_history_mean(r, auc_key) for r in done])
        tps = _ms([_tokens_per_s(r) for r in done])
        stats[v] = {"row": row, "val": row[val_key][:2], "test": row[test_key][:2], "auc": auc, "tps": tps[0],
                    "params": int(row["model/params"][0]) if row["n"] else 0}
    base = stats.get("baseline")
    pb = spec.paper.get("baseline", (None, None))
    digits = 4 if metric == "bpc" else 2
    has_paper = bool(spec.paper)

    head = ["variant", "params", "n", f"val {metric}", f"test {metric}", "Δ test vs baseline"]
    if has_paper:
        head += [f"paper val {metric}", f"paper test {metric}", "paper Δ vs baseline"]
    head += [f"mean val {'bpc' if metric == 'bpc' else 'loss (nats)'} over evals (AUC)", "Δ AUC vs baseline"]
    if spec.time_column:
        head += ["time/step vs baseline", "paper time vs baseline"]
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = [["variant", "label", "params", "n", "val_mean", "val_std", "test_mean", "test_std", "rel_test_vs_baseline",
             "paper_val", "paper_test", "paper_rel_vs_baseline", "auc_mean", "auc_std", "rel_auc_vs_baseline",
             "tokens_per_s", "time_per_step_vs_baseline", "paper_hours", "failed"]]
    claims = []
    for v in order:
        s, row = stats[v], stats[v]["row"]
        n = row["n"]
        failed = "; ".join(row["failed"]).replace("|", "/")
        fail_cell = f"failed: {failed}" if failed else ""
        val_cell = fmt(*s["val"], n, digits) if n else (fail_cell or "—")
        test_cell = fmt(*s["test"], n, digits) if n else (fail_cell or "—")
        # ends lower: test, or val when the paper's comparison is on val only
        p = spec.paper.get(v, (None, None))
        use_test = not (p[1] is None and p[0] is not None)  # the paper compares this row on val only
        ours_key = "test" if use_test else "val"
        rel = _pct(s[ours_key][0], base[ours_key][0]) if base and v != "baseline" else "—"
        p_rel = "—"
        if v != "baseline" and p != (None, None):
            i = 1 if (p[1] is not None and pb[1] is not None) else 0
            if p[i] is not None and pb[i] is not None:
                p_rel = _pct(p[i], pb[i]) + ("" if i == 1 else " (val)")
        auc_cell = fmt(*s["auc"], n, 4) if n else "—"
        auc_rel = _pct(s["auc"][0], base["auc"][0]) if base and v != "baseline" else "—"
        cells = [_label(v), f"{s['params']:,}", str(n), val_cell, test_cell,
                 rel + ("" if use_test or rel == "—" else " (val)")]
        if has_paper:
            cells += [_paper_num(p[0], metric), _paper_num(p[1], metric), p_rel]
        cells += [auc_cell, auc_rel]
        t_rel = math.nan
        if spec.time_column:
            if base and math.isfinite(s["tps"]) and math.isfinite(base["tps"]) and s["tps"] > 0:
                t_rel = base["tps"] / s["tps"]
            ph = ENWIK8_L6_HOURS.get(v) if spec.reference_curves else None
            cells += [f"{t_rel:.2f}x" if math.isfinite(t_rel) else "—",
                      f"{ph / ENWIK8_L6_HOURS['baseline']:.3f}x ({ph} h)" if ph else "—"]
        md.append("| " + " | ".join(cells) + " |" + (f" {fail_cell}" if fail_cell and n else ""))
        rows.append([v, LABELS.get(v, v), s["params"], n, *s["val"], *s["test"], rel, p[0], p[1], p_rel, *s["auc"],
                     auc_rel, s["tps"], t_rel, ENWIK8_L6_HOURS.get(v, "") if spec.reference_curves else "", failed])
        # claims
        if v == "baseline":
            continue
        if not (base and base["row"]["n"] and n):
            claims.append(f"- {_label(v)}: not testable at this scale (no finished runs for it or the baseline)")
            continue
        ours, theirs = s[ours_key][0], base[ours_key][0]
        spread = max(base[ours_key][1], s[ours_key][1])  # the larger of the two seed stds
        auc_spread = max(base["auc"][1], s["auc"][1])
        seeds = min(base["row"]["n"], n)
        lower = ours < theirs
        faster = s["auc"][0] < base["auc"][0]
        paper_dir = ""
        if p_rel != "—":
            paper_lower = p_rel.startswith("-")
            paper_dir = (f"paper: {p_rel} ({'lower' if paper_lower else 'higher'} than its baseline), "
                         f"ours {'lower' if lower else 'higher'}: direction "
                         f"{'agrees' if lower == paper_lower else 'DISAGREES'}; ")
        claims.append(f"- {_label(v)}: final {ours_key} {metric} {ours:.{digits}f} vs baseline {theirs:.{digits}f} "
                      f"({rel}). {paper_dir}'ends lower than the baseline': "
                      f"**{_verdict(lower, abs(ours - theirs), spread, seeds)}**; 'converges faster' (mean val over "
                      f"the evaluation history {s['auc'][0]:.4f} vs {base['auc'][0]:.4f}, {auc_rel}): "
                      f"**{_verdict(faster, abs(s['auc'][0] - base['auc'][0]), auc_spread, seeds)}**")

    # figure: val curve by step for all variants
    curve_key = val_key
    series_rows = [stats[v]["row"] for v in order]
    series = {LABELS.get(k.split("=", 1)[1], k): xy for k, xy in curves(series_rows, curve_key, ["variant"]).items()}

    def fig(path):
        title = spec.title.split(": ", 1)[-1].split(" (")[0] + f"\nours: val {metric} by step, mean over seeds"
        if not spec.reference_curves:
            plot_curves(series, curve_key, path, title, logy=metric == "ppl")
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        f, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        color = {LABELS.get(v, v): f"C{i % 10}" for i, v in enumerate(order)}  # same colour per variant in both panels
        for label, (xs, ys) in series.items():
            axes[0].plot(xs, ys, lw=1.5, label=label, color=color.get(label))
        axes[0].set_title("ours (this scale): val bpc by step", fontsize=9)
        for v, ys in ENWIK8_L6_LOGS.items():
            axes[1].plot(ENWIK8_L6_LOG_STEPS, ys, "--", marker="o", ms=3, label=f"{LABELS[v]} (official log)",
                         color=color.get(LABELS[v]))
        axes[1].set_title("PAPER SCALE reference: official training logs (d 512, 40k steps), val bpc", fontsize=9)
        for ax in axes:
            ax.set_xlabel("step")
            ax.set_ylabel("val bpc")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        f.tight_layout()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        f.savefig(path, dpi=110)
        plt.close(f)

    body = "\n".join(md) + "\n\n**Claims at this scale** (gated variant vs baseline):\n" + (
        "\n".join(claims) or "- no finished runs") + "\n\n"
    body += (f"Columns: val/test {metric} after the last step, complete passes over the splits in stream order "
             "(with memory for Transformer-XL), mean ± std over seeds. Δ = relative change against our baseline "
             "(negative = better). AUC = mean validation "
             f"{'bpc' if metric == 'bpc' else 'loss in nats (log perplexity)'} over every evaluation of the run "
             "(intermediate evaluations use the first `eval_max_batches` batches; lower = converges faster). Verdicts: "
             "HELD = better in the mean by more than the larger of the two seed stds; NOT RESOLVED = better in the "
             "mean but inside that spread; DID NOT HOLD = not better in the mean. Gated rows have more parameters "
             "than the baseline (each gated sublayer adds 2d^2 + 2d; not matched).\n\n")
    body += _settings(runs) + "\n" + _unigram_note(runs, metric, base) + "\n" + spec.notes + "\n"
    if spec.time_column:
        body += ("\nTime per step is measured from the runs' own perf/tokens_per_s; on a shared CPU (other jobs "
                 "running, one thread per run) it mostly reflects the machine's load at the time of each run, not "
                 "the cost of the gates: read it as a measurement only on a dedicated machine.\n")
    return Table(spec.title, body, rows, {".png": fig})


def _make(name: str):
    def table(runs: list[Run]) -> Table:
        return _ht_table(SPECS[name], runs)

    table.__name__ = name
    return register(name)(table)


ht_char_ptb = _make("ht_char_ptb")
ht_word_ptb = _make("ht_word_ptb")
ht_char_ptb_rt = _make("ht_char_ptb_rt")
ht_word_ptb_l3 = _make("ht_word_ptb_l3")
ht_enwik8_l6 = _make("ht_enwik8_l6")
ht_enwik8_l12 = _make("ht_enwik8_l12")
