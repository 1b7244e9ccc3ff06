"""The prepared-array cache: arrays built once from verified raw files, kept as ``.npy`` files in
``<cache dir>/prepared/<name>-<hash>/`` beside ``info.json`` (the canonical JSON of the build's info: the
vocabulary) and a ``manifest.json`` that records the sha256s of the folder's files.

A folder named in ``PREPARED_SHA256SUMS`` beside this module (the folders the offline mirror's files give, written
by ``python -m highway_repro.data``) must hold the committed sha256s, right after its build and on every use; any
other folder (options nobody committed, raw files only a download brings) is trusted on first use: its manifest,
written by its build, is what later uses check. Every use also verifies the raw files (the checks of
:mod:`highway_repro.data.sources`). A mismatch is a one-line :class:`~highway_repro.data.sources.ChecksumError`
naming the file, both sums and the folder to delete, never a silent rebuild. Files are written atomically, the
manifest last.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import socket
import tempfile
from pathlib import Path

import numpy as np

from highway_repro.errors import make_folder, storage_error, unwritable
from highway_repro.lock import pid_alive

from .sources import ChecksumError, _digest, _get, _read_sums, cache_dir

CACHE_VERSION = 3
INFO = "info.json"
SUMS_FILE = Path(__file__).with_name("PREPARED_SHA256SUMS")
SUMS_NAME = "highway_repro/data/PREPARED_SHA256SUMS"  # how messages name it


def _read_committed(text: str) -> dict[str, dict[str, str]]:
    """``{folder name: {file: sha256}}`` of lines ``<sha256>  <folder name>/<file>`` (sha256sum format)."""
    out: dict[str, dict[str, str]] = {}
    for rel, sha in _read_sums(text).items():
        folder, _, file = rel.partition("/")
        out.setdefault(folder, {})[file] = sha
    return out


COMMITTED: dict[str, dict[str, str]] = _read_committed(SUMS_FILE.read_text())


def _writer() -> str:
    """This process as a cache writer: `<host>-<pid>`, unique across the nodes that share a cache folder."""
    return f"{socket.gethostname().split('.')[0].replace('-', '_')}-{os.getpid()}"


def _save_atomic(path: Path, write) -> None:
    """Write `path` through `<name>.<host>-<pid>.<random>.tmp` (a name of its writer's own, on a file system shared
    by several nodes too) and a rename; a failed write removes its temp file; in a prepared folder, a killed writer's
    is swept by the next build on its host (:func:`_sweep_temp_files`)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.{_writer()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException as e:
        cause = unwritable(e)
        if cause is None and isinstance(e, OSError) and e.errno is None:  # numpy's short write: the disk is full
            cause = OSError(errno.ENOSPC, f"{e} (a short write: the disk is full)")
        if cause is not None:
            raise storage_error(cause, path) from None
        raise
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _sweep_temp_files(folder: Path) -> None:
    """Remove the temp files (`<name>.<host>-<pid>.<random>.tmp`) that a killed writer of this host left in a cache
    folder; those of a writer that still runs, and every one of another host (whose processes this one cannot see:
    nodes sharing the folder), are left to their writers."""
    host, _ = _writer().split("-")
    for tmp in folder.glob(f"*.{host}-*.tmp"):
        pid = tmp.name.split(".")[-3].rpartition("-")[2]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            tmp.unlink(missing_ok=True)


def load_or_build(name: str, key: dict, files, build, cache: str | os.PathLike | None = None):
    """Arrays prepared from the raw files ``files`` (``sources.FILES`` or ``sources.ARCHIVES`` paths), cached as
    ``.npy`` under ``<cache>/prepared/<name>-<hash>/``; the hash is that of ``key`` and of the raw files' sha256s.

    ``build(paths, folder)`` gets ``{relpath: verified path}`` and the folder (for files of its own, e.g. a
    tokenizer model) and returns ``(arrays: dict[str, np.ndarray], info: dict)`` (info JSON-able, kept as
    ``info.json``). Every call verifies the raw files (:func:`sources.fetch`'s checks); a folder in
    :data:`COMMITTED` must hold its committed sha256s right after its build and on every hit; a hit of any other
    folder checks its files against the sha256s of its manifest. A mismatch, or a manifest that cannot be read,
    raises :class:`ChecksumError`; the folder is never rebuilt in its place. Every file is written atomically (temp
    file + os.replace), the manifest last, so a folder without one (its writer was killed, or its build did not give
    the committed files) is built again; the temp files of a killed writer are removed then.
    """
    raw = {rel: _get(rel, cache_dir(cache)) for rel in files}
    blob = json.dumps({"v": CACHE_VERSION, "name": name, **key, "files": {r: s for r, (_, s) in raw.items()}},
                      sort_keys=True, default=str)
    folder = cache_dir(cache) / "prepared" / f"{name}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"
    if (folder / "manifest.json").is_file():
        return _load_prepared(folder, json.loads(blob))
    make_folder(folder)
    _sweep_temp_files(folder)
    arrays, info = build({r: p for r, (p, _) in raw.items()}, folder)
    for k, arr in arrays.items():
        _save_atomic(folder / f"{k}.npy", lambda f, a=arr: np.save(f, a, allow_pickle=False))
    _save_atomic(folder / INFO, lambda f: f.write(json.dumps(info, sort_keys=True, separators=(",", ":")).encode()))
    sums = {p.name: _digest(p, "sha256") for p in sorted(folder.iterdir())
            if p.is_file() and p.name != "manifest.json" and p.suffix != ".tmp"}
    if (anchor := COMMITTED.get(folder.name)) is not None:
        for file in sorted(set(anchor) | set(sums)):
            if (expected := anchor.get(file, "no such file")) != (actual := sums.get(file, "no such file")):
                raise ChecksumError(
                    f"checksum mismatch for prepared {file} at {folder / file}: sha256 expected {expected} (committed "
                    f"in {SUMS_NAME}), got {actual}; its build from the verified raw files gave other bytes (another "
                    f"version of numpy or of the code that prepares it): delete the folder {folder}, and regenerate "
                    f"{SUMS_NAME} with `python -m highway_repro.data` if that code changed")
    man = {"key": json.loads(blob), "sha256": sums,
           "arrays": {k: [list(a.shape), str(a.dtype)] for k, a in arrays.items()}}
    _save_atomic(folder / "manifest.json", lambda f: f.write(json.dumps(man, indent=1).encode()))
    return arrays, info


def _load_prepared(folder: Path, key: dict):
    """(arrays, info) of a prepared folder whose files all match their committed sha256s (a folder in
    :data:`COMMITTED`), else the sha256s of its manifest."""
    manifest, fix = folder / "manifest.json", f"delete the folder {folder} to rebuild it from the raw files"
    try:
        man = json.loads(manifest.read_text())
        sums, names = dict(man["sha256"]), list(man["arrays"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ChecksumError(f"prepared data {manifest} is unreadable ({type(e).__name__}: {e}); {fix}") from None
    anchor = COMMITTED.get(folder.name)
    if (man.get("key") != key or not {f"{k}.npy" for k in names} | {INFO} <= set(sums)
            or anchor is not None and set(anchor) != set(sums)
            or any(not isinstance(f, str) or "/" in f or f in ("", ".", "..") for f in sums)):  # names, not paths
        raise ChecksumError(f"prepared data {manifest} does not describe its folder (other key or files); {fix}")
    expected, at, why = (anchor, f"committed in {SUMS_NAME}", "it is not what the raw files give") if anchor else (
        sums, "its manifest", "it changed after it was written")
    blobs = {}
    for file in sums:
        try:
            blobs[file] = (folder / file).read_bytes()
            actual = hashlib.sha256(blobs[file]).hexdigest()
        except OSError as e:
            actual = f"unreadable ({type(e).__name__}: {e.strerror})"
        if actual != expected[file]:
            raise ChecksumError(f"checksum mismatch for prepared {file} at {folder / file}: sha256 expected "
                                f"{expected[file]} ({at}), got {actual}; {why}: {fix}")
    try:
        return ({k: np.load(io.BytesIO(blobs[f"{k}.npy"]), allow_pickle=False) for k in names},
                json.loads(blobs[INFO]))
    except ValueError as e:
        raise ChecksumError(f"prepared data in {folder} is unreadable ({type(e).__name__}: {e}); {fix}") from None
