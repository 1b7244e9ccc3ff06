"""Who a run is on W&B: one rule for the training logger (`logger=wandb`) and the export of the kept runs.

A run is (experiment, scale, job), the job Hydra's `override_dirname` of the run folder's `.hydra/overrides.yaml`
(which the live run and its kept copy both hold); its W&B id is a hash of the three, so a second export, or the same
run trained again, lands in the W&B run it already has. Group = the experiment, name = the job; config = the run's own
plus `row` (the job without its repeat keys, for W&B's grouping); tags: each report that reads it, scale, device."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from highway_repro.files import KeptFileError
from highway_repro.grids import cell_of, cells, dirname, override_key
from highway_repro.report.runs import read_overrides, read_yaml
from highway_repro.targets import CONFIG_DIR, REPORTS, TARGETS, kept_apart

JOB_TYPE = "train"  # a table's report run: "report" (dashboards/export.py)
# The validation losses' best and final values. W&B (0.31) drops both for a key whose summary is also set by hand:
# never set these. A resumed live run's `min` covers its last segment only (`val/best_loss` is the whole run's).
SUMMARIES = {key: "min,last" for key in ("val/loss", "val/bpc", "val/ppl")}


@functools.cache
def excluded_keys() -> tuple[str, ...]:
    """The keys Hydra leaves out of a job's name (configs/train.yaml, `override_dirname.exclude_keys`)."""
    train = read_yaml(CONFIG_DIR / "train.yaml", root=CONFIG_DIR)
    return tuple(train["hydra"]["job"]["config"]["override_dirname"]["exclude_keys"])


def job_of(folder: Path, root: Path | None = None) -> tuple[str, list[str] | None]:
    """A run folder's (job name, overrides); without plain `.hydra/overrides.yaml`: (its own name, None)."""
    try:
        overrides = read_overrides(Path(folder) / ".hydra" / "overrides.yaml", root)
    except KeptFileError:
        overrides = None
    return (Path(folder).name, None) if overrides is None else (dirname(overrides, excluded_keys()), overrides)


def row_of(job: str) -> str:
    """The job without its repeat keys: `seed=1,variant=sdu_tanh` -> `variant=sdu_tanh`; `default` when none is left."""
    return cell_of(job) or "default"


def run_id(experiment: str, scale: str, job: str) -> str:
    return hashlib.sha256(f"{experiment}\n{scale}\n{job}".encode()).hexdigest()[:16]


def table_of(overrides: list[str] | None, experiment: str, job: str) -> str | None:
    """The table a run was trained for: its sweep file's (of a target made of parts: the part of the run's
    experiment), else its experiment's single-run table when the job overrides nothing; None for no table."""
    sweep = next((o.split("=", 1)[1] for o in overrides or [] if override_key(o) == "sweep"), None)
    if sweep is not None:
        table = sweep.split("/", 1)[0]
        parts = [p for p in TARGETS[table].parts if TARGETS[p].experiment == experiment] if table in TARGETS else []
        return parts[0] if parts else table if table in TARGETS else None
    single = [n for n, t in TARGETS.items() if not t.sweep and t.experiment == experiment]
    return single[0] if single and not job else None


def readers(table: str | None, scale: str, job: str, apart: bool = False) -> list[str]:
    """The reports that read a kept run of `table` (`grids.kept_folders` turned around): the table, each study that
    reuses it and has the job in its grid (unless the run is kept apart: made on a GPU), each target made of those."""
    if table is None:
        return []
    tables = {table} | ({n for n, t in TARGETS.items() if table in t.reuse and job in cells(n, scale)}
                        if not apart else set())
    tables |= {n for n, t in TARGETS.items() if set(t.parts) & tables}
    return [n for n in REPORTS if n in tables]


def identity(config: dict, job: str, cuda_device: str | None = None, tables=()) -> dict:
    """The W&B run of a run (`config`: config_resolved.yaml) made on `cuda_device` (None: a CPU), read by `tables`."""
    experiment, scale = str(config.get("name", "adhoc")), str(config.get("scale_name", ""))
    tags = [*(f"table:{t}" for t in tables), f"scale:{scale}", f"device:{cuda_device or 'cpu'}"]
    scale += "-gpu" if cuda_device and kept_apart(scale) else ""  # not the same run as its CPU twin
    return {"id": run_id(experiment, scale, job), "group": experiment, "name": job or experiment,
            "job_type": JOB_TYPE, "tags": sorted(tags),
            "config": {**{k: v for k, v in config.items() if k != "logger"}, "row": row_of(job)}}


def define_summaries(run) -> None:
    """W&B's summaries of `SUMMARIES`, set before anything is logged."""
    for key, how in SUMMARIES.items():
        run.define_metric(key, summary=how)
