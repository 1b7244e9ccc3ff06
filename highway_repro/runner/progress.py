"""Progress lines, one a minute per table and per queue: runs finished / total, and an ETA that follows wall time
(the plan's estimate less the time gone until a run of this command finishes, then the pace of those finished)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from highway_repro.report.header import duration
from highway_repro.runner.keep import FINISHED, run_status


def eta(left: int, planned: float | None, elapsed: float, finished_now: int) -> str:
    """`ETA <duration>` of `left` runs: `elapsed` wall seconds per `finished_now` runs finished by this command,
    else the `planned` wall seconds less `elapsed` (at least 0); `ETA unknown` without either."""
    if finished_now:
        return f"ETA {duration(elapsed / finished_now * left)}"
    return f"ETA {duration(max(0.0, planned - elapsed))}" if planned is not None else "ETA unknown"


def progress_line(name: str, total: int, done: int, failed: int, when: str) -> str:
    """`[name] done/total runs done, failed, left to go; <when>`."""
    left = total - done - failed
    return (f"[{name}] {done}/{total} runs done" + (f", {failed} failed" if failed else "")
            + f", {left} to go; {when if left else 'finished'} ({time.strftime('%H:%M')})")


def queue_line(plans: list, name: str | None = None) -> str:
    """One line for a queue of several tables (or a cluster's, `name`): their runs done / total, and the ETA of all
    the work left at the pace of the runs this queue has finished (else the plans' estimate)."""
    ps = [p.progress for p in plans if p.progress is not None]
    states = [(len(x.names), *x.state()) for x in ps]
    total, done, failed, now = (sum(s[i] for s in states) for i in range(4))
    starts = [x.started for x in ps if x.started is not None]
    elapsed = time.time() - min(starts) if starts else 0.0
    planned = sum(x.planned for x in ps) if all(x.planned is not None for x in ps) else None
    return progress_line(name or f"queue of {len(ps)} tables", total, done, failed,
                         eta(total - done - failed, planned, elapsed, now))


class Progress(threading.Thread):
    """One line a minute: runs done / total and an ETA (`eta`, `planned`: the plan's wall seconds); each tick also
    calls `on_tick` (`table.tick`: keep the runs finished so far and record the time), so a sweep killed mid-way
    loses only its unfinished runs."""

    def __init__(self, name: str, sweep_dir: Path, names: list[str], planned: float | None = None,
                 every: float = 60, on_tick=None, sweep: bool = True):
        super().__init__(daemon=True)
        self.name_, self.sweep_dir, self.names, self.planned, self.every = name, sweep_dir, names, planned, every
        self.on_tick, self.sweep, self.started = on_tick, sweep, None
        self.stop = threading.Event()
        self.start_done = {n for n in names if run_status(self._folder(n)) in FINISHED}

    def start(self) -> None:
        self.started = time.time()
        super().start()

    def _folder(self, name: str) -> Path:
        """A job's run folder (a single-run table runs in the sweep folder itself)."""
        return self.sweep_dir / name if self.sweep else self.sweep_dir

    def state(self) -> tuple[int, int, int]:
        """(runs done, runs failed, runs finished since this command started)."""
        status = {n: run_status(self._folder(n)) for n in self.names}
        done = [n for n, s in status.items() if s in FINISHED]
        return len(done), sum(s == "failed" for s in status.values()), len(set(done) - self.start_done)

    def line(self) -> str:
        done, failed, now = self.state()
        elapsed = time.time() - self.started if self.started is not None else 0.0
        left = len(self.names) - done - failed
        return progress_line(self.name_, len(self.names), done, failed, eta(left, self.planned, elapsed, now))

    def run(self) -> None:
        while not self.stop.wait(self.every):
            if self.on_tick is not None:
                self.on_tick()
            print(self.line(), flush=True)
