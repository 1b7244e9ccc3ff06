"""Phase 5, the learning curve: Transformer-XL 6 layers at the paper's size and hyperparameters, baseline and
SDU tanh, on the enwik8 prefix; validation bpc at step 400 beside the official logs; the curves' CSV and PNG."""

from __future__ import annotations

import csv
import math
import time
from pathlib import Path

from .common import TARGETS, module_origin, say
from .glue import compose, fresh_dir, read_jsonl
from .phases import Ctx
from .report import md_table

# official training logs, enwik8 6 layers, validation bpc at step 400 (REFERENCE.md B2, VERIFIED);
# the source is highway_repro.report.papers.ENWIK8_L6_LOGS, these are used only if it cannot be imported
OFFICIAL_STEP400 = {"baseline": 2.5668, "sdu_tanh": 2.4276}


def official_step400() -> dict:
    try:
        from highway_repro.report.papers import ENWIK8_L6_LOG_STEPS, ENWIK8_L6_LOGS

        i = ENWIK8_L6_LOG_STEPS.index(400)
        return {k: ENWIK8_L6_LOGS[k][i] for k in OFFICIAL_STEP400}
    except Exception:
        return dict(OFFICIAL_STEP400)


def curve_need(ctx: Ctx, variant: str) -> float:
    """Seconds one curve run needs: steps x the measured bf16 step time + 4 validation passes, with a margin
    (before any measurement: 0.25 s per step, 30 s of evaluation)."""
    r = ctx.results.get(("txl6", variant, "bf16")) or ctx.results.get(("txl6", "baseline", "bf16"))
    train = ctx.args.curve_steps * (r["step_s"] if r else 0.25)
    ev = r.get("eval") if r else None
    per_pass = (lambda n: min(n, 2)) if ctx.dry else (lambda n: n)  # the dry run caps each pass at 2 batches
    evals = 4 * per_pass(ev["sizes"]["val"][0]) * ev["batch_s"] if ev and "val" in ev["sizes"] else 30.0
    return (8 if ctx.dry else 20) + 1.3 * (train + evals)


def curve_run(ctx: Ctx, variant: str) -> dict:
    from highway_repro.train import run

    if ctx.missing.get("txl6"):
        raise RuntimeError(f"data missing: {', '.join(ctx.missing['txl6'])}")
    steps = ctx.args.curve_steps
    out = fresh_dir(ctx.runs / f"curve-{variant}")
    cap = "2" if ctx.dry else "null"
    cfg = compose(["experiment=ht_enwik8_l6", "data=enwik8_prefix", f"variant={variant}", "seed=1111",
                   f"scale={ctx.scale}", f"trainer.device={ctx.device}", "trainer.precision=bf16",
                   f"trainer.max_steps={steps}", f"trainer.eval_every={max(1, steps // 4)}",
                   f"trainer.log_every={max(1, steps // 40)}", "trainer.checkpoint_every=0",
                   f"trainer.eval_max_batches={cap}", f"trainer.final_max_batches={cap}", "trainer.splits=[val]",
                   "trainer.gate_stats_every=0", "trainer.progress=false", "optim.scheduler.kind=constant",
                   "logger=jsonl", "resume=null"])
    t = time.perf_counter()
    final = run(cfg, out)
    wall = time.perf_counter() - t
    if final.get("status") != "done":
        raise RuntimeError(f"the run ended {final.get('status')}: {final.get('error')}")
    hist = read_jsonl(out / "metrics.jsonl")
    train = [(x["step"], float(x["train/loss"]) / math.log(2)) for x in hist if "train/loss" in x]
    val = [(x["step"], float(x["val/bpc"])) for x in hist if "val/bpc" in x]
    res = {"variant": variant, "steps": steps, "val_bpc": float(final["val/bpc"]), "train": train, "val": val,
           "wall_s": wall, "batch": f"{cfg.data.batch_size}x{cfg.data.seq_len}"}
    ctx.curves[variant] = res
    ctx.rep.row("curve", "txl6", variant, "bf16", f"val_bpc_step{steps}", res["val_bpc"])
    ctx.rep.row("curve", "txl6", variant, "bf16", "wall_s", wall, "s")
    say(f"curve {variant}: val bpc at step {steps} = {res['val_bpc']:.4f} ({wall:.0f} s)")
    curve_section(ctx)
    return res


