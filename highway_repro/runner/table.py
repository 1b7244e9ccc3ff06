"""One table's plan (the commands for the queue and their cost, printed before it starts) and its record
(`reproduce.json`: the commands and their wall time), kept as it goes."""

from __future__ import annotations

import shlex
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from highway_repro.engine.loggers import write_json_atomic
from highway_repro.errors import ConfigError, make_folder
from highway_repro.report.header import duration
from highway_repro.runner.estimate import DEFAULT_PEAK_GB, MARGIN, on_cpu, peak_gb, per_run_s, wall_s
from highway_repro.runner.keep import (FINISHED, SINGLE_RUN, keep, refuse_other_recipe, restore, reused_names,
                                       run_status)
from highway_repro.grids import REPEAT_KEYS, hydra_key, named_jobs, override_key
from highway_repro.runner.plan import excluded, plan_grids
from highway_repro.runner.progress import Progress
from highway_repro.targets import TARGETS, kept_apart, make_target, runs_folder

GROUP_PEAK = 3.0  # a group's peak memory against a lone run's (Fig. 1, 11 members of MNIST: 1.03 GB, lone 0.43)


@dataclass(eq=False)  # one object per table: compared and hashed by identity
class TablePlan:
    """What a table (or a part of a target) trains: `commands` for the queue, each a Hydra multirun, and their cost."""
    name: str
    sweep_dir: Path
    kept: Path
    single: bool  # a single-run table: its run folder is the sweep folder itself
    fresh: bool
    shown: str  # the command as the user gives it, for the table's record
    todo: list = field(default_factory=list)  # folder names of the runs to train
    commands: list = field(default_factory=list)
    secs: list = field(default_factory=list)  # one-thread seconds of each run to train
    costs: list = field(default_factory=list)  # one-thread seconds of each command (None: unknown)
    threads: int = 1
    peak_gb: float = DEFAULT_PEAK_GB  # GiB one of its runs holds at its peak (`peak_gb`)
    progress: Progress | None = None
    start: float | None = None
    base: dict | None = None  # the table's record as it was when the table started
    left: int = 0  # commands not yet ended
    apart: Path | None = None  # where runs made on a GPU are kept (`targets.runs_folder(..., apart=True)`)
    reused: frozenset = frozenset()  # runs restored from the tables a study reuses: kept there, not copied (`keep`)


def plan_table(name: str, scale: str, jobs: int, extra: list[str], runs_root: Path, results: Path,
               fresh: bool = False, estimate_only: bool = False, pending: set = frozenset(),
               group: str = "1", split: bool = False) -> TablePlan:
    """Print table `name`'s plan and cost, put its kept runs back (not for an estimate: it writes nothing) and return
    what is left to train; `pending`: runs a table before it in the queue trains; `split`: one command per run."""
    t = TARGETS[name]
    sweep_dir, kept = runs_root / f"{name}-{scale}", results / runs_folder(name, scale)
    cfg, fgs = plan_grids(name, scale, extra)
    jobs_by_name = named_jobs(fgs, excluded(cfg), t.sweep)
    names = list(jobs_by_name)
    from highway_repro.train.config import GATE_OPTIONS, validate

    validate(cfg)  # a bad override given for the whole table: one line before anything is planned or started
    gate = [o for o in extra if override_key(o) in {f"model.{k}" for k in GATE_OPTIONS}]
    if gate and any(o.startswith("variant=") for _, g in fgs for o in g):  # each row is a variant: its gate options
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
            or not (fresh and estimate_only) and run_status(sweep_dir / n if t.sweep else sweep_dir) in FINISHED]
    if not fresh:
        refuse_other_recipe(name, scale, [n for n in done if n not in queued], sweep_dir, results)
    own_recipe = all(override_key(o) in REPEAT_KEYS or hydra_key(o) for o in extra)  # else kept runs price nothing
    priced = [p.parent for p in kept.glob("*/metrics.json")] if own_recipe else []  # the runs that price cells
    peak, peak_how = peak_gb(cfg, kept if own_recipe else None)
    todo = [n for n in names if n not in done]
    threads = int(cfg.get("threads") or 1)
    cells = (lambda ns: ns) if t.sweep else (lambda ns: [SINGLE_RUN] * len(ns))  # a single run's kept folder
    secs, how = per_run_s(cells(todo), priced, cfg)
    whole, _ = per_run_s(cells(names), priced, cfg)  # what --fresh would train
    size = group_of(cfg, group) if t.sweep else 1
    grouped = group_commands(jobs_by_name, todo, size) if size > 1 and todo else []  # each without the command
    if size > 1 and todo and not grouped:
        size, how = 1, how + "; not grouped (a cell has no single repeat key, e.g. seed and trial both given)"
    known = None not in secs
    per = threads if on_cpu(cfg) else 0  # a GPU run: GPU-hours
    cost = (f"estimated {cost_of(secs, per, jobs)} ({how})" if todo and known
            else f"no estimate ({how})" if todo else "nothing to train")
    if None not in whole and whole and len(todo) < len(names):
        cost += f"; the whole table: {cost_of(whole, per, jobs)}"
    source = str(kept) + "".join(f", {results / runs_folder(o, scale)}" for o in t.reuse)
    queued_from = f", {len(queued)} to come from {', '.join(t.reuse)} before it in this queue" if queued else ""
    print(f"[{name}] scale={scale}: {len(names)} runs, {len(done)} finished ({len(restored)} restored from {source}"
          f"{queued_from}), {len(todo)} to train; {cost}", flush=True)
    shown = (shlex.join(["python", "-m", "highway_repro.runner", name, "--scale", scale, *extra]) if extra  # by hand
             else f"make {make_target(name)} SCALE={scale}" if name != "demo" else "make demo")
    if todo and peak_how != "default":
        print(f"[{name}] memory: {peak:.1f} GB a run at its peak ({peak_how})", flush=True)
    apart = results / runs_folder(name, scale, apart=True) if kept_apart(scale) else None
    p = TablePlan(name, sweep_dir, kept, not t.sweep, fresh, shown, secs=secs if known else [], threads=threads,
                  todo=todo, peak_gb=peak, apart=apart,
                  reused=frozenset() if fresh else reused_names(name, scale, results))
    if not todo and not estimate_only and sweep_dir.exists():
        keep(sweep_dir, kept, single=not t.sweep, apart=apart, reused=p.reused)  # finished after the last keep
    if estimate_only or not todo:
        return p
    base = [sys.executable, "-m", "highway_repro.train", *["-m"] * t.sweep, f"experiment={t.experiment}",
            f"scale={scale}", "resume=auto", "trainer.progress=false",
            f"hydra.{'sweep' if t.sweep else 'run'}.dir={sweep_dir}"]
    if not t.sweep:
        p.commands, p.costs = [base + fgs[0][1]], secs if known else []
    elif grouped:  # a multirun of the grouped launcher per cell (up to `size` runs of it)
        cost = dict(zip(todo, secs))
        p.commands, p.peak_gb = [base + g for g, _ in grouped], p.peak_gb * GROUP_PEAK
        p.costs = [sum(cost[n] for n in ns) if known else None for _, ns in grouped]
        print(f"[{name}] {len(todo)} runs in {len(grouped)} grouped command(s) (hydra/launcher=grouped, up to "
              f"{size} runs each)", flush=True)
    elif jobs == 1 and not split:  # a whole sweep file's grid in one multirun
        p.commands = [base + [f"sweep={f}"] + g for f, g in fgs]
    else:  # one multirun of one job per run to train, in the grid's order
        p.commands, p.costs = [base + jobs_by_name[n] for n in todo], secs if known else []
    p.progress = Progress(name, sweep_dir, names, wall_s(secs, jobs) if known else None, on_tick=lambda: tick(p),
                          sweep=t.sweep)
    return p


