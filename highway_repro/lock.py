"""One writer per run folder and per table: an OS lock (flock) on a small file, taken without waiting.

    with take(out_dir / RUN_LOCK, f"run folder {out_dir}", "one writer per run folder"):
        ...  # train in out_dir

- A second writer is refused at once with one line naming the holder (`BusyError`, exit code 2 at the entry
  points): `run folder runs/x is in use by pid 1234 on host h since <its start time> (valid: one writer per
  run folder; wait for it or stop it)`.
- The kernel drops a flock when the process holding it dies, also by kill -9: a lock file left by a dead holder
  is free, and the next writer takes it over. There is nothing to clean up and no staleness to guess.
- Once taken, the file holds the holder's pid, host and start time (what a refused writer reads); released, it
  is removed (a writer that opened it just before it was removed sees that and takes the new file).
- The trainer's lock is `<run folder>/.writer.lock` (`train.job.held`; rank 0 under DDP), taken before the run
  folder is read or written and held until the job ends. Before it, Hydra has already written the folder's
  `.hydra/` files (config.yaml, hydra.yaml, overrides.yaml: the same content for the same command; a
  different command aimed at a busy folder rewrites them with its own before it is refused) and opened
  `train.log` for appending. The kept runs copy only `targets.KEPT_FILES` and the reports find runs by
  their metrics.json or .hydra/, so neither sees the lock file.
- The runner's lock of a table is `<runs root>/.locks/<table>-<scale>.lock` (`runner.cli.hold_tables`): outside
  the sweep folder, which `--fresh` deletes while the lock is held, and outside results/, which is committed.

fcntl rather than the `filelock` package: this is a dozen lines of flock, the file holds the holder's name
itself, and nothing changes with a package's version (filelock 3 truncates the file each time it opens it, also
when the lock is refused; filelock 4 adds soft-lock fallbacks and fork hooks); the project runs on POSIX
systems only. No torch: importable before anything else.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from highway_repro.errors import BusyError, storage_error, unwritable

RUN_LOCK = ".writer.lock"  # in a run folder: the trainer's


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs on this machine (a process of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def holder(path: Path) -> str:
    """Who holds the lock `path`, as the holder wrote it (`pid 1234 on host h since ...`); read for up to 0.2 s,
    since a holder writes it just after it took the lock."""
    for _ in range(20):
        try:
            h = json.loads(Path(path).read_text())
            return f"pid {h['pid']} on host {h['host']} since {h['since']}"
        except (OSError, ValueError, KeyError, TypeError):
            time.sleep(0.01)
    return "another process"


class Lock:
    """A held lock (`take`): released by `release()` or at the end of a `with` block; by the kernel if the process
    dies first."""

    def __init__(self, path: Path, fd: int):
        self.path, self.fd = path, fd

    def release(self) -> None:
        if self.fd is None:
            return
        self.path.unlink(missing_ok=True)  # while still held: no one can take the file about to go
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> "Lock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def take(path: Path, what: str, allowed: str) -> Lock:
    """The lock `path`, without waiting; BusyError when another process (or another `take` in this one) holds it:
    `<what> is in use by pid ... (valid: <allowed>; wait for it or stop it)`. A folder that cannot be written is a
    StorageError."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise BusyError(f"{what} is in use by {holder(path)} (valid: {allowed}; wait for it or stop it)") \
                    from None
            try:
                if os.path.samestat(os.fstat(fd), os.stat(path)):
                    break
            except FileNotFoundError:
                pass
            os.close(fd)  # its holder removed this file as it released it: take the one there now
        lock = Lock(path, fd)
        try:
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                     "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())
        except BaseException:
            lock.release()
            raise
    except OSError as e:
        if unwritable(e) is not None:
            raise storage_error(e, path) from None
        raise
    return lock
