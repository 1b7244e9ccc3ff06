"""Run folders -> `Run` objects, read from these files only (never a web API): `.hydra/overrides.yaml` (the job's
overrides), `config_resolved.yaml` (else `.hydra/config.yaml`), `metrics.json` (final metrics and `status`),
`metrics.jsonl` (one object per log step) and `run_info.json` (machine, versions, threads, commit, times)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from highway_repro import files
from highway_repro.files import KeptFileError, read_config

# A kept run's override: a key and a plain value, nothing Hydra's grammar would evaluate (a list, a function, a
# quoted string, an interpolation), no path out of the config folders (`..`, a leading `/`), no key added or removed.
PLAIN_OVERRIDE = re.compile(r"[A-Za-z_][A-Za-z0-9_./]*=(?!/)[A-Za-z0-9_.,:/+-]*")
RunFolderError = KeptFileError  # a run folder's file that is not plain data, a link, or too large
# metrics.json keys of older runs -> their present name (the one the history logs)
RENAMED_METRICS = {"best/val_loss": "val/best_loss"}


def _root(path: Path) -> Path:
    """The folder that holds the run folder of a run's file (`<run>/x`, `<run>/.hydra/x`): no link below it."""
    return path.parents[2] if path.parent.name == ".hydra" else path.parents[1]


def read_yaml(path: Path, inert: bool = True, root: Path | None = None):
    """A run folder's YAML file as plain data, no link followed below `root` (`inert=False`: no `${` either)."""
    return files.read_yaml(path, root=root or _root(path), inert=inert)


def read_overrides(path: Path, root: Path | None = None) -> list[str] | None:
    """A run folder's `.hydra/overrides.yaml` (None when absent), each line a `PLAIN_OVERRIDE`, else KeptFileError."""
    lines = read_yaml(path, inert=False, root=root)
    if lines is None:
        return None
    if not isinstance(lines, list):
        raise KeptFileError(f"{path} holds a {type(lines).__name__} (valid: a list of key=value overrides)")
    for line in lines:
        if not isinstance(line, str) or ".." in line or not PLAIN_OVERRIDE.fullmatch(line):
            raise KeptFileError(f"{path} holds the override {line!r} (valid: key=value, a plain name or number)")
    return lines


def parse_overrides(lines) -> dict[str, str]:
    """`["+a.b=1", "seed=2"]` -> `{"a.b": "1", "seed": "2"}` (values stay strings, as typed)."""
    return {k.lstrip("+~"): v for k, _, v in (str(item).partition("=") for item in lines or [])}


@dataclass
class Run:
    path: Path
    overrides: dict
    config: dict  # resolved config (config_resolved.yaml), else the composed one (.hydra/config.yaml)
    final: dict  # metrics.json
    status: str  # done | failed | diverged | interrupted | missing (no metrics.json: died or still running) | damaged
    error: str | None = None
    run_info: dict = field(default_factory=dict)
    root: Path | None = field(default=None, repr=False)  # no link is followed below it (`load_run`)

    @cached_property
    def history(self) -> list[dict]:
        """metrics.jsonl, one dict per line (lines cut by a kill are skipped)."""
        try:
            blob = files.read_bytes(self.path / "metrics.jsonl", self.root or self.path.parent) or b""
        except KeptFileError:
            blob = b""  # the run is marked damaged by load_run's read of it
        out = []
        for line in blob.splitlines():
            try:
                rec = files.parse_json(line, self.path / "metrics.jsonl")
            except KeptFileError:
                continue
            step = rec.get("step", 0) if isinstance(rec, dict) else None
            if isinstance(step, int) and not isinstance(step, bool):
                out.append(rec)
        return out

    @property
    def done(self) -> bool:
        return self.status == "done"

    @property
    def threads(self) -> tuple[int, bool]:
        """Threads the run used and whether that is known (run_info.json, else the config's `threads`; else 1)."""
        for v in (self.run_info.get("threads"), self.get("threads")):
            n = int(v) if type(v) is int or (isinstance(v, str) and v.isdecimal()) else 0  # a JSON true is no count
            if n > 0:
                return n, True
        return 1, False

    def get(self, key: str, default=None):
        """A config value by dotted key: the job's override if it has one, else the run's config."""
        if key in self.overrides:
            return self.overrides[key]
        value = self.config
        for part in key.split("."):
            if not isinstance(value, dict) or part not in value:
                return default
            value = value[part]
        return default if value is None else value

    def metric(self, key: str) -> float:
        """A final metric as a float (nan when absent or not a number)."""
        v = self.final.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan

    def history_values(self, key: str, only_training: bool = False) -> list[tuple[int, float]]:
        """(step, value) of `key` over the history; `only_training`: training-log lines only (not evaluations)."""
        return [(int(rec.get("step", 0)), float(v)) for rec in self.history
                if isinstance(v := rec.get(key), (int, float)) and math.isfinite(v)
                and (not only_training or any(k.startswith("perf/") for k in rec))]

    def curve(self, key: str, only_training: bool = False) -> list[tuple[int, float]]:
        """(step, value) of `key` as a learning curve: less the final validation pass where it reads more batches than
        the capped intermediate ones (at the enwik8 cpu scale it lies ~0.18 bpc above the curve's last point)."""
        vals = self.history_values(key, only_training)
        trainer = self.config.get("trainer") or {}
        capped = trainer.get("eval_max_batches") not in (None, trainer.get("final_max_batches"))
        if key.startswith("val/") and capped and trainer.get("max_steps") is not None:
            vals = [(s, v) for s, v in vals if s < int(trainer["max_steps"])]  # no intermediate eval at the end
        return vals


