"""The queue of runs: commands N at a time, each in its own process group (and on its own GPU where there are
several), held back while its memory does not fit, stopped as a whole on a signal; or SLURM jobs (`slurm.py`)."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from highway_repro.engine.loggers import write_json_atomic
from highway_repro.runner.estimate import gpu_ids
from highway_repro.runner.keep import FINISHED, read_record, run_object, run_status
from highway_repro.runner.progress import queue_line
from highway_repro.runner.table import TablePlan, finish_table
from highway_repro.runtime import on_stop_signals
from highway_repro.targets import ROOT

FOLLOW_UPS: set = set()  # running follow-up steps of reports (`Target.after`): stopped with the queue
QUEUE_LINE_EVERY_S = 60.0
LOST_TRIES = 3  # a cluster job lost without a result (a failed node, an admin's scancel) is submitted again


def _kernel_counts(paths: list[str], key: str) -> list[int]:
    """The values of `key` in the kernel's `key value` files `paths` (those that exist and read)."""
    out = []
    for path in paths:
        try:
            out += [int(line.split()[1]) for line in Path(path).read_text().splitlines() if line.split()[:1] == [key]]
        except (OSError, ValueError, IndexError):
            continue
    return out


def mem_available_gb() -> float | None:
    """GiB the kernel can give new work without swapping (/proc/meminfo MemAvailable); None where unknown."""
    found = _kernel_counts(["/proc/meminfo"], "MemAvailable:")
    return found[0] / 2**20 if found else None


def oom_kills() -> int | None:
    """The kernel's count of out-of-memory kills (/proc/vmstat plus cgroup v2 memory.events); None without either."""
    found = _kernel_counts(["/proc/vmstat", "/sys/fs/cgroup/memory.events"], "oom_kill")
    return sum(found) if found else None


def _mark_killed(p: TablePlan, why: str) -> Path | None:
    """Note why it died (`killed` in run_info.json, shown in the report) in the unfinished run written to last."""
    runs = [p.sweep_dir] if p.single else [p.sweep_dir / n for n in p.todo if (p.sweep_dir / n).is_dir()]
    run = max([r for r in runs if run_status(r) not in FINISHED], default=None,
              key=lambda r: max((f.stat().st_mtime for f in r.rglob("*") if f.is_file()), default=0.0))
    if run is not None:
        write_json_atomic(run / "run_info.json", {**(run_object(run / "run_info.json") or {}), "killed": why})
    return run


def pick_gpu(gpus: list[str], held: list[str]) -> str | None:
    """The GPU a job starting now gets: the first that the fewest running jobs hold; None under 2 GPUs (it sees all)."""
    return min(gpus, key=held.count) if len(gpus) > 1 else None


class StopRequest:
    """SIGINT / SIGTERM / SIGHUP while a queue runs, recorded for its loop to act on (a second one: kill now)."""

    def __init__(self):
        self.signum, self.count = 0, 0

    def __call__(self, signum, frame):
        self.signum, self.count = self.signum or signum, self.count + 1


def exit_code(rc: int) -> int:
    return 128 - rc if rc < 0 else rc  # killed by signal k: 128 + k, as a shell says


