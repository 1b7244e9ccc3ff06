"""What a table's runs cost: seconds per run from the kept runs or the scale file, wall time on N jobs, this
machine's calibration, and the memory a run holds at its peak.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from highway_repro import files
from highway_repro.engine.loggers import write_json_atomic
from highway_repro.errors import HighwayError, make_folder
from highway_repro.files import KeptFileError
from highway_repro.runner.keep import FINISHED, SINGLE_RUN, run_object
from highway_repro.runner.plan import REPEAT_KEYS, dirname, jobs_of, override_key, plan
from highway_repro.targets import ROOT, TARGETS


def run_info(run: Path) -> dict | None:
    """A run folder's run_info.json ({} when it has none; None when it cannot be read)."""
    return run_object(run / "run_info.json")


def run_seconds(runs: list[Path], cpu_only: bool = False, speedup: float | None = None,
                elsewhere: float = 1.0) -> list[float]:
    """Wall seconds of each finished run with its cores to itself, as the budgets assume (jobs x threads = cores):
    a CPU run's CPU time / its threads, which a machine shared with other work does not inflate (its wall time
    does: the same Transformer-XL run took 2,197 s of wall time and 1,720 CPU-s beside a third process); a GPU
    run's wall time. A diverged run counts with what it cost (often seconds): a random search's cell diverges that
    often again, so the mean over its finished runs is what one more run of it is expected to cost (Fig. 1: the
    120 runs took 1.8 h wall on 2 jobs, priced at 3.0 h when only the runs that did not diverge were counted).
    `cpu_only`: leave out the runs made on a GPU (the cpu budget's measure). To price runs alone on this machine:
    a grouped run's share times `speedup` (`alone`), and a CPU run made on another machine times `elsewhere`
    (`speed_ratio`)."""
    out, me = [], machine_key()
    for r in runs:
        if (m := run_object(r / "metrics.json")) is None:
            continue
        if (info := run_info(r)) is None or m.get("status") not in FINISHED or (cpu_only and info.get("cuda_device")):
            continue
        threads = info.get("threads") if isinstance(info.get("threads"), int) and info["threads"] > 0 else 1
        factor = alone(info, speedup) * (elsewhere if not info.get("cuda_device") and machine_key(info) != me else 1.0)
        if _positive(m.get("time/cpu_s")) and not info.get("cuda_device"):
            out.append(float(m["time/cpu_s"]) / threads * factor)
        elif _positive(m.get("time/wall_s")):
            out.append(float(m["time/wall_s"]) * factor)
    return out


def _positive(v) -> bool:
    """Whether a logged value is a positive finite number (a kept file may hold anything)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf")


def alone(info: dict, speedup: float | None) -> float:
    """What a run's logged time is multiplied by to give its time alone: a run trained in a group of more than one
    (run_info.json `group`) logged its share of the group's work, `speedup` (the grouped benchmark's ratio alone /
    grouped for its model, `table.group_speedup`) times less than alone; 1 otherwise, or with no `speedup`. A run
    resumed outside its group keeps the mark, and its time alone is overstated for the part it trained alone."""
    group = info.get("group")
    return speedup if speedup and isinstance(group, dict) and _positive(group.get("size")) and group["size"] > 1 \
        else 1.0


def on_cpu(cfg) -> bool:
    """Whether the runs go to a CPU: trainer.device cpu, or auto on a machine without a CUDA GPU (`gpu_ids`; the
    trainer sends auto to a GPU where there is one). Then the kept runs made on a GPU price nothing (a cpu-scale
    run takes ~2 min on an H200 and ~20 on 1 CPU thread)."""
    device = str(cfg.get("trainer", {}).get("device", "auto"))
    return not device.startswith("cuda") and (device != "auto" or not gpu_ids())


def gpu_ids() -> list[str]:
    """The CUDA GPUs the queue may hand out: those of CUDA_VISIBLE_DEVICES where it is set, else each GPU that
    `nvidia-smi -L` lists; [] on a machine without one."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [d.strip() for d in given.split(",") if d.strip() and d.strip() != "-1"]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i in range(sum(line.startswith("GPU ") for line in out.splitlines()))]


