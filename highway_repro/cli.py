"""The command line of `python -m highway_repro.train`: how a job runs, and what the user sees when something is
wrong.

- `launch` runs the job of a composed config (`run_job`: the recipe guard, a finished run left as it is, then
  the training function), data-parallel under torchrun.
- A mistake of the user's (`USER_ERRORS`: a config value, a data file, a checkpoint) is one line on stderr and exit
  code 2, no traceback (`user_failure`); HYDRA_FULL_ERROR=1 adds the traceback. Anything else is a bug and keeps
  its traceback. `build` and `with_config` let such errors out of a constructor as they were raised, and make what
  torch refuses from a config node a ConfigError naming it.
- In a multirun the line names the job, its metrics.json records the error, Hydra goes on with the other jobs, and
  the multirun exits 2 once they have run (`SweepEnd`, the Hydra callback of configs/train.yaml).
- Hydra's own multi-line errors on the command line (a misspelt group choice, a key not in the config, an override
  it cannot parse, an option's old name) and a run folder it cannot write are one line and exit 2 as well
  (`prepare`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.errors import (ConfigCompositionException, InstantiationException, MissingConfigException,
                          OverrideParseException)
from hydra.experimental.callback import Callback
from hydra.utils import instantiate
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from highway_repro import options
from highway_repro.config import check_group_choices
from highway_repro.engine.loggers import write_json_atomic
from highway_repro.errors import ConfigError, HighwayError, StorageError, storage_error, unwritable
from highway_repro.recipe import check_same_recipe

# What is reported in one line with exit code 2, without a traceback: the project's own error classes, raised for
# the user's input (a config value, a data file, a checkpoint). Anything else is a bug and keeps its traceback.
USER_ERRORS = (ConfigError, HighwayError)

# The folder where the jobs of one multirun note their user errors for SweepEnd: set by it in the environment, which
# the jobs of every launcher inherit (the basic launcher's run in this process, joblib's in workers it starts).
MULTIRUN_ENV = "HIGHWAY_MULTIRUN_ERRORS"

log = logging.getLogger("highway_repro")


def user_failure(e: Exception, done: Path | None, multirun: bool, is_main: bool = True):
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
    file into `<sweep dir>/.user_errors/<this multirun's id>/` (`user_failure`), also a job whose folder holds
    another recipe's run and so gets no metrics.json; the jobs of another multirun into the same folder at the same
    time (the table runner runs 2) write into their own. A bug in a job raises out of Hydra's sweeper before this."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        folder = Path(config.hydra.sweep.dir) / ".user_errors" / f"{os.getpid()}-{time.time_ns()}"
        os.environ[MULTIRUN_ENV] = str(folder.resolve())

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
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


def build(node: DictConfig, **kwargs):
    """`hydra.utils.instantiate(node)`, the project's own errors as raised: Hydra wraps whatever a constructor
    raises (a data set's bad option, a checksum mismatch) into an InstantiationException with a traceback."""
    try:
        return instantiate(node, _convert_="all", **kwargs)
    except InstantiationException as e:
        if isinstance(e.__cause__, USER_ERRORS):
            raise e.__cause__ from None
        raise


def with_config(what: str, fn, *args, **kwargs):
    """fn(*args, **kwargs), where every other argument comes from the config node `what`: an argument the callee
    refuses (torch's `Invalid learning rate`, an unknown keyword) is a ConfigError naming the node."""
    try:
        return fn(*args, **kwargs)
    except (TypeError, ValueError) as e:
        if isinstance(e, USER_ERRORS):
            raise
        raise ConfigError(f"{what}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def launch(cfg: DictConfig, out_dir: Path, multirun: bool, train) -> float | None:
    """The job of one composed config: `run_job` in this process, or, launched by torchrun or a multi-task SLURM job,
    data-parallel in rank 0's run folder (a later-starting rank's own empty folder is removed)."""
    from highway_repro.engine.distributed import init_from_env, world_size_from_env

    if world_size_from_env() <= 1:
        return run_job(cfg, out_dir, multirun, train)
    dist = init_from_env(str(cfg.trainer.device), seed=int(cfg.seed))
    own_dir, out_dir = out_dir, Path(dist.broadcast_object(str(out_dir)))  # rank 0's run folder for all
    if dist.rank:
        logging.getLogger().setLevel(logging.WARNING)
    try:
        return run_job(cfg, out_dir, multirun, train, dist)
    finally:
        dist.cleanup()
        if own_dir != out_dir and own_dir.is_dir() and {p.name for p in own_dir.iterdir()} <= {".hydra", "train.log"}:
            shutil.rmtree(own_dir, ignore_errors=True)  # the stray folder of a later-starting rank


def run_job(cfg: DictConfig, out_dir: Path, multirun: bool, train, dist=None) -> float | None:
    """One job in `out_dir`: the recipe guard, a finished run kept as it is (resume=auto), else
    `train(cfg, out_dir, dist=dist)` (`highway_repro.train.run`); returns the val/loss (Hydra's job return value).
    User errors are one line (`user_failure`); a bug keeps its traceback and marks metrics.json failed."""
    is_main = dist is None or dist.rank == 0
    done = out_dir / "metrics.json"
    try:
        check_same_recipe(cfg, out_dir)
    except ConfigError as e:
        return user_failure(e, None, multirun, is_main)
    prev = json.loads(done.read_text()) if cfg.resume == "auto" and done.exists() else {}
    if prev.get("status") == "done":
        log.info("run in %s already finished (resume=auto): nothing to do", out_dir)
        return prev.get("val/loss")
    if prev.get("status") == "diverged":  # a rerun repeats it: same seed, same data order, same weights
        log.info("run in %s diverged at step %s (resume=auto): nothing to do; resume=%s continues it from the last "
                 "good checkpoint, if one was written (change trainer.nan_policy or the learning rate first)",
                 out_dir, prev.get("step"), out_dir / "ckpt" / "last.pt")
        return prev.get("val/loss")
    try:
        final = train(cfg, out_dir, dist=dist)
    except USER_ERRORS as e:
        return user_failure(e, done, multirun, is_main)
    except Exception as e:  # a bug: its traceback is shown; the report still marks the cell as failed
        if unwritable(e) is not None:  # a full disk or a read-only folder: the user's to fix
            return user_failure(storage_error(unwritable(e)), done, multirun, is_main)
        if is_main:
            write_json_atomic(done, {"status": "failed", "error": f"{type(e).__name__}: {e}"})
        raise
    if is_main:
        print(summary(final))
    if final.get("status") == "interrupted":  # stop the whole sweep too; resume=auto continues it
        sys.exit(128 + final.get("signal", 15))
    return final.get("val/loss")


def summary(final: dict) -> str:
    """The run's last line: status, step and final metrics."""
    keys = [k for k in final if k.split("/")[0] in ("train", "val", "test") and isinstance(final[k], float)]
    metrics = ", ".join(f"{k}={final[k]:.4f}" for k in sorted(keys))
    line = f"[{final.get('status')}] step {final.get('step')}" + (f": {metrics}" if metrics else "")
    if final.get("status") == "interrupted":
        line += f" (signal {final.get('signal')}; resume=auto continues it)"
    return line + (f" ({final['error']})" if final.get("error") else "")


def hydra_line(e: Exception) -> str:
    """One line for an error Hydra reports on several: a key that is not in the config names the override and the
    keys of its node; anything else is Hydra's message and its cause's, up to the details."""
    cause = e.__cause__
    key, node = getattr(cause, "full_key", None), getattr(cause, "parent_node", None)
    if key and isinstance(node, DictConfig) and getattr(cause, "key", None) not in node:
        given = next((a for a in sys.argv[1:] if a.split("=", 1)[0] == key), key)
        model = str(node.get("_target_", "")).rsplit(".", 1)[-1] if key.startswith("model.") else ""
        old = options.renamed(model, key.rpartition(".")[2], given.partition("=")[2] or None)
        if old is not None:  # an option's old name: the message names the new one
            return str(old)
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


def one_line_errors(report):
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
                    line = hydra_line(e)
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


def prepare(args: list[str], config_dir) -> None:
    """Before Hydra's `main` runs: a misspelt config-group choice on the command line is one line and exit 2
    before Hydra composes (unless the command adds config folders: Hydra checks those); Hydra's own errors on the
    command line become one line as well (`one_line_errors`)."""
    import hydra._internal.utils as hydra_utils  # hydra-core 1.3 (pinned): _run_hydra calls run_and_report

    more_configs = any(a.split("=", 1)[0] in ("--config-dir", "-cd", "--config-path", "-cp")
                       or a.lstrip("+").startswith("hydra.searchpath") for a in args)  # other folders: Hydra checks
    try:
        if not more_configs:
            check_group_choices([a for a in args if not a.startswith("-")], config_dir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    hydra_utils.run_and_report = one_line_errors(hydra_utils.run_and_report)
