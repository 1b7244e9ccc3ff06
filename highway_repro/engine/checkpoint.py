"""Checkpoints: plain dicts, written atomically (temp file + fsync + rename), read without running code.

A checkpoint holds {format_version, model, optimizer, scheduler, step, best_val, rng, config, mems, extra}:
tensors and plain Python values only (the numpy RNG state as a dict with its key as a tensor). `load` reads
with `torch.load(weights_only=True)`, which builds tensors and plain values and nothing else; a checkpoint written
before the numpy RNG state was stored as plain data (a numpy array: exactly the globals of `OLD_NUMPY_GLOBALS`)
is an `OldCheckpointError`, one line naming the migration that rewrites it (scripts/migrate_kept_runs.py). A file
that asks for anything else (a pickle calling `os.system`, say, in a zip or bare, of any pickle protocol) is refused
with `UnsafeCheckpointError`, one line naming the file and what it asks for. Neither is taken for a corrupt file
(nothing falls back from it, nothing renames it).

`resume=auto` loads `ckpt/last.pt`; if that file is truncated or corrupt it is reported by name, renamed to
`last.pt.corrupt` (so that the next save does not rotate it into prev.pt) and the previous good one
(`ckpt/prev.pt`, the last.pt before the latest write) is used instead. A writer killed mid-write leaves only a
`.<name>.pt.tmp<pid>` file, removed by the next save once that pid is dead (`save`); a write that fails (a full
disk: `StorageError`) removes its own.
"""

from __future__ import annotations

import logging
import io
import os
import pickle
import pickletools
import random
import re
import warnings
import zipfile
from pathlib import Path

import numpy as np
import torch

from highway_repro.engine.loggers import discard
from highway_repro.errors import HighwayError, storage_error, unwritable
from highway_repro.lock import pid_alive

FORMAT_VERSION = 1
log = logging.getLogger(__name__)


class CheckpointError(HighwayError):
    """A checkpoint that is missing, corrupt, of another format version or of another architecture."""


class OldCheckpointError(HighwayError):
    """A checkpoint of this project in an older format: refused with the migration that rewrites it. Not a
    CheckpointError: nothing falls back from it to an older checkpoint (which has the same format) or starts over."""


class UnsafeCheckpointError(HighwayError):
    """A checkpoint file that asks for code (a global) no checkpoint of this project holds: refused, never run.

    Not a CheckpointError: such a file is not corrupt, and nothing falls back from it to an older checkpoint."""


