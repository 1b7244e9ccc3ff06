"""Progress lines, one a minute per table and per queue: runs done / total, and an ETA that follows wall time (the
plan's estimate less the time gone until a run of this command finishes, then the pace of those finished)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from highway_repro.report.header import duration
from highway_repro.runner.keep import FINISHED, run_status


def progress_line(name: str, total: int, done: int, failed: int, now: int, planned: float | None,
                  elapsed: float) -> str:
    """`[name] done/total runs done, failed, left to go; ETA` of runs of which `now` finished by this command in
    `elapsed` wall seconds (their pace prices the rest), else of `planned` wall seconds less `elapsed`."""
    left = total - done - failed
    when = (f"ETA {duration(elapsed / now * left)}" if now else "ETA unknown" if planned is None
            else f"ETA {duration(max(0.0, planned - elapsed))}")
    return (f"[{name}] {done}/{total} runs done" + (f", {failed} failed" if failed else "")
            + f", {left} to go; {when if left else 'finished'} ({time.strftime('%H:%M')})")


def queue_line(plans: list, name: str | None = None) -> str:
    """The line of a queue of several tables (or a cluster's, `name`), its ETA that of all the work left."""
    ps = [p.progress for p in plans if p.progress is not None]
    states = [(len(x.names), *x.state()) for x in ps]
    starts = [x.started for x in ps if x.started is not None]
    planned = sum(x.planned for x in ps) if all(x.planned is not None for x in ps) else None
    return progress_line(name or f"queue of {len(ps)} tables", *(sum(s[i] for s in states) for i in range(4)),
                         planned, time.time() - min(starts) if starts else 0.0)


class Progress(threading.Thread):
    """One line a minute (`planned`: the plan's wall seconds), each tick after `on_tick` (`table.tick`)."""

    def __init__(self, name: str, sweep_dir: Path, names: list[str], planned: float | None = None,
                 every: float = 60, on_tick=lambda: None, sweep: bool = True):
        super().__init__(daemon=True)
        self.name_, self.names, self.planned, self.every = name, names, planned, every
        self.on_tick, self.started, self.stop = on_tick, None, threading.Event()
        self.folders = {n: sweep_dir / n if sweep else sweep_dir for n in names}  # a single run: the sweep folder
        self.start_done = {n for n in names if run_status(self.folders[n]) in FINISHED}

    def state(self) -> tuple[int, int, int]:
        """(runs done, runs failed, runs finished since this command started)."""
        status = {n: run_status(f) for n, f in self.folders.items()}
        done = [n for n, s in status.items() if s in FINISHED]
        return len(done), sum(s == "failed" for s in status.values()), len(set(done) - self.start_done)

    def line(self) -> str:
        elapsed = time.time() - self.started if self.started is not None else 0.0
        return progress_line(self.name_, len(self.names), *self.state(), self.planned, elapsed)

    def run(self) -> None:
        self.started = time.time()
        while not self.stop.wait(self.every):
            self.on_tick()
            print(self.line(), flush=True)
