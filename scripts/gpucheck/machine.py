"""Phase 1: the machine (GPU, memory, driver, CUDA, torch, the tree it runs) and the matmul peak measured in
the same run (bf16, TF32, fp32)."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import time
from pathlib import Path

from .cases import cpu_bf16_features
from .common import say
from .data import mirror_info
from .glue import matmul_precision, sync
from .phases import Ctx, release_memory
from .report import fmt, md_table


def machine(ctx: Ctx) -> dict:
    import torch

    from highway_repro.engine.loggers import cpu_model

    facts = {"python": platform.python_version(), "torch": torch.__version__,
             "torch CUDA build": torch.version.cuda or "none", "cuDNN": torch.backends.cudnn.version(),
             "CPU": cpu_model() or "unknown", "CPU cores": os.cpu_count(),
             "CPU bf16 features": ", ".join(cpu_bf16_features()) or "none",
             "platform": platform.platform(),
             # NGC containers set the first: fp32 matmuls then run in TF32 whatever the code asks (the "fp32" peak too)
             **{v: os.environ.get(v, "unset") for v in ("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "NVIDIA_TF32_OVERRIDE")}}
    with contextlib.suppress(Exception):
        kb = int(next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal")).split()[1])
        facts["RAM"] = f"{kb / 2 ** 20:.0f} GiB"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        facts.update({"GPU": p.name, "GPU count": torch.cuda.device_count(),
                      "GPU memory": f"{p.total_memory / 2 ** 30:.1f} GiB", "compute capability": f"{p.major}.{p.minor}",
                      "SMs": p.multi_processor_count})
        facts["NCCL"] = nccl_version()
        with contextlib.suppress(Exception):
            r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,power.limit",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=15)
            if r.returncode == 0 and r.stdout.strip():
                drv, clock, power = [x.strip() for x in r.stdout.strip().splitlines()[0].split(",")]
                facts.update({"driver": drv, "max SM clock": clock, "power limit": power})
    else:
        facts["GPU"] = "none (CUDA not available)"
    info = mirror_info()
    facts["tree"] = f"{info.get('commit', 'unknown')} ({info.get('source', 'no git, no PREPARED.json')})"
    rows = [[k, v] for k, v in facts.items()]
    ctx.rep.section("machine", "Machine", md_table(["what", "value"], rows))
    for k, v in facts.items():
        ctx.rep.row("machine", "", "", "", k, v)
    if not ctx.dry and not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available: this is a CPU-only torch or no GPU is visible "
                           f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); use --dry-run on CPU")
    return facts


def nccl_version() -> str | None:
    """torch.cuda.nccl.version(): a tuple in recent torch, an int (e.g. 21805) in older ones."""
    try:
        import torch

        v = torch.cuda.nccl.version()
    except Exception:
        return None
    return ".".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)


def matmul_rate(n: int, dtype, reps: int, device: str) -> float:
    import torch

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    for _ in range(2):
        torch.mm(a, b, out=c)
    sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        torch.mm(a, b, out=c)
    sync(device)
    return 2.0 * n ** 3 * reps / (time.perf_counter() - t)


def matmul_peak(ctx: Ctx) -> dict:
    import torch

    n, reps = (256, 2) if ctx.dry else (8192, 10)
    rows = []
    for name, dtype, tf32 in (("bf16", torch.bfloat16, False), ("tf32", torch.float32, True),
                              ("fp32", torch.float32, False)):
        with matmul_precision(tf32):
            rate = max(matmul_rate(n, dtype, reps, ctx.device) for _ in range(3))
        ctx.peaks[name] = rate
        ctx.rep.row("peak", "matmul", "", name, "flops_per_s", rate, "FLOP/s", f"{n}x{n} @ {n}x{n}, best of 3 x {reps}")
        rows.append([name, fmt(rate, 1, "FLOP/s")])
        say(f"matmul peak {name}: {rate / 1e12:.2f} TFLOP/s")
    release_memory()
    ctx.rep.section("peak", "Matmul peak (measured in this run)", md_table(["precision", "peak"], rows) + [
        "", f"Square matmuls {n} x {n} @ {n} x {n}, best of 3 trials of {reps} calls after 2 warm-up calls. "
            "MFU below = FLOPs of a training step / step time / this peak, with the peak of the precision the step ran "
            "in (bf16 autocast: bf16; fp32 with TF32 matmuls: TF32)."])
    return ctx.peaks