def estimate_s(cfg, kept: Path | None, speedup: float | None = None,
               elsewhere: float = 1.0) -> tuple[float | None, str]:
    """Wall seconds one run of this table takes alone with its threads to itself: the mean of its kept runs
    (`run_seconds` with `speedup` and `elsewhere`, those made on the device the runs go to, `on_cpu`; None: none
    apply, e.g. overrides change the recipe), else the scale file's `est_step_s` (measured CPU-seconds per step,
    elsewhere) x max_steps x `elsewhere`."""
    done = (run_seconds([p.parent for p in kept.glob("*/metrics.json")], on_cpu(cfg), speedup, elsewhere)
            if kept is not None else [])
    if done:
        return sum(done) / len(done), f"mean of {len(done)} kept runs"
    step_s = cfg.get("est_step_s")
    if step_s:
        return (float(step_s) * int(cfg.trainer.max_steps) * elsewhere,
                f"est_step_s {step_s} x {cfg.trainer.max_steps} steps")
    return None, "no estimate (no kept runs, no est_step_s in the scale file)"


def grid_cell(name: str) -> str:
    """A job folder name without its seed= / trial= parts: the grid cell the run repeats."""
    return ",".join(p for p in name.split(",") if override_key(p) not in REPEAT_KEYS)


def per_run_s(names: list[str], finished: list[Path], fallback: float | None, cpu_only: bool = False,
              speedup: float | None = None, elsewhere: float = 1.0) -> list[float | None]:
    """Seconds for each of `names` on one thread: the mean of the finished runs (run folders; `cpu_only`: those made
    on a CPU; `run_seconds` with `speedup` and `elsewhere`) of its cell, else `fallback`. Cells differ in cost (a
    depth-100 net against a depth-10 one, gated rows against the baseline), so the runs kept first, often the cheap
    ones, do not price the rest."""
    by_cell: dict[str, list[float]] = {}
    for r in finished:
        for sec in run_seconds([r], cpu_only, speedup, elsewhere):
            by_cell.setdefault(grid_cell(r.name), []).append(sec)
    return [sum(v) / len(v) if (v := by_cell.get(grid_cell(n))) else fallback for n in names]


def wall_s(secs: list[float], jobs: int) -> float:
    """Wall seconds of runs taking `secs` each, started in order on `jobs` workers, each run on the first worker
    free (how the joblib launcher hands out a sweep's jobs): 5 equal runs on 2 jobs take 3 runs' time, not 2.5."""
    free = [0.0] * max(1, jobs)
    for s in secs:
        heapq.heapreplace(free, free[0] + s)
    return max(free)


# ------------------------------------------------------------------ calibration
CALIBRATION_FILE = "calibration.json"  # in the results root, {machine: {scale: {table: probe}}}, committed with
#                                        the runs
CALIBRATION: Path | None = None  # another file instead (the tests: none of this machine's)
PROBE_STEPS = 8  # a probe's training steps; the second half is timed


def machine_key(info: dict | None = None) -> str:
    """This machine as the calibration file names it: CPU model and core count; `info`: the machine a run was made
    on, from its run_info.json."""
    from highway_repro.engine.loggers import cpu_model

    model, cores = (info.get("cpu_model"), info.get("cpu_count")) if info is not None else (cpu_model(), os.cpu_count())
    return f"{model or 'unknown CPU'}, {cores} cores"


def _step_cost(run: Path, speedup: float | None = None) -> float | None:
    """Mean CPU-s per training step a run logged (perf/cpu_s_per_step: its training steps only), alone (`alone`),
    None if none."""
    vals, info = [], run_info(run) or {}
    try:
        for line in (files.read_bytes(run / "metrics.jsonl", run.parent) or b"").splitlines():
            rec = files.parse_json(line, run / "metrics.jsonl") if b'"perf/cpu_s_per_step"' in line else None
            v = rec.get("perf/cpu_s_per_step") if isinstance(rec, dict) else None
            if isinstance(v, (int, float)) and v > 0:
                vals.append(float(v))
    except KeptFileError:
        return None
    return sum(vals) / len(vals) * alone(info, speedup) if vals else None


