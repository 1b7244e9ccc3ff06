"""The check's ground: where the checkout and the carried files are, the modules it needs, its clock, its
targets, and the module check that runs before torch is imported."""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
import time
from pathlib import Path

T0 = time.monotonic()
REPO = Path(__file__).resolve().parents[2]
ENTRY = REPO / "scripts" / "gpu_check.py"  # the command (torchrun starts it again as the worker)
DEPS = REPO / ".gpu_deps"  # pure-Python packages carried to a bare GPU machine (--prepare)
PEERS_DIR = REPO / ".gpu_peers"  # the peers' wheels, per peer (--prepare; peers.py)
GPU_MIRROR = REPO / "data" / "gpu_mirror"  # the data subset carried to the GPU machine (--prepare)
GPU_CACHE = REPO / "data" / "gpu_cache"  # its CIFAR-10 cut, a data cache beside it (--prepare)

# modules: (what needs it, required)
MODULES = {
    "torch": ("everything", True),
    "numpy": ("data, checkpoints", True),
    "hydra": ("the configs (compose API)", False),
    "omegaconf": ("the configs", False),
    "yaml": ("omegaconf, reports", False),
    "antlr4": ("omegaconf interpolations", False),
    "pytest": ("the CUDA tests", False),
    "matplotlib": ("the curve PNG (optional; --plot draws it later)", False),
}
TARGETS = {"mfu": 0.40, "bf16_vs_fp32": 0.01, "bpc400": 0.15, "resume_rel": 1e-2, "hf_ratio": 2.0}
CARRY_LIMIT = 64 * 2 ** 20  # what travels to the GPU machine: the tree, the data subset, .gpu_deps, .gpu_peers


def restart_clock() -> None:
    """The budget counts from here (also when a test calls `main` in-process)."""
    global T0
    T0 = time.monotonic()


def elapsed() -> float:
    return time.monotonic() - T0


def say(msg: str) -> None:
    print(f"[{elapsed():6.1f}s] {msg}", flush=True)


def module_origin(mod: str) -> str | None:
    try:
        spec = importlib.util.find_spec(mod)
    except (ImportError, ValueError):
        return None
    return None if spec is None else (spec.origin or str(list(spec.submodule_search_locations or [])[:1]))


def setup_paths() -> dict:
    """This checkout first on sys.path, the carried pure-Python packages (.gpu_deps) last; both also on
    PYTHONPATH for the children (torchrun, pytest). A standalone script for a bare machine: the package is
    not installed there, and an installed copy of another checkout must not win."""
    sys.path.insert(0, str(REPO))
    parts = [str(REPO)]
    if DEPS.is_dir():
        sys.path.append(str(DEPS))
    env = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(parts + env + ([str(DEPS)] if DEPS.is_dir() else []))
    return {m: module_origin(m) for m in MODULES}


def preflight(found: dict) -> tuple[list[str], list[str]]:
    """(missing required modules, missing optional modules), printed at once (no import of torch yet)."""
    say(f"python {platform.python_version()} at {sys.executable}; checkout {REPO}"
        + (f"; carried packages {DEPS}" if DEPS.is_dir() else ""))
    for m, (why, required) in MODULES.items():
        where = found.get(m)
        say(f"  {m:<11} {'ok ' if where else 'MISSING'} {where or ''}  ({why}{'; required' if required else ''})")
    missing = [m for m, (_, req) in MODULES.items() if req and not found.get(m)]
    optional = [m for m, (_, req) in MODULES.items() if not req and not found.get(m)]
    if sys.version_info < (3, 10):
        missing.append(f"python >= 3.10 (this is {platform.python_version()})")
    return missing, optional