def run_queue(plans: list[TablePlan], jobs: int, on_table_end=lambda p: None, cluster=None) -> int:
    """Run the commands of every plan in order, `jobs` at a time (a failed one stops nothing); a table's last command
    keeps its runs and calls `on_table_end(plan)`; a stop signal stops all (`stop_sweep`): exit 128 + signal.
    `cluster` (`slurm.Cluster`): all submitted at once, a lost job again up to LOST_TRIES times (`cluster.detach`:
    return once submitted). Returns the first non-zero exit status."""
    queue = [(p, cmd, s) for p in plans for cmd, s in zip(p.commands, p.costs or [None] * len(p.commands))]
    for p in plans:
        p.left = len(p.commands)
    live: list[tuple[TablePlan, subprocess.Popen]] = []
    status, stop, shown = 0, StopRequest(), time.time()
    budget, held, kills_at = mem_available_gb() if cluster is None else None, set(), {}  # GiB for its jobs
    gpus, gpu_of = gpu_ids() if jobs > 1 and cluster is None else [], {}  # one GPU per job: {pid: its GPU}
    old = on_stop_signals(stop)
    try:
        if cluster is not None:  # every command at once, as job arrays
            for p in plans:
                _start(p, progress=not cluster.detach)
            live, queue = cluster.submit([(p, [(c, s) for q, c, s in queue if q is p]) for p in plans]), []
            if cluster.detach:
                print(f"[slurm] {cluster.line()}; detached: the same command follows these jobs, keeps what "
                      "finished and submits again what was lost", flush=True)
                return 0
        while (queue or live) and not stop.signum:
            while queue and len(live) < jobs and not stop.signum:
                reserved = [q.peak_gb for q, _ in live]
                # the first command that fits beside the running ones (alone, any does); a later, smaller one may pass
                i = next((k for k, (q, *_) in enumerate(queue)
                          if budget is None or not live or sum(reserved) + q.peak_gb <= budget), None)
                if i is None:  # said once a table
                    if (q := queue[0][0]).name not in held:
                        held.add(q.name)
                        print(f"[{q.name}] held back: a run needs {q.peak_gb:.1f} GB at its peak, and "
                              f"{sum(reserved):.1f} of the {budget:.1f} GB available are reserved for "
                              f"{len(live)} running job(s)", flush=True)
                    break
                p, cmd, _ = queue.pop(i)
                if not live and budget is not None and p.peak_gb > budget:
                    print(f"[{p.name}] warning: a run needs {p.peak_gb:.1f} GB at its peak, more than the "
                          f"{budget:.1f} GB available; it runs alone", file=sys.stderr, flush=True)
                _start(p)
                gpu = pick_gpu(gpus, [gpu_of.get(x.pid) for _, x in live])
                env = None if gpu is None else {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
                print("+", *([f"CUDA_VISIBLE_DEVICES={gpu}"] if gpu is not None else []), shlex.join(cmd), flush=True)
                proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, env=env)  # stopped as a group
                gpu_of[proc.pid], kills_at[proc.pid] = gpu, oom_kills()
                live.append((p, proc))
            time.sleep(0.5)
            if (len(plans) > 1 or cluster is not None) and time.time() - shown >= QUEUE_LINE_EVERY_S:
                print(queue_line(plans, cluster and f"slurm: {cluster.line()}"), flush=True)
                shown = time.time()
            for p, proc in [x for x in live if x[1].poll() is not None]:
                live.remove((p, proc))
                if getattr(proc, "lost", False) and proc.tries < LOST_TRIES:
                    print(f"[{p.name}] {proc.pid} was lost without a result: submitted again", flush=True)
                    live += cluster.submit([(p, [(proc.cmd, proc.secs)])], proc.tries + 1)
                    continue
                rc = exit_code(proc.returncode)
                status = status or rc
                before, now = kills_at.pop(proc.pid, None), oom_kills()
                if proc.returncode == -signal.SIGKILL and None not in (before, now) and now > before:
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
                    on_table_end(p)
        if stop.signum:
            stop_sweep([proc for _, proc in live] + list(FOLLOW_UPS), stop)
            for p in plans:
                if p.start is not None and p.left:  # started, not ended: keep what finished, record the time
                    finish_table(p)
    except BaseException:  # never leave trainers running unsupervised (SLURM's jobs: the same command re-attaches)
        stop_sweep([proc for _, proc in live] if cluster is None else [], stop)
        raise
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if stop.signum:  # the user stopped it: no report, no next table
        print(f"stopped by signal {stop.signum}; the same command continues the sweep", file=sys.stderr)
        raise SystemExit(128 + stop.signum)
    return status


def _start(p: TablePlan, progress: bool = True) -> None:
    """A table's first command starts: its start time, its record as it was, its progress lines."""
    if p.start is None:
        p.start, p.base = time.time(), read_record(p.kept, p.fresh)
        if p.progress is not None and progress:
            p.progress.start()


def stop_sweep(procs: list[subprocess.Popen], stop: StopRequest | None = None, grace_s: float = 60.0) -> None:
    """Stop the running commands: SIGTERM to each one's process group each second (a trainer saves at its step; a
    launcher's workers outlive their main process), SIGKILL after `grace_s` or a 2nd signal; cluster jobs: scancel."""
    if jobs := [p for p in procs if hasattr(p, "cluster")]:
        jobs[0].cluster.cancel(jobs)
    procs = [p for p in procs if not hasattr(p, "cluster")]
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
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    for proc in procs:
        proc.wait()