def probe(name: str, scale: str, workdir: Path) -> dict:
    """Time a few training steps of the first run of table `name`'s grid on this machine, on the scale's threads:
    {"cell": its folder name, "cpu_s_per_step": CPU-s a step over the second half of PROBE_STEPS steps}."""
    t = TARGETS[name]
    cfg, gs, _ = plan(name, scale, [])
    job = jobs_of(gs[0])[0]
    cell = dirname(job, list(cfg.hydra.job.config.override_dirname.exclude_keys))
    out = workdir / f"{name}-{scale}"
    shutil.rmtree(out, ignore_errors=True)
    half = PROBE_STEPS // 2
    cmd = [sys.executable, "-m", "highway_repro.train", f"experiment={t.experiment}", f"scale={scale}", *job,
           f"trainer.max_steps={PROBE_STEPS}", f"trainer.log_every={half}", "trainer.eval_every=0",
           "trainer.checkpoint_every=0", "trainer.splits=[val]", "trainer.final_max_batches=1", "logger=jsonl",
           "trainer.progress=false", f"hydra.run.dir={out}"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()] if r.returncode == 0 else []
    timed = [x["perf/cpu_s_per_step"] for x in lines if x.get("step") == PROBE_STEPS and "perf/cpu_s_per_step" in x]
    if not timed:
        raise HighwayError(f"[{name}] the calibration probe failed (exit {r.returncode}): "
                           f"{(r.stderr.strip().splitlines() or ['no output'])[-1]}")
    return {"cell": cell, "cpu_s_per_step": round(float(timed[-1]), 4),
            "date": time.strftime("%Y-%m-%d", time.gmtime()), "other_jobs": os.getloadavg()[0] > 0.5}


def calibrate(names: list[str], scale: str, workdir: Path, path: Path) -> dict:
    """Probe each table on this machine and record the results under `machine_key()` in `path`."""
    data = files.read_json(path, path.parent, kind=dict) or {}
    mine = data.setdefault(machine_key(), {}).setdefault(scale, {})
    for name in names:
        mine[name] = probe(name, scale, workdir)
        print(f"[{name}] calibration: {mine[name]['cpu_s_per_step']} CPU-s a step ({mine[name]['cell']})", flush=True)
    make_folder(path.parent)
    write_json_atomic(path, data)
    return mine


def _cpu_runs(kept: Path | None, speedup: float | None) -> list[tuple[str, float, bool]]:
    """(grid cell, seconds alone, made on this machine) of each kept CPU run that trained to its end (status done:
    a diverged run's few seconds price its cell, not the machine)."""
    out, me = [], machine_key()
    for f in kept.glob("*/metrics.json") if kept is not None else ():
        if (run_object(f) or {}).get("status") != "done":
            continue
        here = machine_key(run_info(f.parent) or {}) == me
        out += [(grid_cell(f.parent.name), sec, here) for sec in run_seconds([f.parent], True, speedup)]
    return out


def made_here(kept: Path | None, speedup: float | None = None) -> tuple[float, str] | None:
    """How much longer a run takes on this machine than on the machines that made the other kept CPU runs, measured
    where both exist: the geometric mean, over the grid cells with runs made here and elsewhere, of the cell's mean
    here over its mean elsewhere (two machines measured against each other give reciprocal ratios); None where no
    cell has both. A probe of a few steps, often taken beside other work, overstates a machine (Transformer-XL 12
    layers on a 2-core AMD EPYC: x 1.93 probed, x 1.17 from the 12 runs made there)."""
    cells: dict[str, tuple[list[float], list[float]]] = {}
    for cell, sec, mine in _cpu_runs(kept, speedup):
        cells.setdefault(cell, ([], []))[0 if mine else 1].append(sec)
    both = [(sum(h) / len(h), sum(o) / len(o)) for h, o in cells.values() if h and o]
    if not both:
        return None
    ratio = math.exp(sum(math.log(h / o) for h, o in both) / len(both))
    n = sum(len(h) for h, o in cells.values() if h and o)
    return ratio, (f"x {ratio:.2f} for the runs made on other machines ({n} kept runs made here against their "
                   f"cells' runs made elsewhere, {len(both)} cell{'s' if len(both) > 1 else ''})")


