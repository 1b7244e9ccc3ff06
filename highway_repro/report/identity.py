"""Who a run is on W&B: one rule for the training logger (`logger=wandb`) and the export of the kept runs.

A run is (experiment, scale, job); the job is Hydra's `override_dirname` of its overrides (`seed=1,variant=sdu_tanh`:
the folder name of a sweep job; configs/train.yaml leaves out the keys that only say where or how a run is watched),
read from the run folder's `.hydra/overrides.yaml` (`job_of`), which the live run and its kept copy both hold. Its
W&B id is a hash of the three, so a second export, or the same run trained again with `logger=wandb`, lands in the
W&B run it already has; a run made on a GPU at a scale other than the paper's is another run than its CPU twin (kept
apart: `targets.runs_folder`). Group = the experiment, name = the job, job type `train`, and the config is the run's
own (less `logger`, which says where a run is mirrored, not what it is) plus one column, `row`: the job without its
repeat keys, so that W&B groups a table's runs by row (and by `seed` or `trial`, config keys already) out of the
box. Tags: `table:<name>` for each report that reads the run (the dashboards' filter), `scale:<scale>`,
`device:<cpu or the GPU's name>` (run_info.json's `cuda_device`). Summary: the validation losses' lowest and last
value (`SUMMARIES`, W&B's `define_metric`), every other key of metrics.json as it is.

Reads files only (no torch): the engine's logger and the export (`highway_repro.dashboards`) import it.
"""

from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path

from highway_repro.files import KeptFileError
from highway_repro.grids import REPEAT_KEYS, cells
from highway_repro.report.runs import read_overrides, read_yaml
from highway_repro.targets import CONFIG_DIR, REPORTS, TARGETS, kept_apart

JOB_TYPE = "train"  # a table's report run: "report" (dashboards/export.py)
# W&B's summary of the validation losses: {"min": the best evaluation, "last": the final one, metrics.json's}. W&B
# (0.31) drops both for a key whose summary is also set by hand, keeping the last logged value: never set these. W&B
# keeps no summary across the offline segments of a resumed run: a live run's `min` after a resume is over the steps
# of its last segment (`val/best_loss`, logged from the checkpoint, is the whole run's); an exported run is one segment.
SUMMARIES = {key: "min,last" for key in ("val/loss", "val/bpc", "val/ppl")}
_NEXT_ITEM = re.compile(r",(?=[+~]?[A-Za-z_][\w.@/-]*=)")  # a comma that starts the next `key=value` of a job name


def override_key(item: str) -> str:
    """The key of one override: `+model.x=1` -> `model.x`."""
    return item.split("=", 1)[0].lstrip("+~")


def job_name(overrides: list[str], exclude) -> str:
    """Hydra's `override_dirname`: the overrides whose key is not in `exclude`, sorted, joined by commas."""
    return ",".join(sorted(o for o in overrides if override_key(o) not in exclude))


@functools.cache
def excluded_keys() -> tuple[str, ...]:
    """The keys Hydra leaves out of a job's name (configs/train.yaml, `override_dirname.exclude_keys`)."""
    train = read_yaml(CONFIG_DIR / "train.yaml", root=CONFIG_DIR)
    return tuple(train["hydra"]["job"]["config"]["override_dirname"]["exclude_keys"])


def job_of(folder: Path, root: Path | None = None) -> tuple[str, list[str] | None]:
    """A run folder's job name and its overrides (`.hydra/overrides.yaml`, read below `root`); a folder without
    that file (or with one that is not plain overrides): its own name, None."""
    try:
        overrides = read_overrides(Path(folder) / ".hydra" / "overrides.yaml", root)
    except KeptFileError:
        overrides = None
    return (Path(folder).name, None) if overrides is None else (job_name(overrides, excluded_keys()), overrides)


def row_of(job: str) -> str:
    """The job without its repeat keys: `seed=1,variant=sdu_tanh` -> `variant=sdu_tanh`; `default` when none is left
    (a single run of an experiment's own recipe)."""
    items = [i for i in _NEXT_ITEM.split(job) if i and override_key(i) not in REPEAT_KEYS]
    return ",".join(items) or "default"


def run_id(experiment: str, scale: str, job: str) -> str:
    """The W&B run id of (experiment, scale, job): the first 16 hex digits of their SHA-256."""
    return hashlib.sha256(f"{experiment}\n{scale}\n{job}".encode()).hexdigest()[:16]


def table_of(overrides: list[str] | None, experiment: str, job: str) -> str | None:
    """The table a run was trained for: its sweep file's (`sweep=<table>/<file>`; a target made of parts: the part of
    the run's experiment), else the single-run table of its experiment when the job is that table's own run (no
    override of its recipe); None for a run of no table."""
    sweep = next((o.split("=", 1)[1] for o in overrides or [] if override_key(o) == "sweep"), None)
    if sweep is not None:
        table = sweep.split("/", 1)[0]
        parts = [p for p in TARGETS[table].parts if TARGETS[p].experiment == experiment] if table in TARGETS else []
        return parts[0] if parts else table if table in TARGETS else None
    single = [n for n, t in TARGETS.items() if not t.sweep and t.experiment == experiment]
    return single[0] if single and not job else None


def readers(table: str | None, scale: str, job: str, apart: bool = False) -> list[str]:
    """The reports that read a run of `table` at `scale` named `job` once the runner keeps it, in `REPORTS` order:
    `grids.kept_folders` turned around. The table itself; unless the run is kept apart (made on a GPU), each
    study that reuses the table and has the job in its grid; each target made of those as parts. (A study's own kept
    run of the same name would be read first; the runner restores a reused run instead of training it there.)"""
    if table is None:
        return []
    tables = {table} | ({n for n, t in TARGETS.items() if table in t.reuse and job in cells(n, scale)}
                        if not apart else set())
    tables |= {n for n, t in TARGETS.items() if set(t.parts) & tables}
    return [n for n in REPORTS if n in tables]


def identity(config: dict, job: str, cuda_device: str | None = None, tables=()) -> dict:
    """The W&B run of a run with saved config `config` (config_resolved.yaml: `name` is the experiment, `scale_name`
    the scale), job name `job`, made on `cuda_device` (run_info.json's; None: a CPU) and read by the reports
    `tables`: {"id", "group", "name", "job_type", "tags", "config"}."""
    experiment, scale = str(config.get("name", "adhoc")), str(config.get("scale_name", ""))
    tags = [*(f"table:{t}" for t in tables), f"scale:{scale}", f"device:{cuda_device or 'cpu'}"]
    scale += "-gpu" if cuda_device and kept_apart(scale) else ""
    return {"id": run_id(experiment, scale, job), "group": experiment, "name": job or experiment,
            "job_type": JOB_TYPE, "tags": sorted(tags),
            "config": {**{k: v for k, v in config.items() if k != "logger"}, "row": row_of(job)}}


def define_summaries(run) -> None:
    """Give W&B run `run` the summaries of `SUMMARIES` (before anything is logged)."""
    for key, how in SUMMARIES.items():
        run.define_metric(key, summary=how)
