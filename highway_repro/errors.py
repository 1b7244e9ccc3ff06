"""The project's own error classes (no torch; importable before anything else).

Everything raised for a mistake the USER can fix (a bad option, a config value, a corrupt or mismatched
checkpoint, a missing or damaged data file) is a subclass of `HighwayError`, so that the entry point
(`highway_repro.train`) reports exactly these in one line, without a traceback, and lets every other
exception (a bug) keep its traceback. `HighwayError` is a `ValueError`, so code that caught ValueError
before keeps working.

A write that fails for a reason the user can fix (a full disk, a read-only folder: `UNWRITABLE`) is reported
the same way, as a `StorageError` naming the path (`storage_error`).

What belongs here: the base class and the error classes that several packages raise or catch (`ConfigError`,
`StorageError`). Errors of one package may live in that package (`engine.checkpoint.CheckpointError`,
`data.sources.DataError`) as long as they subclass `HighwayError`.
"""

from __future__ import annotations

import argparse
import errno


class HighwayError(ValueError):
    """Base of every error that reports a user mistake (one line: what was wrong and what is allowed)."""


class ConfigError(HighwayError):
    """A bad option or config value: `model.d_ff=0 is not allowed (valid: a positive integer)`.

    Raised by `highway_repro.options` (so by the model constructors and by `config.validate`)."""


class BusyError(HighwayError):
    """A run folder or a table that another process writes (`highway_repro.lock`): `run folder runs/x is in use by
    pid 1234 on host h since <its start time> (valid: one writer per run folder; wait for it or stop it)`."""


# The errno values of a write that the user can fix: a full disk or quota, a file-size limit (`ulimit -f`), a
# read-only file system, no permission, a path that is a file or lies under one, a name too long, a failing device.
UNWRITABLE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.EEXIST,
              errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG, errno.ELOOP, errno.EIO}


class StorageError(HighwayError):
    """A file or folder the run must write cannot be written (see `UNWRITABLE`): `cannot write <path>: ...`."""


def unwritable(e: BaseException) -> OSError | None:
    """The OSError of `UNWRITABLE` that caused `e` (`e` itself, or along its cause and context: torch.save reports a
    full disk as a RuntimeError raised while handling it), else None."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError) and e.errno in UNWRITABLE:
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def unmade(e: BaseException, folder) -> OSError | None:
    """`e` where it is the FileNotFoundError of making `folder` or one of its parents (a folder under /proc, say,
    which takes no new ones), else None."""
    if isinstance(e, FileNotFoundError) and e.filename is not None and folder is not None:
        return e if str(folder).startswith(str(e.filename)) else None
    return None


def storage_error(e: OSError, path=None) -> StorageError:
    """The one line for an OSError of `UNWRITABLE`: the path (`path`, else the error's own), what the system said
    and what to do."""
    where = path if path is not None else e.filename if e.filename is not None else "the run folder"
    return StorageError(f"cannot write {where}: {e.strerror or e} (valid: a writable folder with free space; free "
                        "some space, fix the permissions or choose another hydra.run.dir)")


def make_folder(path) -> None:
    """`path` and its parents made where missing; a folder that cannot be made (a full disk, no permission, under a
    file, under a folder that takes no new ones, such as /proc) is a StorageError naming it."""
    from pathlib import Path

    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise storage_error(e, path) from None


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose errors are one line and exit code 2, like every other user error of the project
    (argparse's own prints the usage first): `error: --jobs=0: runs at once, at least 1 (see --help)`."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")
