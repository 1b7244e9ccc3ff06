"""Phase `grouped`: Fig. 1's nets trained together on the device (`engine.group`), against the same runs one after
another, and Fig. 1 at the paper's runs priced with the grouped step (the benchmark of bench/sections/grouped.py,
on the GPU: 26 members, depths 10, 50, 100, plain and highway; dry run: 3 members, depth 10, on CPU)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from .phases import Ctx
from .report import fmt, hours, md_table


def grouped_phase(ctx: Ctx) -> None:
    import torch

    from bench.sections.grouped import CELLS, LM_CASES, MEMBERS, SEEDS, _lm_runs, _runs, contenders
    from highway_repro.engine.group import Member
    from highway_repro.engine.trainer import Trainer

    members = 3 if ctx.dry else MEMBERS
    cells = CELLS[:2] if ctx.dry else CELLS
    device = torch.device(ctx.device)
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(16, 100, 1, 28, 28, generator=g), torch.randint(0, 10, (16, 100), generator=g)

    def timed(fn, n: int) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n

    def measure(lone: list, group_members: list, warmup: int, n: int) -> tuple[float, float]:
        """Seconds per run-step, alone and grouped, after `warmup` steps of each."""
        steps = contenders(lone, group_members)
        for fn in steps.values():
            timed(fn, warmup)
        return timed(steps["alone"], ctx.steps) / n, timed(steps["grouped"], ctx.steps) / n

    rows, per_member = [], {}
    for depth, kind in cells:
        with tempfile.TemporaryDirectory() as tmp:
            lone = _runs(Trainer, depth, kind, Path(tmp), x, y, device=ctx.device, members=members)
            group_members = _runs(Member, depth, kind, Path(tmp), x, y, device=ctx.device, members=members)
            a, b = measure(lone, group_members, ctx.warmup, members)
        per_member[(depth, kind)] = b
        rows.append([depth, kind, fmt(a * 1e3, 2), fmt(b * 1e3, 2), fmt(a / b, 2)])
        ctx.rep.row("grouped", f"mlp{depth}-{kind}", "", "fp32", "alone_over_grouped", a / b)
        ctx.rep.row("grouped", f"mlp{depth}-{kind}", "", "fp32", "grouped_s_per_member_step", b, "s")
    lm_rows = []
    for label, experiment in LM_CASES:  # the language models at their cpu-scale size and recipe on the device
        seeds = 2 if ctx.dry else SEEDS
        with tempfile.TemporaryDirectory() as tmp:
            scale = "smoke" if ctx.dry else "cpu"  # (the dry run: the code path at tiny sizes)
            lone = _lm_runs(Trainer, experiment, Path(tmp) / "alone", ctx.device, seeds, scale)
            group_members = _lm_runs(Member, experiment, Path(tmp) / "grouped", ctx.device, seeds, scale)
            a, b = measure(lone, group_members, 1 if ctx.dry else ctx.warmup, seeds)
        lm_rows.append([label, seeds, fmt(a * 1e3, 1), fmt(b * 1e3, 1), fmt(a / b, 2)])
        ctx.rep.row("grouped", experiment, "", "fp32", "alone_over_grouped", a / b)
    lines = [f"{members} members a group, batch 100, fp32 (TF32 as the configs leave it), SGD with momentum; "
             f"{ctx.steps} timed steps after {ctx.warmup}; ms per member-step.", "",
             *md_table(["depth", "kind", "alone ms", "grouped ms", "alone / grouped"], rows, "---:|---|---:|---:|---:"),
             "", "The language models at their cpu-scale size and recipe (`scale=cpu`, real data), a row's seeds "
             "grouped (plain formulas in the group: fused kernels off) vs alone; ms per run-step:", "",
             *md_table(["model", "seeds", "alone ms", "grouped ms", "alone / grouped"], lm_rows,
                       "---|---:|---:|---:|---:")]
    from .tables import paper_plan

    fig1 = next((p for p in paper_plan() if p["table"] == "hn_fig1"), None)
    if fig1 is not None and per_member:
        step = sum(per_member.values()) / len(per_member)
        total = fig1["runs"] * fig1["steps"] * step
        lines += ["", f"Fig. 1 at the paper's {fig1['runs']:,} runs of {fig1['steps']:,} steps, grouped, at the "
                      f"mean grouped member-step of the cells above ({step * 1e3:.2f} ms; evaluations left out): "
                      f"{hours(total)}."]
        ctx.rep.target("grouped_fig1", "Fig. 1 at the paper's runs, grouped", hours(total), "<= 2 GPU-hours",
                       None if ctx.dry else total <= 2 * 3600)
    ctx.rep.section("grouped", "Runs trained together: Fig. 1's nets grouped vs one after another", lines)
