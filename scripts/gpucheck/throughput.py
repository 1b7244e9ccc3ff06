"""Phase 4, every paper-scale model through the real configs, `train.run` and the Trainer: step time, tokens or
samples/s, FLOPs and MFU against the measured peak, peak memory, the loss (finite, falling, bf16 against fp32)
and the evaluation speed."""

from __future__ import annotations

import math
import shutil
import time

from .cases import CASE_BY_KEY, CASES, Case, cpu_bf16_features
from .common import TARGETS, say
from .glue import (compose, fresh_dir, matmul_precision, read_jsonl, recording_trainer, run_overrides, sync,
                   trainer_class)
from .phases import Ctx, phase
from .report import fmt, md_table, pct


def _to(batch, device):
    import torch

    return tuple(b.to(device) if torch.is_tensor(b) else b for b in batch)


def register_flop_formulas() -> str:
    """The project's FLOP formulas (highway_repro/engine/flops.py: CPU flash attention, oneDNN and cuDNN RNNs,
    which torch's counter lacks), as the trainer counts them."""
    from highway_repro.engine import flops

    flops.register()
    return flops.__name__


def count_flops(tr) -> int:
    """FLOPs of one training step's forward + backward, counted as the Trainer runs it (its batch of step 0,
    its autocast, and for Transformer-XL its memory after the run: the steady state, full memory)."""
    from torch.utils.flop_counter import FlopCounterMode

    register_flop_formulas()
    batch = _to(tr.data.train_batch(0), tr.device)
    tr.model.train()
    tr.counting_step = True  # the module's own forward (a compiled model's graphs hide their FLOPs from the counter)
    try:
        with FlopCounterMode(display=False) as counter:
            with tr._autocast():
                loss, _, _ = tr._forward(batch, tr.mems, getattr(tr.data, "score_len", None))
            loss.backward()
    finally:
        tr.counting_step = False
    tr.optimizer.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


def eval_sizes(data) -> dict:
    """split -> (batches, items) of one full evaluation pass over the split as the check's data holds it."""
    out = {}
    for split in data.splits:
        if hasattr(data, "eval_windows") and hasattr(data, "num_targets"):
            out[split] = (len(data.eval_windows(split)), int(data.num_targets(split)))
        elif hasattr(data, "num_examples") and hasattr(data, "eval_batch_size"):
            n = int(data.num_examples(split))
            out[split] = (math.ceil(n / data.eval_batch_size), n)
        else:
            batches = items = 0
            for _, y, *rest in data.eval_batches(split):
                batches, items = batches + 1, items + int(y.shape[0])
            out[split] = (batches, items)
    return out


def eval_speed(tr, device: str) -> dict:
    """Seconds per evaluation batch (after one warm-up batch), on the first evaluation split."""
    split = "val" if "val" in tr.data.splits else tr.data.splits[0]
    sizes = eval_sizes(tr.data)
    k = min(1 if device == "cpu" else (10 if tr.task.kind == "lm" else 5), sizes[split][0])
    tr.evaluate(split, max_batches=1)
    sync(device)
    t = time.perf_counter()
    tr.evaluate(split, max_batches=k)
    sync(device)
    return {"split": split, "batch_s": (time.perf_counter() - t) / max(k, 1), "sizes": sizes,
            "data_name": getattr(tr.data, "name", "")}