def speed_ratio(name: str, scale: str, cfg, kept: Path | None, path: Path,
                speedup: float | None = None) -> tuple[float, str]:
    """How much longer a run takes on this machine than on the machines that made the kept CPU runs and the scale
    file's `est_step_s`, for the runs that go to its CPU (`run_seconds`' `elsewhere`): measured by the kept runs made
    here (`made_here`), else by the probe of this machine (`calibrate`) over the same cell's kept runs made elsewhere
    (their logged CPU-s a step), else over `est_step_s`; a study without a probe of its own takes its experiment's
    table's; (1.0, "") when the runs go to a GPU, or this machine has no calibration or nothing to compare it with."""
    if not on_cpu(cfg):  # a GPU run's wall time: no CPU's ratio
        return 1.0, ""
    if (measured := made_here(kept, speedup)) is not None:
        return measured
    try:
        probes = files.read_json(CALIBRATION or path, (CALIBRATION or path).parent, kind=dict)[machine_key()][scale]
        mine = probes[name] if name in probes else probes[TARGETS[name].experiment]
        cell = grid_cell(mine["cell"]) or SINGLE_RUN
    except (KeptFileError, KeyError, TypeError, AttributeError):  # none for this machine, or a damaged file
        return 1.0, ""
    if not _positive(mine.get("cpu_s_per_step")):
        return 1.0, ""
    # the probe's cell, any seed; "" (a grid of seeds only) and a single-run table's SINGLE_RUN are one cell
    me = machine_key()
    costs = [c for f in (kept.glob("*/metrics.json") if kept is not None else ())
             if (grid_cell(f.parent.name) or SINGLE_RUN) == cell and machine_key(run_info(f.parent) or {}) != me
             and (c := _step_cost(f.parent, speedup))]
    ref, what = ((sum(costs) / len(costs), f"{len(costs)} kept runs' {sum(costs) / len(costs):.3f}") if costs else
                 (float(cfg.est_step_s), f"est_step_s {cfg.est_step_s}") if cfg.get("est_step_s") else (None, ""))
    if not ref:
        return 1.0, ""
    ratio = mine["cpu_s_per_step"] / ref
    return ratio, (f"x {ratio:.2f} for the runs made on other machines (probe {mine['cpu_s_per_step']} CPU-s a step "
                   f"vs {what})")


# ------------------------------------------------------------------ memory
DEFAULT_PEAK_GB = 2.0  # a run with no measured or estimated peak (the cpu-scale runs hold 0.3-1.2 GB)


def peak_gb(cfg, kept: Path | None) -> tuple[float, str]:
    """GiB one run of this table holds at its peak: the largest `peak_rss_gb` of its kept runs made on a CPU
    (run_info.json, written by the trainer; a run on a GPU holds its model there, so its host memory says nothing of
    a CPU run's), else the scale file's `est_peak_gb`, else DEFAULT_PEAK_GB."""
    seen = []
    for f in kept.glob("*/run_info.json") if kept is not None else ():
        info = run_object(f) or {}
        v = info.get("peak_rss_gb")
        if isinstance(v, (int, float)) and v > 0 and not info.get("cuda_device"):
            seen.append(float(v))
    if seen:
        return max(seen), f"largest of {len(seen)} kept runs"
    if cfg.get("est_peak_gb"):
        return float(cfg.est_peak_gb), "est_peak_gb"
    return DEFAULT_PEAK_GB, "default"


