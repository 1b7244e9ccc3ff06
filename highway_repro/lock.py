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
- The trainer's lock is `<run folder>/.writer.lock` (rank 0 under DDP), taken as the job starts, before the run
  folder's `.hydra/` files (config.yaml, hydra.yaml, overrides.yaml) are written, and held until the job ends
  (`train.job.RunFolder`, a Hydra callback, hands it to `train.job.held`): a command refused on a busy folder
  leaves them, config_resolved.yaml and metrics.json as they were. Before it, Hydra has created the folder and
  opened `train.log` for appending. The kept runs copy only `targets.KEPT_FILES` and the reports find runs by
  their metrics.json or .hydra/, so neither sees the lock file.
- A lock file is never written through a link: a symbolic link at its path (or a file with other hard links) is
  refused in one line (`StorageError`), and `release` removes the path only while it is still the holder's file.
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
import stat
import time
from pathlib import Path

from highway_repro.errors import BusyError, StorageError, make_folder, storage_error, unwritable

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
        try:  # while still held: no one can take the file about to go; a path that is no longer its file stays
            if os.path.samestat(os.fstat(self.fd), os.lstat(self.path)):
                self.path.unlink()
        except FileNotFoundError:
            pass
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> "Lock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def take(path: Path, what: str, allowed: str) -> Lock:
    """The lock `path`, without waiting; BusyError when another process (or another `take` in this one) holds it:
    `<what> is in use by pid ... (valid: <allowed>; wait for it or stop it)`. A folder that cannot be written, or a
    path that is a symbolic link (never followed) or a file with other links, is a StorageError."""
    path = Path(path)
    make_folder(path.parent)
    try:
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError:
                if path.is_symlink():
                    raise StorageError(f"cannot write {path}: it is a symbolic link (valid: a regular file; remove "
                                       "the link)") from None
                raise
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
                os.close(fd)
                raise StorageError(f"cannot write {path}: it is not a regular file of its own (valid: a regular file "
                                   "with no other hard links; remove it)")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise BusyError(f"{what} is in use by {holder(path)} (valid: {allowed}; wait for it or stop it)") \
                    from None
            try:
                if os.path.samestat(os.fstat(fd), os.lstat(path)):
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