def throughput(ctx: Ctx, case: Case, variant: str, overrides: tuple, precision: str, with_eval: bool = True) -> dict:
    import torch

    from highway_repro.train import run

    if ctx.missing.get(case.key):
        raise RuntimeError(f"data missing: {', '.join(ctx.missing[case.key])}")
    W, S = ctx.warmup, ctx.steps
    log_every = math.gcd(W, S)
    out = fresh_dir(ctx.runs / f"{case.key}-{variant}-{precision}")
    cfg = compose([f"experiment={case.experiment}", *case.overrides, *overrides,
                   *run_overrides(ctx, precision, W + S, log_every), *(case.dry if ctx.dry else ())])
    cuda = ctx.device.startswith("cuda")
    rec = recording_trainer()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    with trainer_class(rec), matmul_precision(precision == "fp32" and not ctx.dry):
        final = run(cfg, out)
        wall = time.perf_counter() - t
        mem = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()) if cuda else (None, None)
        tr = rec.built[-1]
        rec.built.clear()
        if final.get("status") != "done":
            raise RuntimeError(f"the run ended {final.get('status')}: {final.get('error')}")
        lines = [x for x in read_jsonl(out / "metrics.jsonl") if any(k.startswith("perf/") for k in x)]
        timed = [x for x in lines if x["step"] > W]
        if not timed:
            raise RuntimeError(f"no timed log lines after step {W} in {out / 'metrics.jsonl'}")
        unit = next(k for k in timed[0] if k.startswith("perf/")).split("/", 1)[1]
        rate = len(timed) / sum(1.0 / float(x[f"perf/{unit}"]) for x in timed)  # equal intervals: harmonic mean
        batch = tr.data.train_batch(0)
        items = int(batch[1].numel()) if tr.task.kind == "lm" else int(batch[1].shape[0])
        key = (case.key, variant)
        if key not in ctx.flops:
            try:  # the speed numbers stand without it
                ctx.flops[key] = count_flops(tr)
            except Exception as e:
                ctx.flops[key] = None
                ctx.rep.problem(f"flops {case.key} {variant}", f"{type(e).__name__}: {e}"[:300])
        try:
            ev = eval_speed(tr, ctx.device) if with_eval else None
        except Exception as e:
            ev = None
            ctx.rep.problem(f"eval speed {case.key} {variant} {precision}", f"{type(e).__name__}: {e}"[:300])
        params = sum(p.numel() for p in tr.model.parameters())
    del tr
    shutil.rmtree(out / "ckpt", ignore_errors=True)
    step_s = items / rate
    peak = ctx.peaks.get("bf16" if precision == "bf16" else ("fp32" if ctx.dry else "tf32"))
    res = {"case": case.key, "variant": variant, "precision": precision, "params": params, "items": items,
           "unit": unit.replace("_per_s", ""), "rate": rate, "step_s": step_s, "flops": ctx.flops[key],
           "mfu": (ctx.flops[key] / step_s / peak) if peak and ctx.flops[key] else None, "mem": mem[0],
           "mem_reserved": mem[1],
           "loss_first": float(lines[0]["train/loss"]), "loss_last": float(lines[-1]["train/loss"]),
           "wall_s": wall, "eval": ev, "batch": tuple(batch[0].shape)}
    res["finite"] = math.isfinite(res["loss_last"])
    res["falling"] = res["finite"] and res["loss_last"] < res["loss_first"]
    ctx.results[(case.key, variant, precision)] = res
    for metric in ("params", "items", "rate", "step_s", "flops", "mfu", "mem", "mem_reserved", "loss_first",
                   "loss_last", "finite", "falling", "wall_s"):
        ctx.rep.row("throughput", case.key, variant, precision, metric, res[metric],
                    {"rate": f"{res['unit']}/s", "step_s": "s", "flops": "FLOP", "mem": "B", "mem_reserved": "B",
                     "wall_s": "s"}.get(metric, ""))
    if ev:
        ctx.rep.row("throughput", case.key, variant, precision, "eval_batch_s", ev["batch_s"], "s", ev["split"])
    say(f"{case.key} {variant} {precision}: {step_s * 1e3:.1f} ms/step, {rate:,.0f} {res['unit']}/s, "
        f"MFU {pct(res['mfu'])}, mem {fmt(mem[0], 2, 'B')}, loss {res['loss_first']:.3f} -> {res['loss_last']:.3f}")
    throughput_section(ctx)
    return res