def _read_object(path: Path, root: Path | None = None) -> dict:
    """A run's JSON object file ({} when absent); KeptFileError when it is not plain values (the run wrote it
    atomically: it was damaged after) or its `status`, `step` or `error` has the wrong type."""
    value = files.read_json(path, root or _root(path), kind=dict) or {}
    for key, kind in (("status", str), ("step", int), ("error", str)):
        if value.get(key) is not None and (not isinstance(value[key], kind) or isinstance(value[key], bool)):
            raise KeptFileError(f"{path}: {key}={value[key]!r} is not allowed (valid: a JSON {kind.__name__})")
    return value


def load_run(path: Path, root: Path | None = None) -> Run:
    """The run of a run folder, no link followed below `root` (default: the folder above it). A damaged file makes
    the run `damaged` with the reason as its error: out of every statistic, yet placed in its row by what was read."""
    path, damage = Path(path), []
    root = Path(root) if root is not None else path.parent

    def read(fn, default):
        try:
            return fn()
        except KeptFileError as e:
            damage.append(str(e))
            return default

    if read(lambda: files.below(path, root), None) is None:  # a link on the way: nothing of it is read
        return Run(path, {}, {}, {}, "damaged", damage[0], {}, root=root)
    overrides = read(lambda: parse_overrides(read_overrides(path / ".hydra" / "overrides.yaml", root)), {})
    config = read(lambda: read_config(path / "config_resolved.yaml", root)
                  or read_yaml(path / ".hydra" / "config.yaml", root=root) or {}, {})
    config = config if isinstance(config, dict) else {}
    final = renamed(read(lambda: _read_object(path / "metrics.json", root), {}))
    info = read(lambda: _read_object(path / "run_info.json", root), {})
    read(lambda: files.check_kept(path / "metrics.jsonl", root), None)  # checked here, read when asked for
    status = "damaged" if damage else str(final.get("status", "unknown")) if final else "missing"
    error = damage[0] if damage else final.get("error")
    if error is None and status == "missing":
        error = (f"killed by the {info['killed']}" if info.get("killed")
                 else "no metrics.json (job died or still running)")
    elif error is None and status != "done":
        error = f"status {status} at step {final.get('step')}"
    return Run(path, overrides, config, final, status, error, info, root=root)


def renamed(final: dict) -> dict:
    """metrics.json with `RENAMED_METRICS` applied (an old key's null dropped; the present key wins)."""
    out = dict(final)
    for old, new in RENAMED_METRICS.items():
        value = out.pop(old, None)
        if value is not None:
            out.setdefault(new, value)
    return out


def device(r: Run) -> str:
    """Where a run was made: "gpu" (its run_info.json names a CUDA device) or "cpu"."""
    return "gpu" if r.run_info.get("cuda_device") else "cpu"


def one_device(runs: list[Run]) -> tuple[list[Run], list[Run]]:
    """(the runs a table compares, the runs it leaves out): a table compares the runs of one device, the one most
    of its runs were made on (a tie: the CPU), so that no interval mixes devices: a run made on a GPU differs from
    its CPU twin by more than the effects the cpu-scale tables test (docs/gpu.md). The cpu-scale tables' own
    device is the CPU; the paper-size anchor's, the GPU its runs were all made on."""
    counts = {d: sum(device(r) == d for r in runs) for d in ("cpu", "gpu")}
    mine = "gpu" if counts["gpu"] > counts["cpu"] else "cpu"
    return [r for r in runs if device(r) == mine], [r for r in runs if device(r) != mine]


def load_runs(folder, root=None) -> list[Run]:
    """Every run folder at or below `folder` (metrics.json or .hydra/; rglob matches the folder's own), sorted."""
    folder = Path(folder)
    found = {p.parent for p in folder.rglob("metrics.json")} | {p.parent for p in folder.rglob(".hydra") if p.is_dir()}
    return [load_run(p, root) for p in sorted(found)]
