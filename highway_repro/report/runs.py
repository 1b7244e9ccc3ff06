"""Run folders -> `Run` objects. The report reads only these files, never a web API:

| file | what |
|---|---|
| `.hydra/overrides.yaml` | the command-line overrides of the job (`variant=sdu_tanh`, `seed=1`) |
| `config_resolved.yaml` (else `.hydra/config.yaml`) | the full config the run used |
| `metrics.json` | final metrics and `status` (`done`, `failed`, `diverged`, `interrupted`; `damaged`: unparsable) |
| `metrics.jsonl` | the history: one JSON object per log step |
| `run_info.json` | machine, versions, threads, code commit, start and end time (`engine/loggers.write_run_info`) |
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from highway_repro import files
from highway_repro.files import KeptFileError, read_config


# An override a kept run's .hydra/overrides.yaml may hold: a key, then a plain value (a name, a number, a sweep file
# name): nothing Hydra's grammar would evaluate (a list, a function, a quoted string, an interpolation), and no
# path out of the config folders (`..`, a leading `/`: a config group choice is a file name), and no key added or
# removed (`+`, `~`: a kept run's keys are the config files' own).
PLAIN_OVERRIDE = re.compile(r"[A-Za-z_][A-Za-z0-9_./]*=(?!/)[A-Za-z0-9_.,:/+-]*")

RunFolderError = KeptFileError  # a run folder's file that is not plain data, a link, or too large
# metrics.json keys of older runs under their present name: a run's best validation loss is `val/best_loss`, as its
# history logs it at every evaluation
RENAMED_METRICS = {"best/val_loss": "val/best_loss"}


def _root(path: Path) -> Path:
    """The folder that holds the run folder of a run's file (`<run>/x`, `<run>/.hydra/x`): no link below it."""
    return path.parents[2] if path.parent.name == ".hydra" else path.parents[1]


def read_yaml(path: Path, inert: bool = True, root: Path | None = None):
    """A run folder's YAML file as plain data (None when absent): `files.read_yaml` below `root` (default: the folder
    that holds the run folder; no link, no alias, no tag that would build an object, a bounded size;
    `inert=False`: no `${` either)."""
    return files.read_yaml(path, root=root or _root(path), inert=inert)


def read_overrides(path: Path, root: Path | None = None) -> list[str] | None:
    """A run folder's `.hydra/overrides.yaml` (None when absent), each line a `PLAIN_OVERRIDE`, else
    KeptFileError naming the file and the line."""
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
    out = {}
    for item in lines or []:
        k, _, v = str(item).partition("=")
        out[k.lstrip("+~")] = v
    return out


def _lookup(cfg, dotted: str):
    for part in dotted.split("."):
        if not isinstance(cfg, dict) or part not in cfg:
            return None
        cfg = cfg[part]
    return cfg


@dataclass
class Run:
    path: Path
    overrides: dict
    config: dict  # resolved config (config_resolved.yaml), else the composed one (.hydra/config.yaml)
    final: dict  # metrics.json
    status: str  # done | failed | diverged | interrupted | missing (no metrics.json: died or still running) | damaged
    error: str | None = None
    run_info: dict = field(default_factory=dict)
    _history: list | None = field(default=None, repr=False)
    root: Path | None = field(default=None, repr=False)  # no link is followed below it (`load_run`)

    @property
    def history(self) -> list[dict]:
        """metrics.jsonl, one dict per line (lines cut by a kill are skipped)."""
        if self._history is None:
            self._history = []
            try:
                blob = files.read_bytes(self.path / "metrics.jsonl", self.root or self.path.parent) or b""
            except KeptFileError:
                blob = b""  # the run is marked damaged by load_run's read of it
            for line in blob.splitlines():
                try:
                    rec = files.parse_json(line, self.path / "metrics.jsonl")
                except KeptFileError:
                    continue
                if isinstance(rec, dict) and isinstance(rec.get("step", 0), int) and not isinstance(
                        rec.get("step", 0), bool):
                    self._history.append(rec)
        return self._history

    @property
    def done(self) -> bool:
        return self.status == "done"

    @property
    def threads(self) -> tuple[int, bool]:
        """Threads the run used and whether that is known (run_info.json, else the config's `threads`; else 1)."""
        for v in (self.run_info.get("threads"), self.get("threads")):
            if isinstance(v, int) and v > 0 or (isinstance(v, str) and v.isdigit() and int(v) > 0):
                return int(v), True
        return 1, False

    def get(self, key: str, default=None):
        """A config value by dotted key: the job's override if it has one, else the run's config."""
        if key in self.overrides:
            return self.overrides[key]
        value = _lookup(self.config, key)
        return default if value is None else value

    def metric(self, key: str) -> float:
        """A final metric from metrics.json as a float (nan when absent or not a number)."""
        v = self.final.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan

    def history_values(self, key: str, only_training: bool = False) -> list[tuple[int, float]]:
        """(step, value) of `key` over the history; `only_training`: training-log lines only (not evaluations)."""
        out = []
        for rec in self.history:
            v = rec.get(key)
            if isinstance(v, (int, float)) and math.isfinite(v):
                if only_training and not any(k.startswith("perf/") for k in rec):
                    continue
                out.append((int(rec.get("step", 0)), float(v)))
        return out

    def curve(self, key: str, only_training: bool = False) -> list[tuple[int, float]]:
        """(step, value) of `key` as a learning curve: the history, less the final validation pass where the
        intermediate evaluations were capped (`trainer.eval_max_batches`, the first batches of val) and the final
        pass was not (`trainer.final_max_batches`): that last point measures more data than the others, so it is
        not on the curve (at the enwik8 cpu scale it lies ~0.18 bpc above the curve's last point)."""
        vals = self.history_values(key, only_training)
        trainer = self.config.get("trainer") or {}
        capped = trainer.get("eval_max_batches") is not None and trainer.get("eval_max_batches") != trainer.get(
            "final_max_batches")
        if key.startswith("val/") and capped and trainer.get("max_steps") is not None:
            vals = [(s, v) for s, v in vals if s < int(trainer["max_steps"])]  # no intermediate eval at the end
        return vals

    def history_mean(self, key: str) -> float:
        """Mean of `key` over the learning curve (area under the curve / number of evaluations)."""
        vals = [v for _, v in self.curve(key)]
        return statistics.fmean(vals) if vals else math.nan


