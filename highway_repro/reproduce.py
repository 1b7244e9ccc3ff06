"""Run one paper table's sweep and build its report: what `make reproduce-<table>` calls.

    python -m highway_repro.reproduce ht_char_ptb --scale cpu --jobs 2   # train what is missing, then the report
    python -m highway_repro.reproduce ht_char_ptb --scale cpu --estimate # print the plan and its cost, train nothing
    python -m highway_repro.reproduce ht_word_ptb ht_char_ptb_rt --jobs 2 # two tables, their runs in one queue
    python -m highway_repro.reproduce --all --report-only               # make tables: every report from kept runs
    python -m highway_repro.reproduce --list

The grid is read from the config files (highway_repro/targets.py says which): the sweep file's rows, the
scale file's seeds/trials and `extra_grids`. Runs go to `runs/sweeps/<table>-<scale>/<overrides>/` with
`resume=auto`, so running the same command again continues unfinished jobs and skips finished ones. The runs
of every table named (`--all`: every paper table) go through one queue, `--jobs` at a time (`run_queue`).

Finished runs are kept: their small files (metrics.json, metrics.jsonl, config_resolved.yaml, run_info.json,
.hydra/overrides.yaml; no checkpoints) are copied to `results/<paper>/runs/<table>-<scale>/<overrides>/`, which
is committed. Before a sweep starts, the kept runs are put back into the sweep folder, so a sweep on a fresh
clone trains only what is missing, and `--report-only` rebuilds every table from the repository alone.
"""

from __future__ import annotations

import argparse
import functools
import heapq
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from highway_repro.config import check_group_choices
from highway_repro.engine.loggers import write_json_atomic
from highway_repro.errors import ConfigError, HighwayError
from highway_repro.report.header import duration
from highway_repro.targets import (CONFIG_DIR, PAPER_TABLES, REPORTS, ROOT, TARGETS, Target, make_target, runs_folder,
                                   scale_files)

SCALES = tuple(sorted(p.stem for p in (CONFIG_DIR / "scale").glob("*.yaml")))  # configs/scale/<name>.yaml
KEPT_FILES = ("metrics.json", "metrics.jsonl", "config_resolved.yaml", "run_info.json", ".hydra/overrides.yaml")
FINISHED = ("done", "diverged")  # a diverged run is a result (a table cell), not a crash
CPU_BUDGET_JOBS = 2  # the cpu scale's budgets (4.5 h a table, 3 h a study) are for 2 jobs x 1 thread


