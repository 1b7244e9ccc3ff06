"""Phase 6, `torchrun --nproc_per_node=1` with nccl (process group, DDP wrapper, collectives, checkpoint with the
gathered memory): a run, and the same run stopped halfway and resumed, end equal. `ddp_worker` is the rank."""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
import traceback
from pathlib import Path

from .common import ENTRY, TARGETS
from .glue import compose, fresh_dir
from .machine import nccl_version
from .phases import Ctx, run_child, tail
from .report import md_table


def ddp_check(ctx: Ctx) -> dict:
    work = fresh_dir(ctx.runs / "ddp")
    result = work / "result.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
           str(ENTRY), "--ddp-worker", "--runs", str(work)] + (["--dry-run"] if ctx.dry else [])
    rc, out = run_child(ctx, cmd, timeout=min(150.0, max(30.0, ctx.left() - 15)))  # ~40 s on a GPU
    if not result.exists():
        raise RuntimeError(f"torchrun exited {rc} without a result: {tail(out, 6)}")
    r = json.loads(result.read_text())
    if r.get("error"):
        raise RuntimeError(f"the torchrun worker failed: {r['error']} | {tail(out, 4)}")
    ok = (r["backend"] == ("gloo" if ctx.dry else "nccl") and r["all_reduce_ok"] and r["ckpt_step"] == r["half"]
          and r["resumed_step"] == r["steps"] and r["max_rel_diff"] <= TARGETS["resume_rel"])
    for k in ("backend", "world_size", "device", "nccl", "all_reduce_ok", "ckpt_step", "ckpt_mems", "resumed_step",
              "max_rel_diff", "wall_s"):
        ctx.rep.row("ddp", "txl6", "baseline", "bf16", k, r.get(k))
    rows = [[k, f"{r['uninterrupted'][k]:.6f}", f"{r['resumed'][k]:.6f}",
             f"{abs(r['uninterrupted'][k] - r['resumed'][k]) / abs(r['uninterrupted'][k]):.2e}"]
            for k in r["compared"]]
    ctx.rep.section("ddp", "torchrun --nproc_per_node=1 with " + r["backend"], [
        f"`torchrun --standalone --nproc_per_node=1 scripts/gpu_check.py --ddp-worker`: process group `{r['backend']}` "
        f"(NCCL {r.get('nccl') or 'n/a'}) on `{r['device']}`, world size {r['world_size']}, plus the trainer's gloo "
        f"group for flags; all_reduce check {'ok' if r['all_reduce_ok'] else '**failed**'}. `train.run(..., dist=...)` "
        "with the model in DistributedDataParallel (the torchrun path of `highway_repro.train`, whose "
        "`init_from_env` returns None for world size 1, so the worker builds the same `DistInfo` itself): "
        f"Transformer-XL 6 layers (`scale={ctx.scale}`), bf16, {r['steps']} steps, constant LR, checkpoint and "
        f"evaluation every {r['half']} steps; once straight through, once stopped at step {r['half']} "
        f"(checkpoint step {r['ckpt_step']}, memory of {r['ckpt_mems']} layers gathered into it) and resumed with "
        f"`resume=auto` to step {r['resumed_step']}. {r['wall_s']:.0f} s.", "",
        *md_table(["metric", "uninterrupted", "stopped + resumed", "relative difference"], rows),
        "", "CUDA kernels with atomics (embedding backward, ...) are not bit-reproducible, so the target is a "
            f"relative difference <= {TARGETS['resume_rel']:g} (on CPU the two agree exactly)."])
    ctx.rep.target("ddp", f"torchrun --nproc_per_node=1, {r['backend']}: checkpoint and resume",
                   f"max relative difference {r['max_rel_diff']:.1e}, resumed to step {r['resumed_step']}",
                   f"<= {TARGETS['resume_rel']:g}", ok)
    return r


def ddp_worker(args) -> int:
    """Runs under torchrun: one rank; writes <runs>/result.json."""
    work = Path(args.runs)
    result = {"error": None}
    try:
        import torch
        import torch.distributed as tdist

        from highway_repro.engine import checkpoint as ckpt_lib
        from highway_repro.engine.distributed import DistInfo, _pick_device
        from highway_repro.train import run

        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = "cpu" if args.dry_run else "cuda"
        dev = _pick_device(device, local)
        backend = "nccl" if dev.type == "cuda" else "gloo"
        kwargs = {"device_id": dev} if backend == "nccl" else {}
        t0 = time.perf_counter()
        # as highway_repro.engine.distributed.init_from_env does for world sizes > 1
        tdist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(minutes=3), **kwargs)
        flag_group = tdist.new_group(backend="gloo") if backend != "gloo" else None
        dist = DistInfo(rank=rank, world_size=world, local_rank=local, device=dev, backend=backend,
                        _flag_group=flag_group)
        x = torch.full((4,), float(rank + 1), device=dev)
        tdist.all_reduce(x)
        result.update({"backend": tdist.get_backend(), "world_size": world, "device": str(dev),
                       "all_reduce_ok": bool((x == world * (world + 1) / 2).all()),
                       "nccl": nccl_version() if backend == "nccl" else None})
        steps, half = (4, 2) if args.dry_run else (16, 8)
        base = ["experiment=ht_enwik8_l6", "data=enwik8_prefix", f"scale={'smoke' if args.dry_run else 'paper'}",
                f"trainer.device={device}", "trainer.precision=bf16", f"trainer.log_every={half // 2}",
                f"trainer.eval_every={half}", f"trainer.checkpoint_every={half}", "trainer.eval_max_batches=4",
                "trainer.final_max_batches=4", "trainer.splits=[val]", "trainer.gate_stats_every=0",
                "trainer.progress=false", "optim.scheduler.kind=constant", "logger=jsonl"]
        whole = run(compose(base + [f"trainer.max_steps={steps}", "resume=null"]), fresh_dir(work / "whole"), dist=dist)
        part_dir = fresh_dir(work / "part")
        run(compose(base + [f"trainer.max_steps={half}", "resume=null"]), part_dir, dist=dist)
        ck = ckpt_lib.load(part_dir / "ckpt" / "last.pt")
        resumed = run(compose(base + [f"trainer.max_steps={steps}", "resume=auto"]), part_dir, dist=dist)
        compared = [k for k in ("train/loss", "val/loss") if k in whole and k in resumed]
        result.update({
            "steps": steps, "half": half, "ckpt_step": ck["step"], "ckpt_mems": len(ck.get("mems") or []),
            "resumed_step": resumed.get("step"), "compared": compared,
            "uninterrupted": {k: float(whole[k]) for k in compared},
            "resumed": {k: float(resumed[k]) for k in compared},
            "max_rel_diff": max(abs(float(whole[k]) - float(resumed[k])) / abs(float(whole[k])) for k in compared),
            "wall_s": time.perf_counter() - t0})
        dist.cleanup()
    except Exception as e:
        traceback.print_exc()
        result["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    work.mkdir(parents=True, exist_ok=True)
    (work / "result.json").write_text(json.dumps(result, indent=1, default=str))
    return 0 if result["error"] is None else 1
