"""Who a run is on W&B: one rule for the training logger (`logger=wandb`) and the export of the kept runs.

A run is (experiment, scale, job); the job is Hydra's `override_dirname` of its overrides (`seed=1,variant=sdu_tanh`:
the folder name of a sweep job; configs/train.yaml leaves out the keys that only say where or how a run is watched).
Its W&B id is a hash of the three, so a second export, or the same run trained again with `logger=wandb` (on a GPU
too), lands in the W&B run it already has. Group = the experiment, name = the job, and the config is the run's own
(less `logger`, which says where a run is mirrored, not what it is) plus one column, `row`: the job without its repeat
keys, so that W&B groups a table's runs by row (and by `seed` or `trial`, config keys already) out of the box.

Standard library only: the engine's logger and the export (`highway_repro.dashboards`) import it.
"""

from __future__ import annotations

import hashlib
import re

REPEAT_KEYS = ("seed", "trial")  # the keys that repeat a grid cell, as runner.plan.REPEAT_KEYS (a test ties them)
_NEXT_ITEM = re.compile(r",(?=[+~]?[A-Za-z_][\w.@/-]*=)")  # a comma that starts the next `key=value` of a job name


def override_key(item: str) -> str:
    """The key of one override: `+model.x=1` -> `model.x`."""
    return item.split("=", 1)[0].lstrip("+~")


def job_name(overrides: list[str], exclude: list[str]) -> str:
    """Hydra's `override_dirname`: the overrides whose key is not in `exclude`, sorted, joined by commas."""
    return ",".join(sorted(o for o in overrides if override_key(o) not in exclude))


def row_of(job: str) -> str:
    """The job without its repeat keys: `seed=1,variant=sdu_tanh` -> `variant=sdu_tanh`; `default` when none is left
    (a single run of an experiment's own recipe)."""
    items = [i for i in _NEXT_ITEM.split(job) if i and override_key(i) not in REPEAT_KEYS]
    return ",".join(items) or "default"


def run_id(experiment: str, scale: str, job: str) -> str:
    """The W&B run id of (experiment, scale, job): the first 16 hex digits of their SHA-256."""
    return hashlib.sha256(f"{experiment}\n{scale}\n{job}".encode()).hexdigest()[:16]


def identity(config: dict, job: str, on_gpu: bool = False) -> dict:
    """The W&B run of a run with saved config `config` (config_resolved.yaml: `name` is the experiment, `scale_name`
    the scale) and job name `job`: {"id", "group", "name", "config"}. A run made on a GPU at a scale other than the
    paper's (`on_gpu`) is another run than its CPU twin of the same job (`targets.runs_folder`: kept apart)."""
    experiment, scale = str(config.get("name", "adhoc")), str(config.get("scale_name", ""))
    scale += "-gpu" if on_gpu and scale != "paper" else ""
    return {"id": run_id(experiment, scale, job), "group": experiment, "name": job or experiment,
            "config": {**{k: v for k, v in config.items() if k != "logger"}, "row": row_of(job)}}