# ------------------------------------------------------------------ the grid
def _split(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(plain overrides, sweep overrides such as seed=0,1 or trial=range(0,4))."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    plain = [o for o, p in zip(overrides, parsed) if not p.is_sweep_override()]
    return plain, [o for o in overrides if o not in plain]


def compose_table(t: Target, scale: str, plain: list[str]):
    """The composed config of the table at `scale` (hydra node included), as its sweep jobs start from."""
    from hydra import compose, initialize_config_dir

    import highway_repro.train  # noqa: F401  (registers the `hp` resolver)

    overrides = [f"experiment={t.experiment}", f"scale={scale}"] + ([f"sweep={t.sweep_file}"] if t.sweep else [])
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose("train", overrides=overrides + plain, return_hydra_config=True)


def override_key(o: str) -> str:
    """The key of a Hydra override: `+model.x=1` -> `model.x`."""
    return o.split("=", 1)[0].lstrip("+~")


def grids(cfg, extra: list[str]) -> list[list[str]]:
    """The sweep's grids as override lists: the scale's `hydra.sweeper.params`, then each of `extra_grids` on top of
    it, its rows (`variant`) cut to the grid's own (or to the rows given by hand in `extra`): a study whose rows are
    some of its table's takes the table's extra seeds of those rows, no other row. Command-line overrides (`extra`)
    replace a grid's value of the same key."""
    base = {str(k): str(v) for k, v in (cfg.hydra.sweeper.params or {}).items()}
    given = [o for o in extra if override_key(o) == "variant"]
    if given:  # rows chosen by hand replace the grid's rows
        base["variant"], extra = given[-1].split("=", 1)[1], [o for o in extra if o not in given]
    rows = base.get("variant", "").split(",")
    out = []
    for g in [{}] + [dict(x) for x in (cfg.get("extra_grids") or [])]:
        g = {str(k): str(v) for k, v in g.items()}
        if "variant" in g and "variant" in base:
            g["variant"] = ",".join(v for v in g["variant"].split(",") if v in rows)
            if not g["variant"]:
                continue
        out.append([f"{k}={v}" for k, v in {**base, **g}.items()] + extra)
    return out


def jobs_of(grid: list[str]) -> list[list[str]]:
    """Every job (a list of key=value overrides) of one grid, expanded as Hydra's basic sweeper does."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(grid)
    return [list(job) for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def dirname(job: list[str], exclude: list[str]) -> str:
    """The job's folder name: Hydra's `override_dirname` (sorted key=value, excluded keys left out)."""
    return ",".join(sorted(o for o in job if override_key(o) not in exclude))


def plan(t: Target, scale: str, extra: list[str]) -> tuple[object, list[list[str]], list[str]]:
    """(composed config, grids, job folder names in order, without duplicates)."""
    plain, _ = _split(extra)
    cfg = compose_table(t, scale, plain)
    exclude = list(cfg.hydra.job.config.override_dirname.exclude_keys)
    gs = grids(cfg, list(extra)) if t.sweep else [list(extra)]  # a seed= given by hand wins
    names = list(dict.fromkeys(dirname(j, exclude) for g in gs for j in (jobs_of(g) if t.sweep else [g])))
    return cfg, gs, names


@functools.lru_cache(maxsize=None)
def grid_names(name: str, scale: str) -> tuple[str, ...]:
    """The job folder names of table `name`'s grid at `scale`, as `plan` gives them with no extra overrides;
    composed once per process (a report asks for a study's grid more than once)."""
    return tuple(plan(TARGETS[name], scale, [])[2])


# ------------------------------------------------------------------ kept runs
def _status(run: Path) -> str | None:
    try:
        return json.loads((run / "metrics.json").read_text()).get("status")
    except (OSError, ValueError):
        return None


def _runs_in(sweep_dir: Path, single: bool) -> list[Path]:
    """The run folders of a sweep folder (one per job), or the folder itself for a single-run table."""
    return [sweep_dir] if single else sorted(p.parent for p in sweep_dir.glob("*/metrics.json"))


def keep(sweep_dir: Path, kept: Path, single: bool = False) -> int:
    """Copy the small files of every finished run of the sweep folder into the kept-runs folder
    (a single-run table keeps its run as <kept>/run). Returns the number of files written."""
    n = 0
    for run in _runs_in(sweep_dir, single):
        if _status(run) not in FINISHED:
            continue
        dst = kept / ("run" if single else run.name)
        for f in KEPT_FILES:
            if (run / f).exists() and (not (dst / f).exists() or (dst / f).read_bytes() != (run / f).read_bytes()):
                (dst / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(run / f, dst / f)
                n += 1
    return n


def restore(kept: Path, sweep_dir: Path, names: list[str] | None = None, dry: bool = False,
            single: bool = False) -> list[str]:
    """Put kept runs back into the sweep folder (where it has no finished run of that name), so `resume=auto`
    skips them instead of training them again; `names`: only runs of these folder names (a study reusing the
    runs of a table of the same experiment; a single-run table's one run is its one job); `dry`: copy nothing
    (an estimate); `single`: a single-run table, whose run is kept as <kept>/run and runs in the sweep folder
    itself (its follow-up step, the gate analyses, kept its findings, so the report is rebuilt without the
    weights; `--fresh` trains and analyses it again).
    Returns the folder names restored ("run" for a single-run table)."""
    out = []
    for run in [kept / "run"] if single else sorted(p.parent for p in kept.glob("*/metrics.json")):
        dst = sweep_dir if single else sweep_dir / run.name
        if (names is not None and not single and run.name not in names) or _status(run) not in FINISHED \
                or _status(dst) in FINISHED:
            continue
        for f in () if dry else KEPT_FILES:
            if (run / f).exists():
                (dst / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(run / f, dst / f)
        out.append(run.name)
    return out


# ------------------------------------------------------------------ estimates and progress
def _on_gpu(run: Path) -> bool:
    """Whether the run folder's run_info.json names a CUDA device (such a run is not measured by the cpu budget)."""
    try:
        return bool(json.loads((run / "run_info.json").read_text()).get("cuda_device"))
    except (OSError, ValueError, AttributeError):
        return False


def _run_seconds(runs: list[Path]) -> list[float]:
    """Wall seconds of each finished run with its cores to itself, as the budgets assume (jobs x threads = cores):
    a CPU run's CPU time / its threads, which a machine shared with other work does not inflate (its wall time
    does: the same Transformer-XL run took 2,197 s of wall time and 1,720 CPU-s beside a third process); a GPU
    run's wall time. A diverged run counts with what it cost (often seconds): a random search's cell diverges that
    often again, so the mean over its finished runs is what one more run of it is expected to cost (Fig. 1: the
    120 runs took 1.8 h wall on 2 jobs, priced at 3.0 h when only the runs that did not diverge were counted)."""
    out = []
    for r in runs:
        try:
            m = json.loads((r / "metrics.json").read_text())
            info = json.loads((r / "run_info.json").read_text()) if (r / "run_info.json").exists() else {}
        except (OSError, ValueError):
            continue
        if m.get("status") not in FINISHED:
            continue
        threads = info.get("threads") if isinstance(info.get("threads"), int) and info["threads"] > 0 else 1
        if m.get("time/cpu_s") and not info.get("cuda_device"):
            out.append(float(m["time/cpu_s"]) / threads)
        elif m.get("time/wall_s"):
            out.append(float(m["time/wall_s"]))
    return out


def estimate_s(cfg, kept: Path | None) -> tuple[float | None, str]:
    """Wall seconds one run of this table takes with its threads to itself: the mean of its kept runs
    (`_run_seconds`; None: none apply, e.g. overrides change the recipe), else the scale file's `est_step_s`
    (measured CPU-seconds per step) x max_steps."""
    done = _run_seconds([p.parent for p in kept.glob("*/metrics.json")]) if kept is not None else []
    if done:
        return sum(done) / len(done), f"mean of {len(done)} kept runs"
    step_s = cfg.get("est_step_s")
    if step_s:
        return float(step_s) * int(cfg.trainer.max_steps), f"est_step_s {step_s} x {cfg.trainer.max_steps} steps"
    return None, "no estimate (no kept runs, no est_step_s in the scale file)"


REPEAT_KEYS = ("seed", "trial")  # the keys that repeat one cell of a grid (its rows are the other keys)


def _grid_cell(name: str) -> str:
    """A job folder name without its seed= / trial= parts: the grid cell the run repeats."""
    return ",".join(p for p in name.split(",") if override_key(p) not in REPEAT_KEYS)


def per_run_s(names: list[str], finished: list[Path], fallback: float | None) -> list[float | None]:
    """Seconds for each of `names` on one thread: the mean of the finished runs (run folders) of its cell, else
    `fallback`. Cells differ in cost (a depth-100 net against a depth-10 one, gated rows against the baseline), so
    the runs kept first, often the cheap ones, do not price the rest."""
    by_cell: dict[str, list[float]] = {}
    for r in finished:
        for sec in _run_seconds([r]):
            by_cell.setdefault(_grid_cell(r.name), []).append(sec)
    return [sum(v) / len(v) if (v := by_cell.get(_grid_cell(n))) else fallback for n in names]


def wall_s(secs: list[float], jobs: int) -> float:
    """Wall seconds of runs taking `secs` each, started in order on `jobs` workers, each run on the first worker
    free (how the joblib launcher hands out a sweep's jobs): 5 equal runs on 2 jobs take 3 runs' time, not 2.5."""
    free = [0.0] * max(1, jobs)
    for s in secs:
        heapq.heapreplace(free, free[0] + s)
    return max(free)


# ------------------------------------------------------------------ calibration
CALIBRATION_FILE = "calibration.json"  # in the results root, {machine: {scale: {table: probe}}}, committed with the runs
CALIBRATION: Path | None = None  # another file instead (the tests: none of this machine's)
PROBE_STEPS = 8  # a probe's training steps; the second half is timed


def machine_key() -> str:
    """This machine as the calibration file names it: CPU model and core count."""
    from highway_repro.engine.loggers import cpu_model

    return f"{cpu_model() or 'unknown CPU'}, {os.cpu_count()} cores"


def _step_cost(run: Path) -> float | None:
    """Mean CPU-s per training step a run logged (perf/cpu_s_per_step: its training steps only), None if none."""
    vals = []
    try:
        for line in (run / "metrics.jsonl").read_text().splitlines():
            v = json.loads(line).get("perf/cpu_s_per_step") if '"perf/cpu_s_per_step"' in line else None
            if isinstance(v, (int, float)) and v > 0:
                vals.append(float(v))
    except (OSError, ValueError):
        return None
    return sum(vals) / len(vals) if vals else None


def probe(name: str, scale: str, workdir: Path) -> dict:
    """Time a few training steps of the first run of table `name`'s grid on this machine, on the scale's threads:
    {"cell": its folder name, "cpu_s_per_step": CPU-s a step over the second half of PROBE_STEPS steps}."""
    t = TARGETS[name]
    cfg, gs, _ = plan(t, scale, [])
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
    data = json.loads(path.read_text()) if path.exists() else {}
    mine = data.setdefault(machine_key(), {}).setdefault(scale, {})
    for name in names:
        mine[name] = probe(name, scale, workdir)
        print(f"[{name}] calibration: {mine[name]['cpu_s_per_step']} CPU-s a step ({mine[name]['cell']})", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, data)
    return mine


def speed_ratio(name: str, scale: str, cfg, kept: Path | None, path: Path) -> tuple[float, str]:
    """How much longer a step takes on this machine than where the estimate's numbers come from: the probe of this
    machine (`calibrate`) over the same cell's kept runs' logged CPU-s a step, else over the scale file's
    `est_step_s`; (1.0, "") when this machine has no calibration or nothing to compare it with."""
    try:
        mine = json.loads((CALIBRATION or path).read_text())[machine_key()][scale][name]
    except (OSError, ValueError, KeyError):
        return 1.0, ""
    cell = _grid_cell(mine["cell"])  # the probe's cell, any seed
    costs = [c for f in (kept.glob("*/metrics.json") if kept is not None else ())
             if _grid_cell(f.parent.name) == cell and (c := _step_cost(f.parent))]
    ref, what = ((sum(costs) / len(costs), f"{len(costs)} kept runs' {sum(costs) / len(costs):.3f}") if costs else
                 (float(cfg.est_step_s), f"est_step_s {cfg.est_step_s}") if cfg.get("est_step_s") else (None, ""))
    if not ref:
        return 1.0, ""
    ratio = mine["cpu_s_per_step"] / ref
    return ratio, f"x {ratio:.2f} for this machine (probe {mine['cpu_s_per_step']} CPU-s a step vs {what})"


# ------------------------------------------------------------------ memory
DEFAULT_PEAK_GB = 2.0  # a run with no measured or estimated peak (the cpu-scale runs hold 0.3-1.2 GB)


def peak_gb(cfg, kept: Path | None) -> tuple[float, str]:
    """GiB one run of this table holds at its peak: the largest `peak_rss_gb` of its kept runs made on a CPU
    (run_info.json, written by the trainer; a run on a GPU holds its model there, so its host memory says nothing of
    a CPU run's), else the scale file's `est_peak_gb`, else DEFAULT_PEAK_GB."""
    seen = []
    for f in kept.glob("*/run_info.json") if kept is not None else ():
        try:
            info = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        v = info.get("peak_rss_gb")
        if isinstance(v, (int, float)) and v > 0 and not info.get("cuda_device"):
            seen.append(float(v))
    if seen:
        return max(seen), f"largest of {len(seen)} kept runs"
    if cfg.get("est_peak_gb"):
        return float(cfg.est_peak_gb), "est_peak_gb"
    return DEFAULT_PEAK_GB, "default"


def mem_available_gb() -> float | None:
    """The memory the kernel can give new work without swapping (/proc/meminfo MemAvailable), GiB; None where
    that file does not exist (then nothing is held back)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return None


def oom_kills() -> int | None:
    """The kernel's own count of processes its out-of-memory killer has ended: the machine's (/proc/vmstat) plus
    this container's (cgroup v2 memory.events); None where neither exists. A job that dies of SIGKILL while this
    count rises was killed for memory; a SIGKILL from anyone else leaves it as it is."""
    total, found = 0, False
    for path in (Path("/proc/vmstat"), Path("/sys/fs/cgroup/memory.events")):
        try:
            for line in path.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    total, found = total + int(value), True
        except (OSError, ValueError):
            continue
    return total if found else None


def _fits(peak: float, reserved: list[float], budget: float | None) -> bool:
    """Whether a job of `peak` GiB fits beside the running jobs' `reserved` peaks within `budget` (the memory that
    was available when the queue started). A job always starts when nothing runs: it can do no better later."""
    return budget is None or not reserved or sum(reserved) + peak <= budget


def _mark_killed(p: "TablePlan", why: str) -> Path | None:
    """Note in the run folder that the job trained last (the unfinished one written to most recently) why it
    died, in its run_info.json under `killed`: the report shows it in the run's row."""
    runs = [p.sweep_dir] if p.single else [p.sweep_dir / n for n in p.todo if (p.sweep_dir / n).is_dir()]
    runs = [r for r in runs if _status(r) not in FINISHED]
    if not runs:
        return None
    run = max(runs, key=lambda r: max((f.stat().st_mtime for f in r.rglob("*") if f.is_file()), default=0.0))
    info_path = run / "run_info.json"
    try:
        info = json.loads(info_path.read_text()) if info_path.exists() else {}
    except (OSError, ValueError):
        info = {}
    write_json_atomic(info_path, {**info, "killed": why})
    return run


def _last_step(run: Path) -> int:
    """The step of the last complete line of a run's metrics.jsonl (0 when there is none)."""
    try:
        with open(run / "metrics.jsonl", "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 262144))  # a line of gate statistics of a deep net is tens of KB
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        try:
            return int(json.loads(line).get("step", 0))
        except (ValueError, AttributeError):
            continue
    return 0


def progress_line(name: str, total: int, done: int, failed: int, secs: list, jobs: int) -> str:
    """`[name] done/total runs done, failed, left to go; ETA` (the runs left, `secs` each, on `jobs` jobs)."""
    left = total - done - failed
    eta = f"ETA {duration(wall_s(secs, jobs))}" if left and None not in secs else "ETA unknown"
    return (f"[{name}] {done}/{total} runs done" + (f", {failed} failed" if failed else "")
            + f", {left} to go; {eta if left else 'finished'} ({time.strftime('%H:%M')})")


def queue_line(plans: list, jobs: int) -> str:
    """One line for a queue of several tables: their runs done / total and the ETA of all the work left, the
    tables' runs in queue order on the queue's jobs (a table's own line prices its runs as if it had every job)."""
    states = [(len(p.progress.names), *p.progress.state()) for p in plans if p.progress is not None]
    return progress_line(f"queue of {len(states)} tables", sum(s[0] for s in states), sum(s[1] for s in states),
                         sum(s[2] for s in states), [x for s in states for x in s[3]], jobs)


class Progress(threading.Thread):
    """One line a minute: runs done / total and an ETA; each tick also calls `on_tick` (the runner's `_tick`: keep
    the runs finished so far and record the time), so a sweep killed mid-way loses only its unfinished runs. The
    ETA is the work left (the runs not started, plus the unfinished part of the started ones, by their last logged
    step of `max_steps`), each run at the mean of the finished runs of its cell (`per_run_s`), else at the estimate
    for such a cell (`est`), else at the pace of the runs finished in this sweep, shared by `jobs`."""

    def __init__(self, name: str, sweep_dir: Path, names: list[str], jobs: int, est: float | None, every: float = 60,
                 max_steps: int | None = None, on_tick=None, sweep: bool = True):
        super().__init__(daemon=True)
        self.name_, self.sweep_dir, self.names, self.jobs, self.est, self.every = name, sweep_dir, names, jobs, est, every
        self.max_steps, self.on_tick, self.sweep = max_steps, on_tick, sweep
        self.stop = threading.Event()
        self.start_done = {n for n in names if _status(self._folder(n)) in FINISHED}

    def _folder(self, name: str) -> Path:
        """A job's run folder (a single-run table runs in the sweep folder itself)."""
        return self.sweep_dir / name if self.sweep else self.sweep_dir

    def state(self) -> tuple[int, int, list]:
        """(runs done, runs failed, the seconds each run still to go needs on one job: None where unknown)."""
        done = [n for n in self.names if _status(self._folder(n)) in FINISHED]
        failed = [n for n in self.names if _status(self._folder(n)) == "failed"]
        per = self.est  # a cell with no finished run
        if per is None:  # no estimate: the pace of the runs finished in this sweep
            new = _run_seconds([self._folder(n) for n in done if n not in self.start_done])
            per = sum(new) / len(new) if new else None
        todo = [n for n in self.names if n not in done and n not in failed]
        secs = per_run_s(todo, [self._folder(n) for n in done], per) if self.sweep else [per] * len(todo)
        if self.max_steps:  # the unfinished part of started runs
            secs = [s and s * (1.0 - min(1.0, _last_step(self._folder(n)) / self.max_steps)) for n, s in zip(todo, secs)]
        return len(done), len(failed), secs

    def line(self) -> str:
        return progress_line(self.name_, len(self.names), *self.state(), self.jobs)

    def run(self) -> None:
        while not self.stop.wait(self.every):
            if self.on_tick is not None:
                self.on_tick()
            print(self.line(), flush=True)


# ------------------------------------------------------------------ the queue of runs
def _record(kept: Path, fresh: bool) -> dict:
    f = kept / "reproduce.json"
    return json.loads(f.read_text()) if f.exists() and not fresh else {"commands": [], "wall_s": 0.0}


@dataclass(eq=False)  # one object per table: compared and hashed by identity
class TablePlan:
    """What a table (or a part of a target with parts) trains: `commands` for the queue, each a Hydra multirun (a
    whole grid when jobs == 1: Hydra runs its jobs one after another in one process; one run each when jobs > 1,
    so that the queue keeps every job busy across the end of one table and the start of the next)."""
    name: str
    sweep_dir: Path
    kept: Path
    single: bool  # a single-run table: its run folder is the sweep folder itself
    fresh: bool
    shown: str  # the command as the user gives it, for the table's record
    todo: list = field(default_factory=list)  # folder names of the runs to train
    commands: list = field(default_factory=list)
    secs: list = field(default_factory=list)  # one-thread seconds of each run to train
    threads: int = 1
    peak_gb: float = DEFAULT_PEAK_GB  # GiB one of its runs holds at its peak (`peak_gb`)
    progress: Progress | None = None
    start: float | None = None
    base: dict | None = None  # the table's record as it was when the table started
    left: int = 0  # commands not yet ended


def plan_table(name: str, scale: str, jobs: int, extra: list[str], runs_root: Path, results: Path,
               fresh: bool = False, estimate_only: bool = False, pending: set = frozenset()) -> TablePlan:
    """Print the plan of table `name` and its cost; put its kept runs back into its sweep folder (not for an
    estimate, which writes and deletes nothing) and return what is left to train. `pending`: run folder names
    that a table before it in the queue trains and it reuses (an estimate counts them as restored)."""
    t = TARGETS[name]
    sweep_dir, kept = runs_root / f"{name}-{scale}", results / runs_folder(name, scale)
    cfg, gs, names = plan(t, scale, extra)
    from highway_repro.config import GATE_OPTIONS, validate

    validate(cfg)  # a bad override given for the whole table: one line before anything is planned or started
    gate = [o for o in extra if override_key(o) in {f"model.{k}" for k in GATE_OPTIONS}]
    if gate and any(o.startswith("variant=") for g in gs for o in g):  # each row is a variant: its gate options
        raise ConfigError(f"[{name}] {gate[0]}: the table's rows are variants (configs/variant/), each with its own "
                          "gate options, which this would override in every row (other gate options: python -m "
                          f"highway_repro.train experiment={t.experiment} {gate[0]})")
    if fresh and sweep_dir.exists() and not estimate_only:  # an estimate deletes and copies nothing
        shutil.rmtree(sweep_dir)
    restored = [] if fresh else restore(kept, sweep_dir, names, dry=estimate_only, single=not t.sweep)  # grid jobs
    restored = names if restored and not t.sweep else restored  # a single run's job name: its override dirname
    for other in () if fresh else t.reuse:  # the same experiment: a run of the same folder name is the same run
        restored += [n for n in restore(results / runs_folder(other, scale), sweep_dir, names, dry=estimate_only)
                     if n not in restored]  # (an estimate copies nothing: its own kept copy is not seen there)
    queued = [n for n in names if n in pending and n not in restored]
    done = [n for n in names if n in restored or n in queued
            or not (fresh and estimate_only) and _status(sweep_dir / n if t.sweep else sweep_dir) in FINISHED]
    if not fresh:
        _refuse_other_recipe(name, scale, [n for n in done if n not in queued], sweep_dir, results)
    own_recipe = all(override_key(o) in REPEAT_KEYS for o in extra)  # else kept runs price nothing
    per, how = estimate_s(cfg, kept if own_recipe else None)
    peak, peak_how = peak_gb(cfg, kept if own_recipe else None)
    todo = [n for n in names if n not in done]
    threads = int(cfg.get("threads") or 1)
    # a cell with no kept run: the scale file's grid-wide pace where it has one (the runs kept first, e.g. of a
    # partial table, are often of the cheap cells: a depth-100 net is not priced at the depth-10 runs), else `per`
    unkept, unkept_how = estimate_s(cfg, None)
    unkept = unkept or per
    if t.sweep and per:  # each run at the mean of the kept runs of its cell, where it has some
        secs = per_run_s(todo, [p.parent for p in kept.glob("*/metrics.json")], unkept)
        if secs.count(unkept) < len(todo):
            how += "; each cell's own kept runs where it has some" + (
                f", else {unkept_how}" if unkept != per and unkept in secs else "")
    else:
        secs = [per] * len(todo) if per else []
    ratio, calibrated = speed_ratio(name, scale, cfg, kept if own_recipe else None, results / CALIBRATION_FILE)
    if secs and calibrated:
        secs, how = [s * ratio for s in secs], f"{how}; {calibrated}"
    total, wall = (sum(secs), wall_s(secs, jobs)) if secs else (None, None)
    cost = (f"estimated {len(todo)} x {duration(total / len(todo))} = {total * threads / 3600:.1f} CPU-hours, "
            f"{duration(wall)} wall with {jobs} job(s) ({how})" if total and todo
            else how if todo else "nothing to train")
    source = str(kept) + "".join(f", {results / runs_folder(o, scale)}" for o in t.reuse)
    queued_from = f", {len(queued)} to come from {', '.join(t.reuse)} before it in this queue" if queued else ""
    print(f"[{name}] scale={scale}: {len(names)} runs, {len(done)} finished ({len(restored)} restored from {source}"
          f"{queued_from}), {len(todo)} to train; {cost}", flush=True)
    shown = f"make {make_target(name)} SCALE={scale}" if name != "demo" else "make demo"
    if extra:  # overrides given by hand are part of the command
        shown = shlex.join(["python", "-m", "highway_repro.reproduce", name, "--scale", scale, *extra])
    if todo and peak_how != "default":
        print(f"[{name}] memory: {peak:.1f} GB a run at its peak ({peak_how})", flush=True)
    p = TablePlan(name, sweep_dir, kept, not t.sweep, fresh, shown, secs=secs if total else [], threads=threads,
                  todo=todo, peak_gb=peak)
    if not todo and not estimate_only and sweep_dir.exists():
        keep(sweep_dir, kept, single=not t.sweep)  # runs that finished after the last keep (a runner killed -9)
    if estimate_only or not todo:
        return p
    base = [sys.executable, "-m", "highway_repro.train", f"experiment={t.experiment}", f"scale={scale}",
            "resume=auto", "trainer.progress=false"]
    if not t.sweep:
        p.commands = [base + [f"hydra.run.dir={sweep_dir}"] + gs[0]]
    else:
        base[3:3] = ["-m", f"sweep={t.sweep_file}"]
        base += [f"hydra.sweep.dir={sweep_dir}"]
        if jobs == 1:
            p.commands = [base + g for g in gs]
        else:  # one multirun of one job per run to train, in the grid's order
            exclude = list(cfg.hydra.job.config.override_dirname.exclude_keys)
            jobs_by_name = {dirname(j, exclude): j for g in gs for j in jobs_of(g)}
            p.commands = [base + jobs_by_name[n] for n in todo]
    p.progress = Progress(name, sweep_dir, names, jobs, unkept, max_steps=int(cfg.trainer.max_steps),
                          on_tick=lambda: _tick(p), sweep=t.sweep)
    return p


def _tick(p: TablePlan) -> None:
    """A progress tick: keep the runs finished so far and record the table's time up to now, so that a runner
    killed -9 (a machine that goes away) loses neither its finished runs nor more than a tick of its time."""
    if p.sweep_dir.exists():
        keep(p.sweep_dir, p.kept, single=p.single)
    if p.start is not None:
        record_time(p, time.time())


def record_time(p: TablePlan, end: float) -> None:
    """Write the table's record: the one it had when the table started, plus this command and its time from
    the first start to `end` (`wall_s`, and the interval itself, so that overlapping parts of one target are not
    counted twice). Written again at each tick and at the end: the last write holds. `p.start` and `p.base`
    are set by the runner when the table's first command starts."""
    record = dict(p.base)
    record["commands"] = list(dict.fromkeys(p.base["commands"] + [p.shown]))
    record["wall_s"] = p.base.get("wall_s", 0.0) + end - p.start
    record["intervals"] = p.base.get("intervals", []) + [[round(p.start, 1), round(end, 1)]]
    p.kept.mkdir(parents=True, exist_ok=True)
    write_json_atomic(p.kept / "reproduce.json", record)  # whole or not at all: the record is committed


def finish_table(p: TablePlan) -> None:
    """Keep the table's finished runs and add this command and its time (first start to last end) to its
    record (`record_time`)."""
    if p.progress is not None and p.progress.is_alive():
        p.progress.stop.set()
        p.progress.join()  # a tick may be keeping files right now
    p.sweep_dir.mkdir(parents=True, exist_ok=True)
    n = keep(p.sweep_dir, p.kept, single=p.single)
    record_time(p, time.time())
    if p.progress is not None:
        print(p.progress.line(), f"- kept files updated: {n}", flush=True)


class StopRequest:
    """The signal handler while a queue runs: SIGINT / SIGTERM / SIGHUP are only recorded here (an exception
    raised at an arbitrary point could leave a started command untracked or a record half written); the queue
    loop acts on them. A second signal means: kill now."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self):
        self.signum, self.count = 0, 0

    def __call__(self, signum, frame):
        self.signum, self.count = self.signum or signum, self.count + 1


_FOLLOW_UPS: set = set()  # running follow-up steps of reports (`Target.after`): stopped with the queue


def _exit_code(rc: int) -> int:
    return 128 - rc if rc < 0 else rc  # killed by signal k: 128 + k, as a shell says


QUEUE_LINE_EVERY_S = 60.0


def run_queue(plans: list[TablePlan], jobs: int, on_table_end=None) -> int:
    """Run the commands of every plan, in order, `jobs` at a time: a job that frees up takes the next command,
    of the same table or the next one. Each command runs in its own process group. A table ends when its last
    command ends: its runs are kept and `on_table_end(plan)` is called. A failed command does not stop the
    others. With several tables it prints one line a minute for the whole queue (`queue_line`), beside each
    table's own. On SIGINT/SIGTERM/SIGHUP every running command is stopped (`stop_sweep`), nothing more starts, the
    finished runs of every started table are kept, and the runner exits 128 + signal; on any other error the
    running commands are stopped too. Returns the first non-zero exit status, else 0."""
    queue = [(p, cmd) for p in plans for cmd in p.commands]
    for p in plans:
        p.left = len(p.commands)
    live: list[tuple[TablePlan, subprocess.Popen]] = []
    status, stop, shown = 0, StopRequest(), time.time()
    budget, held, kills_at = mem_available_gb(), set(), {}  # GiB for the queue's jobs; tables told they wait
    old = {s: signal.signal(s, stop) for s in StopRequest.SIGNALS}
    try:
        while (queue or live) and not stop.signum:
            while queue and len(live) < jobs and not stop.signum:
                reserved = [q.peak_gb for q, _ in live]
                # the first command that fits beside the running ones; a later, smaller one may pass a larger one
                i = next((k for k, (q, _) in enumerate(queue) if _fits(q.peak_gb, reserved, budget)), None)
                if i is None:
                    q = queue[0][0]
                    if q.name not in held:
                        held.add(q.name)
                        print(f"[{q.name}] held back: a run needs {q.peak_gb:.1f} GB at its peak, and "
                              f"{sum(reserved):.1f} of the {budget:.1f} GB available are reserved for "
                              f"{len(live)} running job(s)", flush=True)
                    break
                p, cmd = queue.pop(i)
                if not live and budget is not None and p.peak_gb > budget:
                    print(f"[{p.name}] warning: a run needs {p.peak_gb:.1f} GB at its peak, more than the "
                          f"{budget:.1f} GB available; it runs alone", file=sys.stderr, flush=True)
                if p.start is None:
                    p.start, p.base = time.time(), _record(p.kept, p.fresh)
                    if p.progress is not None:
                        p.progress.start()
                print("+", shlex.join(cmd), flush=True)
                proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True)  # stopped as a group
                live.append((p, proc))
                kills_at[proc.pid] = oom_kills()
            time.sleep(0.5)
            if len(plans) > 1 and time.time() - shown >= QUEUE_LINE_EVERY_S:
                print(queue_line(plans, jobs), flush=True)
                shown = time.time()
            for p, proc in [x for x in live if x[1].poll() is not None]:
                live.remove((p, proc))
                rc = _exit_code(proc.returncode)
                status = status or rc
                before, now = kills_at.pop(proc.pid, None), oom_kills()
                if proc.returncode == -signal.SIGKILL and before is not None and now is not None and now > before:
                    why = (f"out-of-memory killer (the kernel's OOM kill count rose from {before} to {now} while it "
                           f"ran; a run needs about {p.peak_gb:.1f} GB)")
                    run = _mark_killed(p, why)
                    print(f"[{p.name}] a command was killed by the {why}" + (f"; run {run.name}" if run else ""),
                          file=sys.stderr, flush=True)
                elif rc:
                    print(f"[{p.name}] a command exited with status {rc}; the others go on", file=sys.stderr,
                          flush=True)
                p.left -= 1
                if not p.left:
                    finish_table(p)
                    if on_table_end is not None:
                        on_table_end(p)
        if stop.signum:
            stop_sweep([proc for _, proc in live] + list(_FOLLOW_UPS), stop)
            for p in plans:
                if p.start is not None and p.left:  # started, not ended: keep what finished, record the time
                    finish_table(p)
    except BaseException:
        stop_sweep([proc for _, proc in live], stop)  # never leave trainers running unsupervised
        raise
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if stop.signum:  # the user stopped it: no report, no next table
        print(f"stopped by signal {stop.signum}; the same command continues the sweep", file=sys.stderr)
        raise SystemExit(128 + stop.signum)
    return status


def stop_sweep(procs: list[subprocess.Popen], stop: StopRequest | None = None, grace_s: float = 60.0) -> None:
    """Stop the running commands: SIGTERM to each one's whole process group each second (each trainer finishes
    its step, saves a checkpoint and exits; a worker of a launcher such as joblib would otherwise take the next
    job handed to it), and after `grace_s` or a second signal to the runner (`stop.count`), SIGKILL to what is
    left. Signalling only a command's main process is not enough: its workers outlive it."""
    deadline = time.time() + grace_s
    alive = list(procs)
    while alive and time.time() < deadline and (stop is None or stop.count < 2):
        for proc in list(alive):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:  # the whole group is gone
                alive.remove(proc)
        time.sleep(1.0)
        for proc in alive:
            proc.poll()  # reap the main process, so that only live processes keep the group
    for proc in alive:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for proc in procs:
        proc.wait()


# ------------------------------------------------------------------ reports
def _table_runs(name: str, scale: str, runs_root: Path, results: Path) -> list:
    """The kept runs of a table, plus the failed or unfinished ones of its local sweep folder, plus (a study) the
    kept runs of the tables it reuses that are cells of its grid, as the runner would restore them: so a study
    is reported, partial, from the runs other tables made before it trains any of its own."""
    from highway_repro.report import load_runs
    from highway_repro.report.runs import load_run

    sweep_dir, kept = runs_root / f"{name}-{scale}", results / runs_folder(name, scale)
    single = not TARGETS[name].sweep  # its run is the sweep folder itself, kept as <kept>/run: the same job
    runs = {"run" if single else r.path.name: r for r in (load_runs(sweep_dir) if sweep_dir.is_dir() else [])}
    runs.update({r.path.name: r for r in (load_runs(kept) if kept.is_dir() else [])})
    for folder in _reused_folders(name, scale, results):
        runs.setdefault(folder.name, load_run(folder))
    return sorted(runs.values(), key=lambda r: r.path.name)


def _reused_folders(name: str, scale: str, results: Path) -> list[Path]:
    """The kept run folders of the tables `name` reuses whose names are cells of its grid (finished or not)."""
    t = TARGETS[name]
    if not t.reuse:
        return []
    grid = set(grid_names(name, scale))
    return [p.parent for o in t.reuse for p in sorted((results / runs_folder(o, scale)).glob("*/metrics.json"))
            if p.parent.name in grid]


def _trained_for(name: str, scale: str, results: Path, folders: list[Path]) -> list[Path]:
    """The run folders that table `name` trained itself: not the runs of the tables it reuses (restored into its
    sweep, and so also kept in its own folder: the same metrics.json as in the reused table's folder)."""
    def reused(run: Path) -> bool:
        mine = run / "metrics.json"
        return mine.exists() and any(
            (o := results / runs_folder(x, scale) / run.name / "metrics.json").exists()
            and o.read_bytes() == mine.read_bytes() for x in TARGETS[name].reuse)
    return [f for f in folders if not reused(f)]


def other_recipe(part: str, scale: str, folders: list[Path]) -> dict[str, str]:
    """The run folders of table `part` that were made with another recipe than the config files now give their job
    (a scale file changed after they ran): {folder name: the differing keys}. A run without its saved config or
    overrides is taken as it is."""
    import yaml
    from omegaconf import OmegaConf

    from highway_repro.train import recipe_diff

    out, cells = {}, {}  # one composition per grid cell; a run's seed / trial is set on a copy of it
    for folder in folders:
        saved, ov = folder / "config_resolved.yaml", folder / ".hydra" / "overrides.yaml"
        if not (saved.exists() and ov.exists()):
            continue
        job = [o for o in OmegaConf.to_container(OmegaConf.load(ov))
               if override_key(o) not in ("experiment", "scale", "sweep") and not o.startswith("hydra")]
        repeat = [o for o in job if override_key(o) in REPEAT_KEYS]
        cell = tuple(o for o in job if o not in repeat)
        if cell not in cells:
            cfg = compose_table(TARGETS[part], scale, list(cell))
            cells[cell] = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        cfg = cells[cell].copy()
        for o in repeat:
            key, value = o.split("=", 1)
            OmegaConf.update(cfg, key, yaml.safe_load(value))
        diff = recipe_diff(OmegaConf.to_container(OmegaConf.load(saved)), OmegaConf.to_container(cfg, resolve=True))
        if diff:
            out[folder.name] = "; ".join(diff)
    return out


def _refuse_other_recipe(name: str, scale: str, done: list[str], sweep_dir: Path, results: Path) -> None:
    """ConfigError when a finished run that table `name` would count as done (in its sweep folder, or kept and
    restored or about to be) was made with another recipe than the config files now give its job: such a run
    would be neither trained again nor reported (`report_table` leaves it out), a hole in the table."""
    t = TARGETS[name]
    folders = [[sweep_dir / n if t.sweep else sweep_dir, results / runs_folder(name, scale) / n]
               + [results / runs_folder(o, scale) / n for o in t.reuse] for n in done]
    found = [next((d for d in ds if (d / "config_resolved.yaml").exists()), None) for ds in folders]
    other = other_recipe(name, scale, [d for d in found if d is not None])
    if other:
        first, keys = next(iter(other.items()))
        raise ConfigError(f"[{name}] {len(other)} finished run(s) were made with another recipe than the config "
                          f"files now give (e.g. {first}: {keys}); move them under results/archive/ and out of "
                          f"{sweep_dir} to train them again, or start the table anew with --fresh")


def _wall_of(records: list[dict]) -> float:
    """The wall time of several tables' records (the parts of one target, whose runs overlap in one queue): the
    union of their intervals, plus the time of older records that have none. Also for one record whose commands
    overlapped (two checkouts training rows of one table side by side, their records merged)."""
    spans = sorted(tuple(i) for r in records for i in r.get("intervals", []))
    total, end = 0.0, float("-inf")
    for a, b in spans:
        total += max(0.0, b - max(a, end))
        end = max(end, b)
    return total + sum(r["wall_s"] - sum(b - a for a, b in r.get("intervals", [])) for r in records)


def report_table(name: str, scale: str, runs_root: Path, results: Path, echo: bool = True) -> int:
    """Build the table from the kept runs (plus failed or unfinished ones of the local sweep folder); a target
    with `parts` reads the runs of its parts. `echo`: print the table (not for `make tables`: every report)."""
    t = TARGETS[name]
    sweep_dir, kept = runs_root / f"{name}-{scale}", results / runs_folder(name, scale)
    record = _record(kept, False)
    meta = {"commands": record["commands"] or [f"make {make_target(name)} SCALE={scale}"],  # none: not run yet
            "scale": scale, "wall_s": _wall_of([record]) or None,  # commands that overlapped count once
            "planned": sum(len(grid_names(p, scale)) for p in t.parts or (name,)),
            "part_of": next((n for n, x in TARGETS.items() if name in x.parts), None),
            "scale_files": scale_files(name, scale)}
    if t.parts:
        records = [_record(results / runs_folder(part, scale), False) for part in t.parts]
        meta = {**meta, "commands": [f"make {make_target(name)} SCALE={scale}"],
                "wall_s": _wall_of(records) or None}
    from highway_repro.report import build_table, findings_path

    if t.after and not (sweep_dir / "ckpt").is_dir():  # the follow-up step needs the run with its checkpoint
        found = findings_path(results / t.results)
        if not found.exists():
            print(f"[{name}] no run folder with a checkpoint at {sweep_dir} and no kept findings ({found}): "
                  "no report", file=sys.stderr)
            return 0
        meta["findings"] = found.read_text()  # what it found when it ran: the report is rebuilt from files
    elif t.after:
        commands = meta["commands"] or [f"make {make_target(name)} SCALE={scale}"]
        cmd = [sys.executable, "-m", t.after, str(sweep_dir), "--out", str(results / t.results), "--scale", scale]
        cmd += [a for c in commands for a in ("--command", c)]
        cmd += ["--wall-s", str(meta["wall_s"])] if meta["wall_s"] else []
        proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True)  # a stopped queue stops it too
        _FOLLOW_UPS.add(proc)
        try:
            return _exit_code(proc.wait())
        finally:
            _FOLLOW_UPS.discard(proc)

    runs, own, meta["other_recipe"] = [], [], {}
    for part in t.parts or (name,):
        part_runs = _table_runs(part, scale, runs_root, results)
        other = other_recipe(part, scale, [r.path for r in part_runs])
        runs += [r for r in part_runs if r.path.name not in other]
        meta["other_recipe"].update({(f"{part}/{k}" if t.parts else k): v for k, v in other.items()})
        own += _trained_for(part, scale, results, [r.path for r in part_runs if r.path.name not in other])
    if scale == "cpu":  # the budget's measure: the runs' CPU time per thread, on 2 jobs in grid order (CPU runs)
        secs = _run_seconds([p for p in own if not _on_gpu(p)])
        meta["budget"] = (wall_s(secs, CPU_BUDGET_JOBS), len(secs), CPU_BUDGET_JOBS) if secs else None
    if not runs:
        print(f"[{name}] no runs under {kept} or {sweep_dir}", file=sys.stderr)
        return 1
    out = results / t.results
    out.parent.mkdir(parents=True, exist_ok=True)
    text = build_table(name, runs, out=out, meta=meta)
    if echo:
        print(text)
    print(f"wrote {out}.md", file=sys.stderr)
    return 0


def _damaged(results: Path, scale: str, allowed: bool) -> int:
    """Name each kept run of `scale` whose metrics.json cannot be parsed (the reports count it as damaged and leave
    it out of their statistics); 1 when there is one, unless `allowed`."""
    from highway_repro.report.runs import load_run

    runs = [load_run(p.parent) for p in sorted(results.glob(f"*/runs/*-{scale}/*/metrics.json"))]
    damaged = [r for r in runs if r.status == "damaged"]
    for r in damaged:
        print(f"{'warning' if allowed else 'error'}: {r.error}: counted as damaged, left out of the statistics",
              file=sys.stderr)
    return int(bool(damaged) and not allowed)


def _report(name: str, scale: str, runs_root: Path, results: Path) -> int:
    """report_table for the report thread: an error is printed and counted, and the other reports go on."""
    try:
        return report_table(name, scale, runs_root, results)
    except Exception:
        import traceback

        traceback.print_exc()
        print(f"[{name}] the report failed (above); its runs are kept", file=sys.stderr)
        return 1


def train(names: list[str], args, results: Path, runs_root: Path) -> int:
    """Train what is missing of the tables `names` (a target with parts: each part) in one queue, each table's
    report as soon as its runs end. The plan of every table and its cost first. A table that reuses the runs of
    another one named here (a study) waits for it: it is planned, and its runs queued, once that table ends, so
    that runs of the same folder name are restored, not trained twice."""
    tables = list(dict.fromkeys(p for n in names for p in TARGETS[n].parts or (n,)))
    first = [n for n in tables if not set(TARGETS[n].reuse) & set(tables)]
    stages = [first, [n for n in tables if n not in first]]

    def plans_of(stage: list[str], estimate: bool, pending: dict) -> list[TablePlan]:
        return [plan_table(n, args.scale, args.jobs, args.extra, runs_root, results, args.fresh, estimate,
                           {r for o in TARGETS[n].reuse for r in pending.get(o, ())}) for n in stage]

    plans = plans_of(stages[0], args.estimate, {})
    pending = {p.name: set(p.todo) for p in plans}  # what the first stage trains (an estimate counts it as reused)
    later = plans_of(stages[1], True, pending) if stages[1] else []  # the second stage's plan, as it will be
    every = plans + later
    if len(every) > 1:
        cpu_s = sum(s * p.threads for p in every for s in p.secs)
        wall = wall_s([s for p in every for s in p.secs], args.jobs)
        unknown = [p.name for p in every if p.todo and not p.secs]
        print(f"[{'all' if args.all else 'queue'}] scale={args.scale}: estimated {cpu_s / 3600:.1f} CPU-hours, "
              f"{duration(wall)} wall with {args.jobs} job(s), the runs of every table in one queue"
              + (f" (without {', '.join(unknown)}: no estimate)" if unknown else ""), flush=True)
    if args.estimate:
        return 0
    status = 0
    with ThreadPoolExecutor(max_workers=1) as reporter:  # one report at a time, while the queue goes on
        reports = []

        def report(p: TablePlan) -> None:
            reports.append(reporter.submit(_report, p.name, args.scale, runs_root, results))

        try:
            for i, stage in enumerate(s for s in stages if s):
                if i:
                    print(f"[queue] {', '.join(stage)}: the tables whose runs they reuse have ended", flush=True)
                    plans = plans_of(stage, False, {})
                for p in plans:
                    if not p.commands:
                        report(p)
                status = run_queue(plans, args.jobs, on_table_end=report) or status
        except SystemExit:  # stopped: the reports not yet begun are dropped
            reporter.shutdown(wait=False, cancel_futures=True)
            raise
        for name in names:
            if TARGETS[name].parts:  # the whole, once its parts are reported
                reports.append(reporter.submit(_report, name, args.scale, runs_root, results))
        for r in reports:
            status = status or r.result()
    return status


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m highway_repro.reproduce", description=__doc__.split("\n")[0])
    ap.add_argument("args", nargs="*", metavar="table | key=value",
                    help="one or more tables (see --list; their runs share one queue), then Hydra overrides for all")
    ap.add_argument("--all", action="store_true", help="every paper table, in order")
    ap.add_argument("--list", action="store_true", help="list the tables")
    ap.add_argument("--scale", default="cpu", choices=SCALES)
    ap.add_argument("--jobs", type=int, default=1,
                    help="runs at once (one process each, across tables with --all), each with the scale's threads")
    ap.add_argument("--fresh", action="store_true", help="delete the sweep folder and ignore the kept runs")
    ap.add_argument("--results", default=None, help="results root (default: results/, or runs/smoke_results for smoke)")
    ap.add_argument("--runs", default="runs/sweeps", help="where sweep folders go")
    ap.add_argument("--report-only", action="store_true", help="only rebuild the report(s) from the kept runs")
    ap.add_argument("--allow-damaged", action="store_true", help="with --report-only: exit 0 even when a kept "
                    "run's metrics.json cannot be parsed (it is named, counted as damaged, left out of the tables)")
    ap.add_argument("--estimate", action="store_true", help="print the plan and its cost; train nothing")
    ap.add_argument("--calibrate", action="store_true", help=f"time {PROBE_STEPS} steps of each table here (seconds "
                    "to a minute each), record them in <results>/calibration.json, then estimate with them")
    args = ap.parse_intermixed_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs={args.jobs}: runs at once, at least 1")
    if args.list:
        print(f"  {'table':<20} {'make target':<30} what")
        for n, t in TARGETS.items():
            print(f"  {n:<20} {make_target(n):<30} {t.help}")
        return 0
    tables = list(dict.fromkeys(a for a in args.args if a in TARGETS))
    args.extra = [a for a in args.args if a not in TARGETS]
    for a in args.extra:
        if "=" not in a and not a.startswith("~"):
            ap.error(f"table={a!r} is not a table (valid: {', '.join(sorted(TARGETS))}) nor an override key=value")
    try:
        check_group_choices(args.extra, CONFIG_DIR)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if bool(tables) == args.all:
        ap.error("name one or more tables (see --list) or give --all, not both")
    names = (REPORTS if args.report_only else PAPER_TABLES) if args.all else tables
    results = Path(args.results or ("runs/smoke_results" if args.scale == "smoke" else "results"))
    runs_root = Path(args.runs)
    status = 0
    if args.report_only:
        for name in names:
            parts = TARGETS[name].parts
            if args.all and not any(any((results / runs_folder(n, args.scale)).glob("*/metrics.json"))
                                    or _reused_folders(n, args.scale, results) for n in parts or (name,)):
                continue  # make tables: only the tables that have kept runs (not only the record of a stopped start)
            for part in parts if not args.all else ():  # (--all reports the parts under their own names)
                status = report_table(part, args.scale, runs_root, results) or status
            status = report_table(name, args.scale, runs_root, results, echo=not args.all) or status
        status = _damaged(results, args.scale, args.allow_damaged) or status
    else:
        try:
            if args.calibrate:
                calibrate([p for n in names for p in TARGETS[n].parts or (n,)], args.scale, runs_root / "calibration",
                          results / CALIBRATION_FILE)
                args.estimate = True
            status = train(names, args, results, runs_root)
        except HighwayError as e:  # a user mistake: one line, no traceback
            print(f"error: {e}", file=sys.stderr)
            return 2
    if not args.estimate:
        from highway_repro.report import write_summary

        expected = {n: f"{TARGETS[n].help} (`make {make_target(n)}`)" for n in REPORTS}
        print(f"wrote {write_summary(results, expected)}", file=sys.stderr)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
