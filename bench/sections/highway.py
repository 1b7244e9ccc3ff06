"""Section 5: Highway Networks, plain vs highway: the MLP of depth 100 and the two conv nets."""

from __future__ import annotations

import torch

from bench import cases, timing
from bench.report import Budget, Report, fmt


def section_highway(rep: Report, budget: Budget, args) -> dict:
    """5: Highway MLP depth 100 and the conv nets, plain vs highway."""
    title = "5. Highway Networks: plain vs highway"
    lines = ["SGD with momentum, batch 100, random inputs of the data's shape; paper widths (MLP: plain 71, "
             "highway 50 units; conv nets: MNIST width 32, CIFAR 'Highway B' widths). One torch thread, as the "
             "Highway Networks sweeps run (`threads=1`, several jobs side by side).", "",
             "| net | plain samples/s | highway samples/s | step ratio highway / plain | FLOP ratio |",
             "|---|---:|---:|---:|---:|"]
    groups = (("mlp100", "MLP depth 100"), ("mnistconv", "MNIST 10-layer conv"), ("cifarconv", "CIFAR 19-layer conv"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _highway_groups(rep, budget, args, groups, lines)
    finally:
        torch.set_num_threads(threads)
    rep.section(title, lines)
    return {}


def _highway_groups(rep: Report, budget: Budget, args, groups, lines: list[str]) -> None:
    for key, label in groups:
        p, h = cases.build(f"{key}-plain"), cases.build(f"{key}-highway")
        fr = h.flops() / p.flops()
        t = timing.interleaved({"plain": p.step, "highway": h.step}, warmup=2, min_rounds=args.min_rounds,
                               max_rounds=args.max_rounds, inner=3 if key == "mlp100" else 1,
                               budget_s=budget.alloc(0.03))
        sp, sh = p.items / timing.median(t["plain"]), h.items / timing.median(t["highway"])
        r = timing.ratio(t, "highway", "plain")
        lines.append(f"| {label} | {fmt(sp)} | {fmt(sh)} | {r:.3f} | {fr:.3f} |")
        rep.row("highway", f"{key}-plain", "samples_per_s", sp, "samples/s")
        rep.row("highway", f"{key}-highway", "samples_per_s", sh, "samples/s")
        rep.row("highway", key, "step_ratio", r)
