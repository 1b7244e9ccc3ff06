"""Hydra entry point: compose, validate, build data -> model -> trainer, fit, write metrics.json.

    python -m highway_repro.train experiment=hn_fig1 scale=cpu
    python -m highway_repro.train -m sweep=ht_char_ptb scale=cpu
    python -m highway_repro.train experiment=ht_enwik8_l6 hydra.run.dir=runs/x resume=auto

This is the only module that knows all parts: data meta (classes, input shape,
vocab size) is passed into the model's constructor at call time.
"""

from __future__ import annotations

import logging
import math
import os
import random
import sys
import time
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import (ConfigCompositionException, InstantiationException, MissingConfigException,
                          OverrideParseException)
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

# No torch (nor numpy, the engine, the data or the models) at import time: main() validates the config
# first, so a bad value fails in about a second, not after the ~3-5 s torch import
# (tests/test_reliability.py::test_bad_config_fails_fast_before_torch). Import them inside functions.
from highway_repro.config import (ConfigError, check_added_keys, check_group_choices, check_scale_file, settle_variant,
                                  validate, validate_against_data)
from highway_repro.engine.loggers import build_logger, now, write_json_atomic, write_run_info
from highway_repro.errors import HighwayError, StorageError, storage_error, unwritable

# What is reported in one line with exit code 2, without a traceback: the project's own error classes, raised for
# the user's input (a config value, a data file, a checkpoint). Anything else is a bug and keeps its traceback.
USER_ERRORS = (ConfigError, HighwayError)

log = logging.getLogger("highway_repro")
CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "configs")


def _hp(trial, name, dist, *args):
    """Seeded random search in config files: `${hp:${trial},lr,loguniform,0.001,0.3}`.

    The value is a pure function of (trial, name), so a sweep over `trial=range(0,N)`
    is a reproducible random search whose grid is versioned with the code.
    """
    rng = random.Random(f"{trial}:{name}")
    if dist == "loguniform":
        lo, hi = float(args[0]), float(args[1])
        return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    if dist == "uniform":
        return float(rng.uniform(float(args[0]), float(args[1])))
    if dist == "choice":
        return rng.choice(list(args))
    raise ValueError(f"hp distribution {dist!r} is not known (valid: loguniform, uniform, choice)")


OmegaConf.register_new_resolver("hp", _hp, replace=True)


def seed_everything(seed: int, deterministic: bool) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False