def cost_of(secs: list[float], threads: int, jobs: int) -> str:
    """`N x <a run> = C CPU-hours (threads 0: GPU-hours), W wall with J job(s) ± M % across machines`."""
    total = sum(secs)
    hours = f"{total * threads / 3600:.1f} CPU-hours" if threads else f"{total / 3600:.1f} GPU-hours"
    return (f"{len(secs)} x {duration(total / len(secs))} = {hours}, "
            f"{duration(wall_s(secs, jobs))} wall with {jobs} job(s) ± {MARGIN * 100:.0f} % across machines")


def group_of(cfg, group: str) -> int:
    """Runs a group at most (`group`: auto or a size), 1 where the table's model cannot group."""
    from highway_repro.train.grouped import GROUPABLE, group_size

    size = group_size(group if group == "auto" else int(group))
    return size if str(cfg.model._target_).rsplit(".", 1)[-1] in GROUPABLE else 1


def group_commands(jobs: dict[str, list[str]], todo: list[str], size: int) -> list[tuple[list[str], list[str]]]:
    """(the overrides, the run names) of one grouped multirun per cell (runs that differ in their seed or trial only)
    of the runs `todo` (`jobs`: `grids.named_jobs`), up to `size` each; [] where a cell has no single repeat key."""
    cells = {}
    for name in todo:
        sweep, *job = jobs[name]
        repeat = [o for o in job if override_key(o) in REPEAT_KEYS]
        if len(repeat) != 1:
            return []
        key = (sweep, tuple(o for o in job if o not in repeat), override_key(repeat[0]))
        cells.setdefault(key, []).append((repeat[0].split("=", 1)[1], name))
    return [([sweep, "hydra/launcher=grouped", f"hydra.launcher.size={size}", *cell,
              f"{key}={','.join(v for v, _ in values[i:i + size])}"], [n for _, n in values[i:i + size]])
            for (sweep, cell, key), values in cells.items() for i in range(0, len(values), size)]


def tick(p: TablePlan) -> int:
    """Keep the runs finished so far and write the table's record: its record at the start (`p.base`) plus this command
    and its time until now (and the interval: overlapping parts count once). Returns the number of files kept."""
    n = keep(p.sweep_dir, p.kept, single=p.single, apart=p.apart, reused=p.reused) if p.sweep_dir.exists() else 0
    if p.start is not None:
        base, end = p.base, time.time()
        make_folder(p.kept)
        write_json_atomic(p.kept / "reproduce.json", {  # whole or not at all: the record is committed
            **base, "commands": list(dict.fromkeys(base["commands"] + [p.shown])), "wall_s": base.get("wall_s", 0.0)
            + end - p.start, "intervals": base.get("intervals", []) + [[round(p.start, 1), round(end, 1)]]})
    return n


def finish_table(p: TablePlan) -> None:
    """Keep the table's finished runs and add this command and its time to its record."""
    if p.progress is not None and p.progress.is_alive():
        p.progress.stop.set()
        p.progress.join()  # a tick may be keeping files right now
    make_folder(p.sweep_dir)
    n = tick(p)
    if p.progress is not None:
        print(p.progress.line(), f"- kept files updated: {n}", flush=True)


