"""Progress lines: runs done / total and an ETA from the work left, one a minute per table and per queue."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from highway_repro.report.header import duration
from highway_repro.runner.estimate import per_run_s, run_seconds, wall_s
from highway_repro.runner.keep import FINISHED, run_status

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
    """One line a minute: runs done / total and an ETA; each tick also calls `on_tick` (`table.tick`: keep the runs
    finished so far and record the time), so a sweep killed mid-way loses only its unfinished runs. The ETA is the
    work left (the runs not started, plus the unfinished part of the started ones, by their last logged step of
    `max_steps`), each run at the mean of the finished runs of its cell (`per_run_s`: those of this sweep and the
    kept runs the plan priced it with, `priced`), else at the estimate for such a cell (`est`), else at the pace of
    the runs finished in this sweep, shared by `jobs`, each priced alone on this machine (`speedup`, `elsewhere`,
    `cpu_only`: `estimate.run_seconds`, as the plan prices them); times `speed`, the factor of grouped runs
    (`table.plan_table`)."""

    def __init__(self, name: str, sweep_dir: Path, names: list[str], jobs: int, est: float | None, every: float = 60,
                 max_steps: int | None = None, on_tick=None, sweep: bool = True, speed: float = 1.0,
                 speedup: float | None = None, elsewhere: float = 1.0, cpu_only: bool = False,
                 priced: list[Path] = ()):
        super().__init__(daemon=True)
        (self.name_, self.sweep_dir, self.names, self.jobs, self.est,
         self.every) = name, sweep_dir, names, jobs, est, every
        self.max_steps, self.on_tick, self.sweep = max_steps, on_tick, sweep
        self.speed, self.speedup, self.elsewhere, self.cpu_only = speed, speedup, elsewhere, cpu_only
        self.priced = list(priced)
        self.stop = threading.Event()
        self.start_done = {n for n in names if run_status(self._folder(n)) in FINISHED}

    def _folder(self, name: str) -> Path:
        """A job's run folder (a single-run table runs in the sweep folder itself)."""
        return self.sweep_dir / name if self.sweep else self.sweep_dir

    def state(self) -> tuple[int, int, list]:
        """(runs done, runs failed, the seconds each run still to go needs on one job: None where unknown)."""
        done = [n for n in self.names if run_status(self._folder(n)) in FINISHED]
        failed = [n for n in self.names if run_status(self._folder(n)) == "failed"]
        per = self.est  # a cell with no finished run
        if per is None:  # no estimate: the pace of the runs finished in this sweep
            new = run_seconds([self._folder(n) for n in done if n not in self.start_done], self.cpu_only,
                              self.speedup, self.elsewhere)
            per = sum(new) / len(new) if new else None
        todo = [n for n in self.names if n not in done and n not in failed]
        runs = {r.name: r for r in self.priced} | {n: self._folder(n) for n in done}  # a run of this sweep wins
        secs = (per_run_s(todo, list(runs.values()), per, self.cpu_only, self.speedup, self.elsewhere)
                if self.sweep else [per] * len(todo))
        if self.max_steps:  # the unfinished part of started runs
            secs = [s and s * (1.0 - min(1.0, _last_step(self._folder(n)) / self.max_steps))
                    for n, s in zip(todo, secs)]
        secs = [s and s * self.speed for s in secs]
        return len(done), len(failed), secs

    def line(self) -> str:
        return progress_line(self.name_, len(self.names), *self.state(), self.jobs)

    def run(self) -> None:
        while not self.stop.wait(self.every):
            if self.on_tick is not None:
                self.on_tick()
            print(self.line(), flush=True)