def keep_freed_memory() -> bool:
    """Speed on CPU, numbers unchanged: ask glibc's malloc to keep freed memory in the process (no mmap per large
    block: M_MMAP_MAX 0; no trimming of the heap top below 1 GiB: M_TRIM_THRESHOLD), as the GPU caching
    allocators do. By default a freed tensor of more than the mmap threshold (128 KiB, adapting up to 32 MiB) or at
    the top of the heap goes back to the kernel, and the next one faults in every 4 KiB page on first touch: a
    cpu-scale Transformer-L3 step took 2,500-7,500 page faults, and 1.04x the time (measured in
    configs/experiment_scale/ht_char_ptb/cpu.yaml). Peak memory stays resident. Returns False (nothing changed)
    where the C library has no mallopt (not glibc)."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # glibc's malloc.h
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 1 << 30))


def _instantiate(node: DictConfig, **kwargs):
    """`instantiate(node)`, letting the project's own errors through as raised: Hydra wraps whatever a constructor
    raises (a data set's bad option, a checksum mismatch) into an InstantiationException with a traceback."""
    try:
        return instantiate(node, _convert_="all", **kwargs)
    except InstantiationException as e:
        if isinstance(e.__cause__, USER_ERRORS):
            raise e.__cause__ from None
        raise


def _call_with_config(what: str, fn, *args, **kwargs):
    """fn(*args, **kwargs) where every other argument comes from the config node `what`: an argument the callee
    refuses (torch's `Invalid learning rate`, an unknown keyword) is a ConfigError naming the node."""
    try:
        return fn(*args, **kwargs)
    except (TypeError, ValueError) as e:
        if isinstance(e, USER_ERRORS):
            raise
        raise ConfigError(f"{what}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def build_optimizer(cfg: DictConfig, model: "torch.nn.Module"):
    groups = cfg.optim.get("param_groups", "default")
    opt_partial = instantiate(cfg.optim.optimizer)
    if groups == "caffe":
        from highway_repro.engine.param_groups import caffe_param_groups

        params = caffe_param_groups(model, lr=cfg.optim.optimizer.lr,
                                    weight_decay=cfg.optim.optimizer.get("weight_decay", 0.0))
    elif groups == "default":
        params = [p for p in model.parameters() if p.requires_grad]
    else:
        raise ConfigError(f"optim.param_groups={groups!r} is not known (valid: default, caffe)")
    optimizer = _call_with_config("optim.optimizer", opt_partial, params)
    schedule = _call_with_config("optim.scheduler", instantiate(cfg.optim.scheduler), optimizer,
                                 max_steps=cfg.trainer.max_steps)
    return optimizer, schedule


def match_params(cfg: DictConfig, meta: dict) -> int:
    """`match_params: <gate kind>` (the parameter-matched baseline of the gate zoo): set model.d_ff of the
    ungated model to the width whose parameter count is closest to the same model gated by that kind (same layers
    and sublayers), found from the counts at d_ff and d_ff + 1 (the count is linear in d_ff). Returns the new d_ff."""
    from highway_repro.models.placement import GATE_KINDS, is_gated

    kind = str(cfg.match_params)
    if kind not in GATE_KINDS or not is_gated(kind):
        raise ConfigError(f"match_params={kind} is not a gate kind (valid: "
                          f"{', '.join(k for k in GATE_KINDS if is_gated(k))})")
    if cfg.model.get("gate_kind") != "none" or not isinstance(cfg.model.get("d_ff"), int):
        raise ConfigError(f"match_params={kind} widens an ungated model with an integer model.d_ff (valid: "
                          f"model.gate_kind=none; got gate_kind={cfg.model.get('gate_kind')}, "
                          f"d_ff={cfg.model.get('d_ff')})")

    def count(**over) -> int:
        return sum(p.numel() for p in _instantiate(OmegaConf.merge(cfg.model, over), **meta).parameters())

    d = int(cfg.model.d_ff)
    target, p0, p1 = count(gate_kind=kind), count(d_ff=d), count(d_ff=d + 1)
    cfg.model.d_ff = d + round((target - p0) / (p1 - p0))
    log.info("match_params=%s: model.d_ff %d -> %d (%s parameters, gated %s)", kind, d, cfg.model.d_ff,
             f"{count(d_ff=cfg.model.d_ff):,}", f"{target:,}")
    return int(cfg.model.d_ff)


def run(cfg: DictConfig, out_dir: Path, dist=None) -> dict:
    """Build everything from a composed config and train; returns the final metrics."""
    validate(cfg)
    import torch

    from highway_repro.engine import checkpoint as ckpt_lib
    from highway_repro.engine.tasks import build_task
    from highway_repro.engine.trainer import Trainer, TrainerConfig
    from highway_repro.models.probe import GateRecorder

    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    keep_freed_memory()
    seed_everything(cfg.seed, cfg.deterministic)
    data = _instantiate(cfg.data)
    validate_against_data(cfg, data)
    if dist is not None:  # data.batch_size is the global batch; each rank trains on its slice
        dist.seed = int(cfg.seed)
        if getattr(data, "batch_size", 0) % dist.world_size:
            raise ConfigError(f"data.batch_size={data.batch_size} (the global batch) does not divide over "
                              f"{dist.world_size} processes (valid: a multiple of the world size)")
    if cfg.get("match_params"):
        match_params(cfg, data.meta)  # before the config is written: config_resolved.yaml has the widened d_ff
    model = _instantiate(cfg.model, **data.meta)
    task = build_task(data.kind)
    optimizer, schedule = build_optimizer(cfg, model)
    trainer_cfg = TrainerConfig(**OmegaConf.to_container(cfg.trainer, resolve=True))
    resolved = OmegaConf.to_container(cfg, resolve=True)
    if dist is None or dist.rank == 0:
        (out_dir / "config_resolved.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(resolved)))
    n_params = sum(p.numel() for p in model.parameters())
    is_main = dist is None or dist.rank == 0
    if is_main:
        log.info("data: %s", data.describe() if hasattr(data, "describe") else cfg.data.name)
        log.info("model: %s, %s parameters", type(model).__name__, f"{n_params:,}")
    logger_kwargs = OmegaConf.to_container(cfg.logger, resolve=True)
    kind = logger_kwargs.pop("kind")
    # resume=auto reads the newest checkpoint once: the trainer resumes from it, and a W&B run goes on logging
    # into its own W&B run (the logger is built before the trainer)
    latest = ckpt_lib.load_latest(out_dir / "ckpt") if cfg.resume == "auto" else None
    if kind == "wandb" and latest is not None and is_main:
        logger_kwargs.setdefault("resume_id", latest.get("extra", {}).get("logger_run_id"))
    logger = build_logger(kind if is_main else "jsonl", out_dir, config=resolved, **logger_kwargs)
    if dist is not None:
        model = dist.wrap(model)
    trainer = Trainer(model, data, task, optimizer, schedule, out_dir, logger, trainer_cfg,
                      run_config=resolved, dist=dist, gate_recorder=GateRecorder)
    if cfg.resume == "auto":
        trainer.resume_from(latest)
        del latest  # its tensors are the trainer's now
    elif cfg.resume:
        try:
            trainer.load_state(ckpt_lib.load(Path(cfg.resume), map_location=trainer.device))
        except (ckpt_lib.CheckpointError, ckpt_lib.UnsafeCheckpointError) as e:
            raise type(e)(f"resume={cfg.resume}: {e}") from None
    if is_main and trainer.step == 0:
        trainer._log({"model/params": n_params})
    if is_main:
        write_run_info(out_dir, start_time=now())  # machine, versions, threads, commit: read by the reports
    final = trainer.fit()
    if is_main:
        write_run_info(out_dir, end_time=now(), peak_rss_gb=round(trainer.peak_rss_gb(), 3))
    return final


# Keys that do not change what a run computes (speed, logging, bookkeeping): a run folder written with other values
# of these is the same run. The run-folder name's exclude_keys (configs/train.yaml), plus the device, the scale
# file's cost estimate and extra grids (which runs a table has, not how one trains) and the checkpoint / log cadence
# (resume is bit-exact at any checkpoint step; the log cadence changes only what the logged running mean of the
# training loss averages over, not the weights).
NOT_RECIPE = ("resume", "threads", "logger", "est_step_s", "est_peak_gb", "extra_grids", "trainer.progress", "trainer.device",
              "trainer.log_every", "trainer.checkpoint_every")


def _flat(d, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.update(_flat(v, key + ".") if isinstance(v, dict) else {key: v})
    return out


def recipe_diff(there: dict, here: dict) -> list[str]:
    """The recipe keys whose values differ between a run folder's config_resolved.yaml (`there`) and the config
    about to run (`here`), as 'key: value there, value here'. Keys of NOT_RECIPE, and keys only one side has (an
    option added or removed since, whose default keeps the old behaviour), are not compared; with `match_params`
    set, neither is model.d_ff (the saved config holds the widened width)."""
    a, b = _flat(there), _flat(here)
    skip = NOT_RECIPE + (("model.d_ff",) if here.get("match_params") else ())
    return [f"{k}: {a[k]!r} there, {b[k]!r} here" for k in sorted(a.keys() & b.keys())
            if a[k] != b[k] and not any(k == s or k.startswith(s + ".") for s in skip)]


def check_same_recipe(cfg: DictConfig, out_dir: Path) -> None:
    """With resume=auto, a run folder that already holds a run (config_resolved.yaml) must hold this recipe:
    otherwise a finished run of another recipe would be taken as this one's result, or a half-run one continued
    under another schedule (e.g. a kept run restored after the scale file changed). ConfigError naming the keys."""
    saved = out_dir / "config_resolved.yaml"
    if cfg.get("resume") != "auto" or not saved.exists():
        return
    diff = recipe_diff(OmegaConf.to_container(OmegaConf.load(saved)), OmegaConf.to_container(cfg, resolve=True))
    if diff:
        more = f"; and {len(diff) - 3} more" if len(diff) > 3 else ""
        raise ConfigError(f"resume=auto: the run folder {out_dir} holds a run of another recipe ({'; '.join(diff[:3])}"
                          f"{more}) (valid: the same recipe; move that folder away, e.g. under results/archive/, "
                          f"or pick another hydra.run.dir / reproduce --fresh; resume=<checkpoint path> continues it "
                          f"on purpose)")


def _summary(final: dict) -> str:
    keys = [k for k in final if k.split("/")[0] in ("train", "val", "test") and isinstance(final[k], float)]
    metrics = ", ".join(f"{k}={final[k]:.4f}" for k in sorted(keys))
    line = f"[{final.get('status')}] step {final.get('step')}" + (f": {metrics}" if metrics else "")
    if final.get("status") == "interrupted":
        line += f" (signal {final.get('signal')}; resume=auto continues it)"
    return line + (f" ({final['error']})" if final.get("error") else "")


# The folder where the jobs of one multirun note their user errors for SweepEnd: set by it in the environment, which
# the jobs of every launcher inherit (the basic launcher's run in this process, joblib's in workers it starts).
MULTIRUN_ENV = "HIGHWAY_MULTIRUN_ERRORS"


def _user_failure(e: Exception, done: Path, multirun: bool, is_main: bool = True):
    """One of USER_ERRORS: one line on stderr and exit code 2 (HYDRA_FULL_ERROR=1 adds the traceback). In a
    multirun the line names the job, metrics.json (`done`; None: the folder holds another run's, left as it is)
    records the error (the report marks this cell with it), Hydra goes on with the other jobs, and the multirun
    exits 2 once they have run (`SweepEnd`, told through a file in the sweep folder)."""
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        traceback.print_exception(e)
    if not multirun:
        print(f"error: {msg}", file=sys.stderr)
        sys.exit(2)
    if is_main:
        job = " ".join(HydraConfig.get().overrides.task) if HydraConfig.initialized() else ""
        if done is not None:
            try:
                write_json_atomic(done, {"status": "failed", "error": f"{type(e).__name__}: {msg}"})
            except StorageError:  # the folder cannot be written (the error may be just that): the line says why
                pass
        if os.environ.get(MULTIRUN_ENV):
            errors = Path(os.environ[MULTIRUN_ENV])
            errors.mkdir(parents=True, exist_ok=True)
            write_json_atomic(errors / f"{os.getpid()}-{time.time_ns()}.json", {"job": job})
        print(f"error: [{job}] {msg}" if job else f"error: {msg}", file=sys.stderr, flush=True)
    return None


class SweepEnd(Callback):
    """Hydra callback (configs/train.yaml, hydra.callbacks): a multirun in which a job failed on the user's input
    exits 2 after all its jobs have run, with one line (the jobs' own lines came before it). Each such job writes a
    file into `<sweep dir>/.user_errors/<this multirun's id>/` (`_user_failure`), also a job whose folder holds
    another recipe's run and so gets no metrics.json; the jobs of another multirun into the same folder at the same
    time (the table runner runs 2) write into their own. A bug in a job raises out of Hydra's sweeper before this."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        folder = Path(config.hydra.sweep.dir) / ".user_errors" / f"{os.getpid()}-{time.time_ns()}"
        os.environ[MULTIRUN_ENV] = str(folder.resolve())

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        import json
        import shutil

        folder = os.environ.pop(MULTIRUN_ENV, None)
        if folder is None or not Path(folder).is_dir():
            return
        jobs = []
        for f in sorted(Path(folder).glob("*.json")):
            try:
                jobs.append(json.loads(f.read_text())["job"] or "?")
            except (OSError, ValueError, KeyError, TypeError):
                jobs.append("?")
        shutil.rmtree(folder, ignore_errors=True)
        if not any(Path(folder).parent.iterdir()):
            Path(folder).parent.rmdir()
        n = len(jobs)
        print(f"error: {n} job{'s' if n > 1 else ''} of this multirun failed ({'; '.join(jobs)}); the lines above "
              "say why", file=sys.stderr)
        sys.exit(2)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
def main(cfg: DictConfig):
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:  # first of all, before torch is imported (engine/distributed.py): a bad config fails in about a second
        choices = HydraConfig.get().runtime.choices
        check_scale_file(CONFIG_DIR, choices.get("experiment"), choices.get("scale"))
        given = any(o.lstrip("+~").startswith("variant=") for o in HydraConfig.get().overrides.task)
        settle_variant(cfg, CONFIG_DIR, given)
        check_added_keys(cfg, list(HydraConfig.get().overrides.task), CONFIG_DIR)
        validate(cfg)
    except ConfigError as e:  # (before torch and the process group: under torchrun, rank 0 records it)
        rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
        return _user_failure(e, out_dir / "metrics.json", multirun, is_main=rank == "0")
    from highway_repro.engine.distributed import init_from_env, world_size_from_env

    dist = None
    if world_size_from_env() > 1:  # launched by torchrun (or a multi-task SLURM job): data-parallel
        dist = init_from_env(str(cfg.trainer.device), seed=int(cfg.seed))
        own_dir, out_dir = out_dir, Path(dist.broadcast_object(str(out_dir)))  # rank 0's run folder for all
        if dist.rank:
            logging.getLogger().setLevel(logging.WARNING)
        try:
            return _main(cfg, out_dir, multirun, dist)
        finally:
            dist.cleanup()
            if own_dir != out_dir and own_dir.is_dir() and {p.name for p in own_dir.iterdir()} <= {".hydra", "train.log"}:
                import shutil

                shutil.rmtree(own_dir, ignore_errors=True)  # the stray folder of a later-starting rank
    return _main(cfg, out_dir, multirun, dist)


def _main(cfg: DictConfig, out_dir: Path, multirun: bool, dist=None):
    is_main = dist is None or dist.rank == 0
    done = out_dir / "metrics.json"
    try:
        check_same_recipe(cfg, out_dir)
    except ConfigError as e:
        return _user_failure(e, None, multirun, is_main)
    if cfg.resume == "auto" and done.exists():
        import json

        prev = json.loads(done.read_text())
        if prev.get("status") == "done":
            log.info("run in %s already finished (resume=auto): nothing to do", out_dir)
            return prev.get("val/loss")
        if prev.get("status") == "diverged":  # a rerun repeats it: same seed, same data order, same weights
            log.info("run in %s diverged at step %s (resume=auto): nothing to do; resume=%s continues it from "
                     "the last good checkpoint, if one was written (change trainer.nan_policy or the learning rate "
                     "first)",
                     out_dir, prev.get("step"), out_dir / "ckpt" / "last.pt")
            return prev.get("val/loss")
    try:
        final = run(cfg, out_dir, dist=dist)
    except USER_ERRORS as e:
        return _user_failure(e, done, multirun, is_main)
    except Exception as e:  # a bug: its traceback is shown; the report still marks the cell as failed
        if unwritable(e) is not None:  # a full disk or a read-only folder: the user's to fix
            return _user_failure(storage_error(unwritable(e)), done, multirun, is_main)
        if is_main:
            write_json_atomic(done, {"status": "failed", "error": f"{type(e).__name__}: {e}"})
        raise
    if is_main:
        print(_summary(final))
    if final.get("status") == "interrupted":  # stop the whole sweep too; resume=auto continues it
        sys.exit(128 + final.get("signal", 15))
    return final.get("val/loss")


def _hydra_line(e: Exception) -> str:
    """One line for an error Hydra reports on several: a key that is not in the config names the override and the
    keys of its node; anything else is Hydra's message and its cause's, up to the details."""
    cause = e.__cause__
    key, node = getattr(cause, "full_key", None), getattr(cause, "parent_node", None)
    if key and isinstance(node, DictConfig) and getattr(cause, "key", None) not in node:
        given = next((a for a in sys.argv[1:] if a.split("=", 1)[0] == key), key)
        return f"{given} is not a key of {key.rpartition('.')[0] or 'the config'} (valid: {', '.join(map(str, node))})"
    if isinstance(e, OverrideParseException):
        from hydra.core.override_parser.overrides_parser import OverridesParser

        for arg in (a for a in sys.argv[1:] if not a.startswith("-")):
            try:
                OverridesParser.create().parse_overrides([arg])
            except OverrideParseException:
                return f"{arg} cannot be parsed ({str(e).splitlines()[0]}) (valid: Hydra's override grammar, " \
                       "https://hydra.cc/docs/advanced/override_grammar/basic/)"
    lines = []
    for text in (str(e), str(cause) if isinstance(cause, OmegaConfBaseException) else ""):
        for line in map(str.strip, text.splitlines()):
            if line.startswith(("See https://", "Config search path", "full_key:")):
                break
            lines += [line] if line else []
    return " ".join(lines)


def _one_line_errors(report):
    """Hydra's `run_and_report` (it runs the composition and the job, and prints what they raise), with Hydra's own
    multi-line errors on the command line (a key not in the config, an override it cannot parse, a config it cannot
    find) and a run folder it cannot write (a full disk, a read-only folder) as one line and exit code 2, like the
    project's errors. HYDRA_FULL_ERROR=1 keeps Hydra's report and traceback."""
    def run_and_report(func):
        def one_line():
            try:
                return func()
            except Exception as e:
                if isinstance(e, (ConfigCompositionException, MissingConfigException, OverrideParseException)):
                    line = _hydra_line(e)
                elif unwritable(e) is not None:
                    line = str(storage_error(unwritable(e)))
                else:
                    raise
                if os.environ.get("HYDRA_FULL_ERROR") == "1":
                    raise
            print(f"error: {line}", file=sys.stderr)
            sys.exit(2)
        return report(one_line)
    return run_and_report


def cli():
    """The command (`python -m highway_repro.train`, `highway-train`): a misspelt config-group choice on the command
    line is one line and exit 2 before Hydra composes; then Hydra's `main`, whose own errors on the command line
    are one line as well (`_one_line_errors`)."""
    import hydra._internal.utils as hydra_utils  # hydra-core 1.3 (pinned): _run_hydra calls run_and_report

    args = sys.argv[1:]
    more_configs = any(a.split("=", 1)[0] in ("--config-dir", "-cd", "--config-path", "-cp")
                       or a.lstrip("+").startswith("hydra.searchpath") for a in args)  # other folders: Hydra checks
    try:
        if not more_configs:
            check_group_choices([a for a in args if not a.startswith("-")], CONFIG_DIR)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    hydra_utils.run_and_report = _one_line_errors(hydra_utils.run_and_report)
    main()


if __name__ == "__main__":
    # run the function of the imported module, not of __main__: process launchers (joblib/loky,
    # submitit) then pickle it by reference instead of by value with all its globals
    from highway_repro.train import cli as _imported_cli

    _imported_cli()
