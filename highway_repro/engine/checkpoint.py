"""Checkpoints: plain dicts, written atomically (temp file + fsync + rename).

A checkpoint holds {format_version, model, optimizer, scheduler, step, best_val,
rng, config, mems, extra}. `resume=auto` loads `ckpt/last.pt`; if that file is
truncated or corrupt it is reported by name, renamed to `last.pt.corrupt` (so that
the next save does not rotate it into prev.pt) and the previous good one
(`ckpt/prev.pt`, the last.pt before the latest write) is used instead. A writer
killed mid-write leaves only a `.<name>.pt.tmp<pid>` file, removed by the next save.
"""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path

import numpy as np
import torch

from highway_repro.errors import HighwayError

FORMAT_VERSION = 1
log = logging.getLogger(__name__)


class CheckpointError(HighwayError):
    """A checkpoint that is missing, corrupt, of another format version or of another architecture."""


def atomic_torch_save(obj, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(ckpt_dir: Path, name: str, payload: dict) -> Path:
    """Write ckpt_dir/name.pt atomically; for `last`, the previous last.pt is kept as prev.pt."""
    ckpt_dir = Path(ckpt_dir)
    path = ckpt_dir / f"{name}.pt"
    payload = {"format_version": FORMAT_VERSION, **payload}
    for stale in ckpt_dir.glob(".*.pt.tmp*"):  # left by a writer killed mid-write (one writer per run folder)
        if not stale.name.endswith(f".tmp{os.getpid()}"):
            stale.unlink(missing_ok=True)
    if name == "last" and path.exists():
        os.replace(path, ckpt_dir / "prev.pt")
    atomic_torch_save(payload, path)
    return path


def load(path: Path, map_location="cpu") -> dict:
    """Load and check one checkpoint; a truncated/corrupt file raises CheckpointError naming it."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as e:  # truncated zip, garbage bytes, ...
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated ({type(e).__name__}: {e})") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        raise CheckpointError(f"checkpoint {path} is not a highway-repro checkpoint (no 'model' entry)")
    version = ckpt.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} has format_version={version!r}; this code reads {FORMAT_VERSION}")
    return ckpt


def load_latest(ckpt_dir: Path, map_location="cpu") -> dict | None:
    """The newest good checkpoint of a run folder (last.pt, else prev.pt), or None when there is none."""
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
            parts.append("shape mismatch: " + show([f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in shape]))
        raise CheckpointError(f"{source} does not fit this architecture; " + "; ".join(parts))
    model.load_state_dict(state)