def _read_object(path: Path, root: Path | None = None) -> dict:
    """A run's JSON file (metrics.json, run_info.json) as a dict ({} when absent); KeptFileError when it is not a
    JSON object of plain values (the files are written atomically, so such a file was damaged after the run wrote
    it), or when its `status`, `step` or `error` has the wrong type."""
    value = files.read_json(path, root or _root(path), kind=dict) or {}
    for key, kind in (("status", str), ("step", int), ("error", str)):
        if value.get(key) is not None and (not isinstance(value[key], kind) or isinstance(value[key], bool)):
            raise KeptFileError(f"{path}: {key}={value[key]!r} is not allowed (valid: a JSON {kind.__name__})")
    return value


def load_run(path: Path, root: Path | None = None) -> Run:
    """The run of a run folder; no link is followed below `root` (the results root of a kept run; default: the
    folder that holds the run folder). A damaged file (`files`' rules: a link, not plain data, too large, a wrong
    type) makes the run's status `damaged`, its error the line that says why: the reports leave it out of their
    statistics and name it; the files that could be read still place it in its row."""
    path, damage = Path(path), []
    root = Path(root) if root is not None else path.parent

    def read(fn, default):
        try:
            return fn()
        except KeptFileError as e:
            damage.append(str(e))
            return default

    def history():  # checked here, read when asked for (Run.history)
        files.check_kept(path / "metrics.jsonl", root)

    if read(lambda: files.below(path, root), None) is None:  # a link on the way: nothing of it is read
        return Run(path, {}, {}, {}, "damaged", damage[0], {}, root=root)
    overrides = read(lambda: parse_overrides(read_overrides(path / ".hydra" / "overrides.yaml", root)), {})
    config = read(lambda: read_config(path / "config_resolved.yaml", root)
                  or read_yaml(path / ".hydra" / "config.yaml", root=root) or {}, {})
    config = config if isinstance(config, dict) else {}
    final = renamed(read(lambda: _read_object(path / "metrics.json", root), {}))
    info = read(lambda: _read_object(path / "run_info.json", root), {})
    read(history, None)
    status = "damaged" if damage else str(final.get("status", "unknown")) if final else "missing"
    error = damage[0] if damage else final.get("error")
    if error is None and status == "missing":
        error = (f"killed by the {info['killed']}" if info.get("killed")
                 else "no metrics.json (job died or still running)")
    elif error is None and status != "done":
        error = f"status {status} at step {final.get('step')}"
    return Run(path, overrides, config, final, status, error, info, root=root)


def renamed(final: dict) -> dict:
    """A metrics.json object with the keys of `RENAMED_METRICS` under their present names (an old key's null, a run
    without a validation split, dropped); a run that has both keeps the present one."""
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
    """Every run folder at or below `folder` (one that has metrics.json or .hydra/), sorted by path."""
    folder = Path(folder)
    found = {p.parent for p in folder.rglob("metrics.json")} | {p.parent for p in folder.rglob(".hydra") if p.is_dir()}
    if (folder / "metrics.json").exists() or (folder / ".hydra").is_dir():
        found.add(folder)
    return [load_run(p, root) for p in sorted(found)]
