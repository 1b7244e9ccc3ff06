"""The Hydra app of `python -m highway_repro.train`: compose, validate, build data -> model -> trainer, fit, write
metrics.json. The only module that knows all parts (data meta goes into the model's constructor)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

# No torch (nor numpy, the engine, the data or the models) at import time: import them inside functions.
from highway_repro.engine.loggers import build_logger, now, write_run_info, write_text_atomic
from highway_repro.errors import HighwayError
from highway_repro.lock import Lock
from highway_repro.resolvers import register
from highway_repro.runtime import configure
from highway_repro.train import grouped
from highway_repro.train.config import ConfigError, check_command, validate_against_data
from highway_repro.train.job import (ADMITTED, build, failures, first_rank, held, one_line_errors, prepare,
                                     ranks, with_config)

log = logging.getLogger("highway_repro")
CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "configs")
register()  # `${hp:...}` in the configs


def build_optimizer(cfg: DictConfig, model):
    groups = cfg.optim.get("param_groups", "default")
    if groups == "caffe":
        from highway_repro.engine.param_groups import caffe_param_groups

        params = caffe_param_groups(model, lr=cfg.optim.optimizer.lr,
                                    weight_decay=cfg.optim.optimizer.get("weight_decay", 0.0))
    elif groups == "default":
        params = [p for p in model.parameters() if p.requires_grad]
    else:
        raise ConfigError(f"optim.param_groups={groups!r} is not known (valid: default, caffe)")
    optimizer = with_config("optim.optimizer", build(cfg.optim.optimizer, "optim.optimizer"), params)
    schedule = with_config("optim.scheduler", build(cfg.optim.scheduler, "optim.scheduler"), optimizer,
                            max_steps=cfg.trainer.max_steps)
    return optimizer, schedule


def match_params(cfg: DictConfig, meta: dict) -> int:
    """`match_params: <gate kind>`: model.d_ff of the ungated model becomes the width with the parameter count of the
    model gated by that kind (`gates.matched_d_ff`, from one build on the meta device: no random number is drawn)."""
    import torch

    from highway_repro.models.gates import matched_d_ff

    with torch.device("meta"):
        gated = build(cfg.model, "model", gate_kind=cfg.match_params, **meta)
    d_ff, cfg.model.d_ff = cfg.model.d_ff, matched_d_ff(gated, int(cfg.model.d_ff))
    log.info("match_params=%s: model.d_ff %d -> %d", cfg.match_params, d_ff, cfg.model.d_ff)
    return int(cfg.model.d_ff)


def run(cfg: DictConfig, out_dir: Path, dist=None) -> dict:
    """Build everything from a composed config (checked: `main`) and train; returns the final metrics."""
    trainer = build_run(cfg, out_dir, dist)
    if trainer.is_main:
        write_run_info(out_dir, start_time=now())  # machine, versions, threads, commit: read by the reports
    final = trainer.fit()
    if trainer.is_main:
        write_run_info(out_dir, end_time=now(), peak_rss_gb=round(trainer.peak_rss_gb(), 3))
    return final


def run_job(cfg: DictConfig, out_dir: Path, multirun: bool, train=run) -> float | None:
    """One job: its ranks (`job.ranks`), its run folder held (`job.held`), then `train`; returns its val/loss."""
    with ranks(cfg, out_dir) as (dist, out_dir), held(cfg, out_dir, multirun, dist) as job:
        if job.train:
            job.final = train(cfg, out_dir, dist=dist)
    return job.value


def build_run(cfg: DictConfig, out_dir: Path, dist=None, trainer_cls=None):
    """The run's trainer (`trainer_cls`: `Trainer`, or a group's `Member`), built from its config and resumed."""
    from highway_repro.engine import checkpoint as ckpt_lib
    from highway_repro.engine.tasks import build_task
    from highway_repro.engine.trainer import Trainer, TrainerConfig
    from highway_repro.models.probe import GateRecorder

    configure(cfg.get("threads"), cfg.seed, cfg.deterministic)
    is_main = dist is None or dist.rank == 0
    data = build(cfg.data, "data")
    validate_against_data(cfg, data, 1 if dist is None else dist.world_size)
    if cfg.get("match_params"):
        match_params(cfg, data.meta)  # before the config is written: config_resolved.yaml has the widened d_ff
    model = build(cfg.model, "model", **data.meta)
    optimizer, schedule = build_optimizer(cfg, model)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    n_params = sum(p.numel() for p in model.parameters())
    if is_main:
        write_text_atomic(out_dir / "config_resolved.yaml", OmegaConf.to_yaml(OmegaConf.create(resolved)))
        log.info("data: %s", data.describe())
        log.info("model: %s, %s parameters", type(model).__name__, f"{n_params:,}")
    logger_kwargs = OmegaConf.to_container(cfg.logger, resolve=True)
    kind = logger_kwargs.pop("kind")
    # resume=auto reads the newest checkpoint once: for the trainer, and for a W&B run to go on in its own W&B run
    latest = ckpt_lib.load_latest(out_dir / "ckpt") if cfg.resume == "auto" else None
    if kind == "wandb" and latest is not None and is_main:
        logger_kwargs.setdefault("resume_id", latest.get("extra", {}).get("logger_run_id"))
    logger = build_logger(kind if is_main else "jsonl", out_dir, config=resolved, **logger_kwargs)
    if dist is not None:
        dist.seed = int(cfg.seed)
        model = dist.wrap(model)
    trainer = (trainer_cls or Trainer)(model, data, build_task(data.kind), optimizer, schedule, out_dir, logger,
                                       TrainerConfig(**OmegaConf.to_container(cfg.trainer, resolve=True)),
                                       run_config=resolved, dist=dist, gate_recorder=GateRecorder)
    if cfg.resume == "auto":
        trainer.resume_from(latest)
    elif cfg.resume:
        try:
            trainer.load_state(ckpt_lib.load(Path(cfg.resume), map_location=trainer.device))
        except HighwayError as e:  # the checkpoint's errors
            raise type(e)(f"resume={cfg.resume}: {e}") from None
    if is_main and trainer.step == 0:
        trainer.record({"model/params": n_params})
    return trainer


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
def main(cfg: DictConfig):
    hc = HydraConfig.get()
    out_dir, multirun = Path(hc.runtime.output_dir), hc.mode == RunMode.MULTIRUN
    refused = isinstance(ADMITTED.get(str(out_dir)), Exception)  # another writer's folder: its metrics.json stays
    try:
        with failures(None if refused else out_dir / "metrics.json", multirun, is_main=first_rank()):
            check_command(cfg, CONFIG_DIR, hc.runtime.choices, OmegaConf.to_container(hc.overrides.task))  # as typed
            if grouped.JOBS is not None:  # hydra/launcher=grouped: trained with its group once all jobs are set up
                return grouped.JOBS.append((cfg.copy(), out_dir, multirun, build_run))  # its lock held till then
            return run_job(cfg, out_dir, multirun)
    finally:  # the lock of a job that ended before `held` took it over (a config error)
        if isinstance(ADMITTED.get(str(out_dir)), Lock) and all(job[1] != out_dir for job in grouped.JOBS or ()):
            ADMITTED.pop(str(out_dir)).release()


def command():
    """The command line (`highway_repro.train.cli`): `main` under the command's failure policy."""
    with one_line_errors():
        prepare(sys.argv[1:], CONFIG_DIR)
        main()
