"""What a table's runs cost, by one rule, and the memory a run holds at its peak: a grid cell's run takes the mean
time of the cell's kept runs made on its device (a CPU's time per thread, a GPU's wall time), else `est_step_s` x
`max_steps`, ± MARGIN across machines (one cell's kept CPU runs on two 2-core machines, an Intel Xeon and an AMD EPYC:
up to 17 % apart, the whole cpu-scale set 6 %). A grouped run logged its share of the group's time, as it goes again.
"""

from __future__ import annotations

import heapq
import math
import os
import subprocess
from pathlib import Path

from highway_repro.runner.keep import FINISHED, run_object
from highway_repro.grids import cell_of

MARGIN = 0.25  # a run's time on another machine of its kind, either way (the module's docstring)
DEFAULT_PEAK_GB = 2.0  # a run with no measured or estimated peak (the cpu-scale runs hold 0.3-1.2 GB)


def run_seconds(runs: list[Path], gpu: bool | None = None) -> list[float]:
    """Seconds of each finished run (a diverged one too: its cell diverges as often again) with its cores to itself: a
    CPU run's CPU time / its threads (no loaded machine inflates it), a GPU run's wall time; `gpu`: only a GPU's."""
    out = []
    for r in runs:
        m, info = run_object(r / "metrics.json"), run_object(r / "run_info.json")
        if None in (m, info) or m.get("status") not in FINISHED or gpu not in (None, bool(info.get("cuda_device"))):
            continue
        threads = info.get("threads") if isinstance(info.get("threads"), int) and info["threads"] > 0 else 1
        if _positive(m.get("time/cpu_s")) and not info.get("cuda_device"):
            out.append(float(m["time/cpu_s"]) / threads)
        elif _positive(m.get("time/wall_s")):
            out.append(float(m["time/wall_s"]))
    return out


def _positive(v) -> bool:
    """Whether a kept value is a positive finite number."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf")


def on_cpu(cfg) -> bool:
    """Whether the runs go to a CPU: trainer.device cpu, or auto on a machine without a CUDA GPU (`gpu_ids`)."""
    device = str(cfg.get("trainer", {}).get("device", "auto"))
    return not device.startswith("cuda") and (device != "auto" or not gpu_ids())


def gpu_ids() -> list[str]:
    """The CUDA GPUs the queue may hand out: CUDA_VISIBLE_DEVICES's where set, else `nvidia-smi -L`'s; [] if none."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [d.strip() for d in given.split(",") if d.strip() and d.strip() != "-1"]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i in range(sum(line.startswith("GPU ") for line in out.splitlines()))]


def per_run_s(names: list[str], kept: list[Path], cfg) -> tuple[list[float | None], str]:
    """(seconds of each of `names`, how): the mean of its grid cell's kept runs (`kept`: run folders) made on the
    device the runs go to (`on_cpu`), else `est_step_s` x `max_steps`; None where neither is known."""
    by_cell: dict[str, list[float]] = {}
    for r in kept:
        for sec in run_seconds([r], gpu=not on_cpu(cfg)):
            by_cell.setdefault(cell_of(r.name), []).append(sec)
    fallback = float(cfg.est_step_s) * int(cfg.trainer.max_steps) if cfg.get("est_step_s") else None
    secs = [sum(v) / len(v) if (v := by_cell.get(cell_of(n))) else fallback for n in names]
    from_kept = sum(1 for n in names if cell_of(n) in by_cell)
    how = [f"{from_kept} from their cells' kept runs"] if from_kept else []
    if from_kept < len(names):
        how.append(f"{len(names) - from_kept} at est_step_s {cfg.get('est_step_s')} x {cfg.trainer.max_steps} steps"
                   if fallback else f"{len(names) - from_kept} unknown (no kept run, no est_step_s)")
    return secs, ", ".join(how)


def wall_s(secs: list[float], jobs: int) -> float:
    """Wall seconds of runs taking `secs`, in order, each on the first of `jobs` workers free (5 on 2: 3 runs' time)."""
    free = [0.0] * max(1, jobs)
    for s in secs:
        heapq.heapreplace(free, free[0] + s)
    return max(free)


def time_limit_min(secs: float | None, threads: int = 1, default: int = 60) -> int:
    """A cluster job's time limit (min) for `secs` one-thread seconds: the estimate + MARGIN + 5 min to start."""
    return math.ceil(secs / max(1, threads) * (1 + MARGIN) / 60) + 5 if secs else default


def peak_gb(cfg, kept: Path | None) -> tuple[float, str]:
    """GiB one run holds at its peak: its kept CPU runs' largest `peak_rss_gb` (a GPU run's host memory says nothing of
    a CPU run's), else `est_peak_gb`, else DEFAULT_PEAK_GB."""
    infos = [run_object(f) or {} for f in (kept.glob("*/run_info.json") if kept is not None else ())]
    seen = [float(i["peak_rss_gb"]) for i in infos if _positive(i.get("peak_rss_gb")) and not i.get("cuda_device")]
    if seen:
        return max(seen), f"largest of {len(seen)} kept runs"
    if cfg.get("est_peak_gb"):
        return float(cfg.est_peak_gb), "est_peak_gb"
    return DEFAULT_PEAK_GB, "default"