def _old_numpy_globals() -> list:
    """What a numpy RNG state pickled as a numpy array (checkpoints written before it was stored as plain data)
    asks for: the array's reconstructor, ndarray, dtype and the class of its uint32 dtype. Only recognised here (the
    file is refused naming the migration); scripts/migrate_kept_runs.py reads it with exactly these allowed."""
    reconstruct = np.zeros(1, dtype=np.uint32).__reduce__()[0]  # numpy._core.multiarray._reconstruct (numpy 2)
    return [reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


OLD_NUMPY_GLOBALS = _old_numpy_globals()


def atomic_torch_save(obj, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:  # a full disk, a read-only folder, an exception: no partial temp file is left
        discard(tmp)
        cause = unwritable(e)
        if cause is not None:
            raise storage_error(cause, path) from None
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def rng_state() -> dict:
    """The RNG states as plain data: Python's (a tuple of ints), numpy's (a dict, its MT19937 key as an int64
    tensor), torch's (byte tensors)."""
    _, key, pos, has_gauss, cached_gaussian = np.random.get_state()
    numpy_state = {"bit_generator": "MT19937", "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                   "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)}
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _numpy_state(saved: dict) -> tuple:
    """np.random.set_state's tuple from a checkpoint's numpy entry (the plain dict of `rng_state`)."""
    key = saved["key"]
    key = key.numpy() if torch.is_tensor(key) else np.asarray(key)
    return (saved["bit_generator"], key.astype(np.uint32), int(saved["pos"]), int(saved["has_gauss"]),
            float(saved["cached_gaussian"]))


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(_numpy_state(state["numpy"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(ckpt_dir: Path, name: str, payload: dict) -> Path:
    """Write ckpt_dir/name.pt atomically; for `last`, the previous last.pt is kept as prev.pt.

    A temp file `.<name>.pt.tmp<pid>` whose writer is dead (killed mid-write) is removed; one of a live process is
    left to it. The run folder's lock (`highway_repro.lock`, taken by `train.job.held`) already keeps a second trainer
    out; the pid check keeps a save that runs without it (a script, a test) from deleting a live writer's file. A
    dead writer's pid taken by a new process keeps its file until that process ends: a stray file, never a loss."""
    ckpt_dir = Path(ckpt_dir)
    path = ckpt_dir / f"{name}.pt"
    payload = {"format_version": FORMAT_VERSION, **payload}
    for stale in ckpt_dir.glob(".*.pt.tmp*"):
        pid = stale.name.rpartition(".tmp")[2]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            stale.unlink(missing_ok=True)
    if name == "last" and path.exists():
        os.replace(path, ckpt_dir / "prev.pt")
    atomic_torch_save(payload, path)
    return path


def _reason(error: Exception) -> str:
    """One line of a load error: torch's own detail where the weights-only loader gives one."""
    lines = [x.strip() for x in str(error).splitlines() if x.strip()]
    detail = [x for x in lines if x.startswith("Unsupported operand")]
    return (detail or lines or [""])[0]


def _global_name(obj) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def _allowed(names: list[str]) -> list[str]:
    """The names among `names` that torch's weights-only loader builds by default or OLD_NUMPY_GLOBALS holds."""
    ours = {_global_name(g) for g in OLD_NUMPY_GLOBALS}
    try:
        from torch import _weights_only_unpickler as wou

        torch_own = set(wou._get_allowed_globals())
    except (ImportError, AttributeError):  # a torch without that table: its own types and OrderedDict
        return [n for n in names if n in ours or n.startswith("torch.") or n == "collections.OrderedDict"]
    return [n for n in names if n in ours or n in torch_own]


def _pickles(path: Path) -> list[bytes]:
    """The pickle streams of a checkpoint file: a zip's data.pkl, else the raw file (a bare or legacy pickle)."""
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as z:
                return [z.read(n) for n in z.namelist() if n.endswith("data.pkl")]
        except (zipfile.BadZipFile, OSError, EOFError, ValueError):
            return []
    return [path.read_bytes()]


def _globals_asked(path: Path) -> list[str]:
    """Every global the file's pickles name (module.name), read statically (pickletools: nothing is imported or
    called), up to where a stream stops parsing: a truncated file still tells what it asked for before its end."""
    found: list[str] = []
    for data in _pickles(path):
        stream = io.BytesIO(data)
        for _ in range(8):  # a legacy torch file is a few pickles in a row, then raw storage bytes
            pushed: list = []  # what the opcodes pushed (strings, else None): STACK_GLOBAL takes the last two
            memo: dict = {}
            try:
                for op, arg, _pos in pickletools.genops(stream):
                    if op.name in ("GLOBAL", "INST"):
                        found.append(".".join(str(arg).split(" ", 1)))
                    elif op.name == "STACK_GLOBAL":
                        found.append(f"{pushed[-2] if len(pushed) > 1 else '?'}.{pushed[-1] if pushed else '?'}")
                    elif op.name == "MEMOIZE":
                        memo[len(memo)] = pushed[-1] if pushed else None
                    elif op.name in ("PUT", "BINPUT", "LONG_BINPUT"):
                        memo[arg] = pushed[-1] if pushed else None
                    elif op.name in ("GET", "BINGET", "LONG_BINGET"):
                        pushed.append(memo.get(arg))
                    elif op.stack_after:
                        pushed.append(arg if isinstance(arg, str) else None)
            except Exception:  # the end of the readable pickles
                break
            if stream.tell() >= len(data):
                break
    return list(dict.fromkeys(found))


def _refused(path: Path, error: Exception) -> list[str]:
    """What in the file the weights-only loader refused (globals or types named), [] when it is plain damage. Read
    by the project's own static scan (`_globals_asked`), not torch's `get_unsafe_globals_in_checkpoint`, which reads
    only the pickle protocol torch.save writes: a crafted protocol-4 pickle in a zip, or a bare pickle, stops it
    before the global it asks for, and would pass for a corrupt file."""
    msg = str(error)
    named = re.findall(r"GLOBAL ([\w.]+)", msg) + re.findall(r"but got <class '([\w.]+)'>", msg)
    asked = [g for g in _globals_asked(path) if re.fullmatch(r"[A-Za-z_][\w.]*\.\w+", g)]
    asked = [g for g in asked if g not in _allowed(asked)]
    named = [n for n in named if not any(g == n or g.endswith(f".{n}") for g in asked)]  # exec: builtins.exec
    return list(dict.fromkeys(named + asked))


def load_old_format(path: Path) -> dict:
    """A checkpoint of the older format, read with exactly the old numpy state's globals allowed (weights only), as
    scripts/migrate_kept_runs.py reads it."""
    with torch.serialization.safe_globals(OLD_NUMPY_GLOBALS), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected pickle protocol")
        return torch.load(path, map_location="cpu", weights_only=True)


def _is_old(ckpt) -> bool:
    """A checkpoint read by `load_old_format` is of the older format when its numpy RNG state is np.random.get_state()'s
    tuple (a numpy array anywhere else is no checkpoint of ours)."""
    return isinstance(ckpt, dict) and isinstance((ckpt.get("rng") or {}).get("numpy"), tuple)


def old_format(path: Path) -> bool:
    """Whether `path` is a checkpoint of the older format (scripts/migrate_kept_runs.py rewrites those)."""
    try:
        return _is_old(load_old_format(path))
    except Exception:
        return False


def load(path: Path, map_location="cpu") -> dict:
    """Load and check one checkpoint, running no code from it: a truncated/corrupt file raises CheckpointError
    naming it, a file that asks for a global no checkpoint holds raises UnsafeCheckpointError naming both."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected pickle protocol")  # a bare pickle: refused below
            ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # a refused global (UnpicklingError); or a truncated zip, garbage bytes, ...
        if isinstance(e, pickle.UnpicklingError):
            try:
                old = load_old_format(path)
            except Exception as beyond:  # it asks for more than the older format's numpy globals: that is named
                e = beyond
            else:
                if _is_old(old):
                    raise OldCheckpointError(
                        f"checkpoint {path} holds numpy's RNG state as an array, the format of older checkpoints of "
                        f"this project: python scripts/migrate_kept_runs.py {path} rewrites it") from None
        refused = _refused(path, e) if isinstance(e, pickle.UnpicklingError) else []
        if refused:
            raise UnsafeCheckpointError(
                f"checkpoint {path} holds {', '.join(refused)}, which no checkpoint of this project holds (only "
                f"tensors, plain Python values and numpy's RNG state): refused, nothing in it was run; delete it or "
                f"resume from another checkpoint") from None
        reason = ": ".join([type(e).__name__] + [_reason(e)] * bool(_reason(e)))
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated ({reason})") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        raise CheckpointError(f"checkpoint {path} is not a highway-repro checkpoint (no 'model' entry)")
    version = ckpt.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} has format_version={version!r}; this code reads {FORMAT_VERSION}")
    return ckpt


def load_latest(ckpt_dir: Path, map_location="cpu") -> dict | None:
    """The newest good checkpoint of a run folder (last.pt, else prev.pt), or None when there is none.

    Only a corrupt or truncated file is passed over (and renamed *.corrupt); a refused one (UnsafeCheckpointError)
    stops the run: what asked for code in one file says nothing good of the other."""
    ckpt_dir = Path(ckpt_dir)
    bad = []
    for name in ("last.pt", "prev.pt"):
        path = ckpt_dir / name
        if not path.exists():
            continue
        try:
            ckpt = load(path, map_location)
        except CheckpointError as e:
            log.warning("%s; falling back to the previous checkpoint", e)
            bad.append(path)
            continue
        for b in bad:  # keep it for inspection, but out of the way of the next save's rotation into prev.pt
            try:
                os.replace(b, b.with_name(b.name + ".corrupt"))
            except OSError:
                pass
        if bad:
            log.warning("resuming from %s (step %s)", path, ckpt.get("step"))
        return ckpt
    if bad:
        log.warning("no usable checkpoint in %s: starting from step 0", ckpt_dir)
    return None


def load_model_state(model: torch.nn.Module, state: dict, source: str = "checkpoint") -> None:
    """load_state_dict with a message that lists the mismatched keys and shapes."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shape = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or unexpected or shape:
        def show(keys):
            return ", ".join(keys[:8]) + (f" (+{len(keys) - 8} more)" if len(keys) > 8 else "")
        parts = []
        if missing:
            parts.append(f"missing in {source}: {show(missing)}")
        if unexpected:
            parts.append(f"not in the model: {show(unexpected)}")
        if shape:
            parts.append("shape mismatch: "
                         + show([f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in shape]))
        raise CheckpointError(f"{source} does not fit this architecture; " + "; ".join(parts))
    model.load_state_dict(state)