def curve_section(ctx: Ctx) -> None:
    official = official_step400()
    steps = ctx.args.curve_steps
    rows = []
    for variant, r in ctx.curves.items():
        ref = official.get(variant)
        diff = r["val_bpc"] - ref if ref is not None else None
        rows.append([variant, f"{r['val_bpc']:.4f}", f"{ref:.4f}" if ref else "",
                     f"{diff:+.4f}" if diff is not None else "", f"{r['wall_s']:.0f} s"])
        if ref is not None and steps == 400:
            ctx.rep.target(f"bpc400_{variant}", f"step-400 val bpc, {variant}, vs official log {ref}",
                           f"{r['val_bpc']:.4f} ({diff:+.4f})", f"within {TARGETS['bpc400']}",
                           abs(diff) <= TARGETS["bpc400"], "indicative: enwik8 prefix, not the full corpus")
    b, t = ctx.curves.get("baseline"), ctx.curves.get("sdu_tanh")
    if b and t:
        ctx.rep.target("tanh_below", f"SDU tanh below the baseline at step {steps}",
                       f"{t['val_bpc']:.4f} vs {b['val_bpc']:.4f}", "tanh < baseline", t["val_bpc"] < b["val_bpc"],
                       "indicative: enwik8 prefix")
    lines = [
        "Transformer-XL 6 layers at the paper's size and hyperparameters "
        f"(`experiment=ht_enwik8_l6 scale={ctx.scale}`: "
        "d 512, 8 heads, d_inner 2048, tgt/mem 512, batch 22, Adam 2.5e-4, clip 0.25, dropout 0.1, seed 1111), bf16, "
        f"{steps} steps; validation every {max(1, steps // 4)} steps with the paper's evaluation (tgt 128, mem 896). "
        "The learning rate is held constant (`optim.scheduler.kind=constant`): the paper's cosine over 40,000 steps "
        "is within 0.03% of its start over the first 400 steps.", "",
        "**Data: the enwik8 prefix (4.15 MB, split 90/5/5), not the full corpus of the official runs**: its 3.7M "
        "training bytes are seen 1.2 times in 400 steps (the official runs see 4.5M new bytes), and its validation "
        "split is another 207k bytes than the official 5M. The comparison with the official logs is indicative "
        "only.", "",
        *md_table(["variant", f"val bpc at step {steps}", "official log at step 400", "difference", "wall"], rows),
    ]
    if ctx.curves:
        lines += ["", f"Curves (training bpc per log interval, validation bpc at each evaluation): "
                      f"`{ctx.rep.out.name}_curves.csv`, `{ctx.rep.out.name}_curves.png`."]
    ctx.rep.section("curve", f"Learning curve: enwik8 6 layers, {steps} steps", lines)
    write_curves(ctx.rep.out, ctx.curves, official)


def curves_png(ctx: Ctx) -> Path:
    """The PNG of the curves CSV (matplotlib may be missing on the GPU machine: `--plot` draws it later)."""
    csv_path = ctx.rep.out.with_name(ctx.rep.out.name + "_curves.csv")
    if module_origin("matplotlib") is None:
        raise RuntimeError(f"matplotlib is missing here: draw it elsewhere with `python scripts/gpu_check.py "
                           f"--plot {csv_path.name}`")
    return plot_curves(csv_path, ctx.rep.out.with_name(ctx.rep.out.name + "_curves.png"))


def write_curves(out: Path, curves: dict, official: dict) -> None:
    path = out.with_name(out.name + "_curves.csv")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "split", "step", "bpc"])
        for variant, r in curves.items():
            w.writerows([variant, "train", s, f"{v:.5f}"] for s, v in r["train"])
            w.writerows([variant, "val", s, f"{v:.5f}"] for s, v in r["val"])
        for variant, v in official.items():
            w.writerow([variant, "official_val", 400, v])


def plot_curves(csv_path: Path, png: Path) -> Path:
    from highway_repro.report.plots import Panel, plot

    series, reference = {}, {}
    with open(csv_path) as f:
        for r in csv.DictReader(f):
            target = reference if r["split"] == "official_val" else series
            label = f"{r['variant']} {'official log, val' if r['split'] == 'official_val' else r['split']}"
            xs, ys = target.setdefault(label, ([], []))
            xs.append(int(r["step"]))
            ys.append(float(r["bpc"]))
    return plot(png, [Panel("Transformer-XL 6 layers, enwik8 prefix (indicative)", series, "bpc"),
                      Panel("official training logs (full enwik8), val bpc", reference, "bpc", dashed=True)])
