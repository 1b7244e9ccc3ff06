"""Section P: fp32 against bf16 autocast on CPU, at the cpu-scale sizes the tables train (Transformer-L3 on char-PTB,
the 6-layer Transformer-XL on the enwik8 prefix, the R-Transformer-L3 on word-PTB), with the CPU's bf16 features.

Each model is composed from its experiment's config at `scale=cpu` (model, data, optimizer, clipping), trained for a
fixed number of steps on the real data of the mirror, once in fp32 and once under `torch.autocast("cpu",
torch.bfloat16)` (the trainer's `trainer.precision=bf16`), from the same initial weights and the same batches (and
the same dropout masks). Reported: the median step time (forward, backward, optimizer) after two warm-up steps, the
training loss of the last steps, and the validation loss of the weights reached, evaluated in fp32 on the first
validation batches, so that only the training precision differs. A 1024 x 1024 matmul in both precisions shows what
the CPU's bf16 units give where nothing else costs.

The result is recorded, not adopted: a table changes precision only as a whole, as a change of recipe.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch

from bench import timing
from bench.report import REPO, Budget, Report
from highway_repro.engine.loggers import cpu_bf16_features

CASES = (("Transformer-L3, char-PTB", "ht_char_ptb"),
         ("Transformer-XL 6 layers, enwik8 prefix", "ht_enwik8_l6"),
         ("R-Transformer-L3, word-PTB", "ht_word_ptb"))
WARMUP, LAST, EVAL_BATCHES = 2, 5, 4


def compose(experiment: str, scale: str = "cpu"):
    """The training config of `experiment` at `scale`, as `python -m highway_repro.train` composes it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from highway_repro.resolvers import register

    register()

    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return hydra_compose("train", overrides=[f"experiment={experiment}", f"scale={scale}"])


def matmul_gflops(dtype: torch.dtype, n: int = 1024, reps: int = 4, rounds: int = 7) -> float:
    """GFLOP/s of an n x n @ n x n matmul in `dtype` (median of `rounds`, `reps` products each)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g).to(dtype), torch.randn(n, n, generator=g).to(dtype)
    times = []
    for i in range(rounds + 1):
        t0 = timing.now()
        for _ in range(reps):
            torch.mm(a, b)
        if i:  # the first round warms up
            times.append(timing.now() - t0)
    return 2.0 * n ** 3 * reps / timing.median(times) / 1e9


def train(cfg, data, bf16: bool, steps: int) -> dict:
    """`steps` training steps of the configured model on `data`; step times, last training losses, val loss (fp32)."""
    from hydra.utils import instantiate

    from highway_repro.engine.tasks import build_task

    torch.manual_seed(int(cfg.seed))
    model = instantiate(cfg.model, _convert_="all", **data.meta)
    opt = instantiate(cfg.optim.optimizer)([p for p in model.parameters() if p.requires_grad])
    task, clip = build_task(data.kind), cfg.trainer.grad_clip
    score_len = getattr(data, "score_len", None)
    cast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else nullcontext
    mems, times, losses = None, [], []
    model.train()
    for step in range(steps):
        batch = data.train_batch(step)
        t0 = timing.now()
        with cast():
            loss, _, new_mems = task.forward(model, batch, mems, score_len=score_len)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        times.append(timing.now() - t0)
        mems = None if new_mems is None else [m.detach() for m in new_mems]
        losses.append(loss.item())
    model.eval()
    sums, mems = {}, None
    with torch.no_grad():
        for i, batch in enumerate(data.eval_batches("val")):
            if i >= EVAL_BATCHES:
                break
            _, s, mems = task.forward(model, batch, mems, score_len=getattr(data, "eval_score_len", None))
            sums = {k: sums.get(k, 0.0) + float(v) for k, v in s.items()}
    return {"step_s": timing.median(times[WARMUP:]), "train_loss": sum(losses[-LAST:]) / len(losses[-LAST:]),
            "val_loss": task.summarize(sums)["loss"], "params": sum(p.numel() for p in model.parameters()),
            "finite": all(math.isfinite(x) for x in losses)}


def section_precision(rep: Report, budget: Budget, args) -> dict:
    """P: fp32 vs bf16 autocast, step time and loss after a fixed number of steps, one torch thread."""
    from hydra.utils import instantiate

    title = "P. CPU precision: fp32 against bf16 autocast at the cpu scale (1 thread)"
    steps = args.precision_steps
    features = cpu_bf16_features()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tables run one thread per job
    try:
        mm = {name: matmul_gflops(dt) for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
        results = {}
        for label, exp in CASES:
            cfg = compose(exp)
            data = instantiate(cfg.data, _convert_="all")
            results[exp] = {p: train(cfg, data, p == "bf16", steps) for p in ("fp32", "bf16")}
    finally:
        torch.set_num_threads(threads)
    lines = [f"CPU bf16 features (/proc/cpuinfo): {', '.join(features) or 'none'}; oneDNN bf16 supported: "
             f"{torch.ops.mkldnn._is_mkldnn_bf16_supported()}. Matmul 1024 x 1024, 1 thread: fp32 "
             f"{mm['fp32']:.0f} GFLOP/s, bf16 {mm['bf16']:.0f} GFLOP/s ({mm['bf16'] / mm['fp32']:.1f}x).", "",
             f"Each model as its experiment's cpu scale configures it "
             "(`configs/experiment_scale/<experiment>/cpu.yaml`: "
             f"size, batch, optimizer, learning rate without its schedule, clipping), {steps} steps on the data of the "
             f"mirror from the same initial weights, once per precision. Step: {timing.clock_name()} time of forward, "
             f"backward and optimizer step, median after {WARMUP} warm-up steps. Train loss: mean of the last {LAST} "
             f"steps. Val loss: the weights reached, evaluated in fp32 on the first {EVAL_BATCHES} validation batches.",
             "", "| model (experiment) | parameters | precision | step s | bf16 / fp32 time | train loss | val loss | "
             "val loss bf16 - fp32 |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for label, exp in CASES:
        r32, r16 = results[exp]["fp32"], results[exp]["bf16"]
        for p, r in (("fp32", r32), ("bf16", r16)):
            ratio = f"{r['step_s'] / r32['step_s']:.2f}x" if p == "bf16" else ""
            diff = f"{r['val_loss'] - r32['val_loss']:+.4f}" if p == "bf16" else ""
            lines.append(f"| {label} (`{exp}`) | {r['params']:,} | {p} | {r['step_s']:.3f} | {ratio} | "
                         f"{r['train_loss']:.4f} | {r['val_loss']:.4f} | {diff} |"
                         + ("" if r["finite"] else " (non-finite loss)"))
            rep.row("precision", f"{exp}-{p}", "step_s", r["step_s"], "s")
            rep.row("precision", f"{exp}-{p}", "train_loss", r["train_loss"])
            rep.row("precision", f"{exp}-{p}", "val_loss", r["val_loss"])
    rep.row("precision", "matmul1024-fp32", "flops_per_s", mm["fp32"] * 1e9, "FLOP/s")
    rep.row("precision", "matmul1024-bf16", "flops_per_s", mm["bf16"] * 1e9, "FLOP/s")
    rep.row("precision", "cpu", "bf16_features", " ".join(features) or "none")
    lines += ["", "Recorded, not adopted: every table trains in fp32; a table would change precision only as a whole, "
                  "as a change of its recipe."]
    rep.section(title, lines)
    return {}