def throughput_section(ctx: Ctx) -> None:
    rows = []
    worst = None
    for (ck, var, prec), r in ctx.results.items():
        if "+compile-" in var:  # phase `compiled` has its own table (scripts/gpucheck/compiled.py)
            continue
        other = ctx.results.get((ck, var, "fp32" if prec == "bf16" else "bf16"))
        rel = None
        if other and prec == "bf16" and r["finite"] and other["finite"]:
            rel = abs(r["loss_last"] - other["loss_last"]) / abs(other["loss_last"])
            ctx.rep.row("throughput", ck, var, "bf16", "loss_rel_diff_vs_fp32", rel)
            if worst is None or rel > worst[0]:
                worst = (rel, f"{ck} {var}")
        case = CASE_BY_KEY[ck]
        rows.append([case.label, var, ctx.fp32_name if prec == "fp32" else prec, f"{r['params']:,}",
                     "x".join(map(str, r["batch"])), f"{r['step_s'] * 1e3:.1f}", f"{r['rate']:,.0f} {r['unit']}/s",
                     fmt(r["flops"], 2), pct(r["mfu"]), fmt(r["mem"], 2, "B") if r["mem"] is not None else "n/a",
                     f"{r['loss_first']:.3f} → {r['loss_last']:.3f}", "yes" if r["falling"] else "**no**",
                     pct(rel) if rel is not None else ""])
    lines = [f"Each row: the experiment's config at `scale={ctx.scale}` through `train.run` and the Trainer, "
             f"{ctx.warmup} warm-up + {ctx.steps} timed steps (speed from the trainer's own `perf/*` lines of the "
             "timed log intervals; a log interval ends with a host sync), then one evaluation batch. fp32 rows run "
             "with TF32 matmuls (`torch.set_float32_matmul_precision('high')`; the trainer itself leaves torch's "
             "default, full fp32). FLOPs: forward + backward of one step (torch.utils.flop_counter with the "
             "project's formulas and cuDNN RNNs; causal attention kernels are counted in full, as torch counts "
             "them); MFU = FLOPs / step time / measured peak of the step's precision. Memory: "
             "`torch.cuda.max_memory_allocated` over the run (model, Adam/SGD state, activations, one evaluation "
             "batch). Loss: mean training loss of the first (warm-up) and of the last log interval.", "",
             *md_table(["model", "variant", "precision", "params", "batch", "step ms", "throughput", "FLOPs/step",
                        "MFU", "peak mem", "loss", "falling", "bf16 vs fp32"], rows,
                       "---|---|---|---:|---|---:|---:|---:|---:|---:|---|---|---:")]
    ctx.rep.section("throughput", "Training speed, MFU and memory at the paper's sizes", lines)
    for key, label in (("txl6", "Transformer-XL L6 (paper size) bf16 MFU"), ("tlm3", "Transformer-L3 bf16 MFU")):
        r = ctx.results.get((key, "baseline", "bf16"))
        if r:
            ctx.rep.target(f"mfu_{key}", label, pct(r["mfu"]), f">= {pct(TARGETS['mfu'])}",
                           r["mfu"] is not None and r["mfu"] >= TARGETS["mfu"])
    if worst:
        ctx.rep.target("bf16", "bf16 loss within 1% of fp32 after the timed steps (worst case)",
                       f"{pct(worst[0])} ({worst[1]})", f"<= {pct(TARGETS['bf16_vs_fp32'])}",
                       worst[0] <= TARGETS["bf16_vs_fp32"])
    done = list(ctx.results.values())
    bad = [f"{r['case']} {r['variant']} {r['precision']}" for r in done if not r["finite"]]
    ctx.rep.target("finite", "training losses finite after the timed steps", f"{len(done) - len(bad)} of {len(done)}",
                   "all", not bad, ("not: " + ", ".join(bad)) if bad else "")
    flat = [f"{r['case']} {r['variant']} {r['precision']}" for r in done
            if not r["falling"] and not (r["case"] == "mlp100" and r["variant"] == "plain")]
    ctx.rep.target("falling", "training loss falling over the steps (the plain depth-100 net excepted: the paper "
                              "shows it does not train)", f"{len(done) - len(flat)} of {len(done)}", "all", not flat,
                   ("not: " + ", ".join(flat)) if flat else "")


def throughput_jobs(groups: str) -> list[tuple]:
    jobs = []
    for case in CASES:
        if case.group in groups:
            for variant, ov in case.variants:
                for precision in ("bf16",) if case.group == "C" else ("bf16", "fp32"):
                    jobs.append((case, variant, ov, precision))
    return jobs


def run_throughput(ctx: Ctx, groups: str, reserve: float = 0.0) -> None:
    """The speed runs of these case groups; each starts only if it fits, with `reserve` seconds kept for later."""
    for case, variant, ov, precision in throughput_jobs(groups):
        if ctx.args.cases and case.key not in ctx.args.cases:
            continue
        if ctx.dry and precision == "bf16" and case.bf16_lstm and not cpu_bf16_features():
            ctx.rep.problem(f"throughput {case.key} {variant} bf16", "cannot run on this CPU: its flags have neither "
                                                                     "avx512_bf16 nor amx_bf16 (oneDNN's bf16 LSTM)")
            continue
        need = 8 if ctx.dry else (30 if case.key == "txl12" else 15)
        phase(ctx, f"throughput {case.key} {variant} {precision}", need + reserve, throughput, case, variant, ov,
              precision)
