"""The command line of `python -m highway_repro.train`: how a job runs, and what the user sees when something is
wrong.

- `ranks` gives a job its process group under torchrun (rank 0's run folder for all); `held` holds its run folder
  (one writer, whose lock `RunFolder` takes before `.hydra/` is written: a refused job changes no file there; the
  recipe guard; a finished run left as it is) while the caller trains in it.
- A mistake of the user's (`USER_ERRORS`: a config value, a data file, a checkpoint) is one line on stderr and exit
  code 2, no traceback (`user_failure`); HYDRA_FULL_ERROR=1 adds the traceback. Anything else is a bug and keeps
  its traceback. `build` and `with_config` let such errors out of a constructor as they were raised, and make what
  torch refuses from a config node a ConfigError naming it.
- In a multirun the line names the job, its metrics.json records the error, Hydra goes on with the other jobs, and
  the multirun exits 2 once they have run (`SweepEnd`, the Hydra callback of configs/train.yaml).
- Hydra's own multi-line errors on the command line (a misspelt group choice, a key not in the config, an override
  it cannot parse, an option's old name) and a run folder it cannot write are one line and exit 2 as well
  (`prepare`; `one_line_errors`, through Hydra's documented HYDRA_FULL_ERROR switch, no patch of its internals);
  so is a stop signal outside training (`runtime.stopped`), and `--experimental-rerun` (it unpickles a file) is refused
  in every spelling Hydra's parser takes for it (`--exp=x`, `--e x`: argparse takes any unambiguous prefix).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import shutil
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.errors import (ConfigCompositionException, InstantiationException, MissingConfigException,
                          OverrideParseException)
from hydra.experimental.callback import Callback
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from highway_repro import files, options
from highway_repro.train.config import check_group_choices, check_targets
from highway_repro.engine.loggers import write_json_atomic
from highway_repro.errors import ConfigError, HighwayError, StorageError, storage_error, unmade, unwritable
from highway_repro.lock import RUN_LOCK, Lock, take
from highway_repro.targets import RUN_ENTRIES
from highway_repro.train.recipe import check_same_recipe

# What is reported in one line with exit code 2, without a traceback: the project's own error classes, raised for
# the user's input (a config value, a data file, a checkpoint). Anything else is a bug and keeps its traceback.
USER_ERRORS = (ConfigError, HighwayError)

# The folder where the jobs of one multirun note their user errors for SweepEnd: set by it in the environment, which
# the jobs of every launcher inherit (the basic launcher's run in this process, joblib's in workers it starts).
MULTIRUN_ENV = "HIGHWAY_MULTIRUN_ERRORS"

log = logging.getLogger("highway_repro")

# The run folders whose lock `RunFolder.on_job_start` took in this process (the Lock) or could not take (why not),
# until the job's `folder_lock` takes it over; those of `keep_for_group` stay past their job's end.
ADMITTED: dict[str, Lock | Exception] = {}
GROUPED: set[str] = set()
NO_SUBDIR = "hydra.output_subdir=null"  # the hydra override that keeps Hydra from writing a job's .hydra/


def user_failure(e: Exception, done: Path | None, multirun: bool, is_main: bool = True):
    """One of USER_ERRORS: one line on stderr and exit code 2 (HYDRA_FULL_ERROR=1 adds the traceback). In a
    multirun the line names the job, metrics.json (`done`; None: the folder holds another run's, left as it is)
    records the error (the report marks this cell with it), Hydra goes on with the other jobs, and the multirun
    exits 2 once they have run (`SweepEnd`, told through a file in the sweep folder)."""
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    if full_error():
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


def build(node, at: str, **kwargs):
    """`hydra.utils.instantiate(node)` of the config node at `at` (`data`, `model`, `optim.optimizer`, ...), once
    `config.check_targets` allows every `_target_` in it (a config never runs code of its choosing); the project's
    own errors as raised: Hydra wraps whatever a constructor raises (a data set's bad option, a checksum mismatch)
    into an InstantiationException with a traceback."""
    check_targets(node, at=at)
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


@contextlib.contextmanager
def ranks(cfg: DictConfig, out_dir: Path):
    """(dist, run folder) of the job: (None, `out_dir`) in one process; launched by torchrun or a multi-task SLURM
    job, the process group and rank 0's run folder for all (a later-starting rank's own empty folder is removed
    at the end)."""
    from highway_repro.engine.distributed import init_from_env, world_size_from_env

    if world_size_from_env() <= 1:
        yield None, out_dir
        return
    dist = init_from_env(str(cfg.trainer.device), seed=int(cfg.seed))
    own_dir, out_dir = out_dir, Path(dist.broadcast_object(str(out_dir)))  # rank 0's run folder for all
    if dist.rank:
        logging.getLogger().setLevel(logging.WARNING)
    try:
        yield dist, out_dir
    finally:
        dist.cleanup()
        if own_dir != out_dir and own_dir.is_dir() and {p.name for p in own_dir.iterdir()} <= {".hydra", "train.log"}:
            shutil.rmtree(own_dir, ignore_errors=True)  # the stray folder of a later-starting rank


@dataclass
class Job:
    """A job in its run folder (`held`): whether to train it, and what Hydra gets back (its val/loss)."""
    train: bool = False  # False: another writer's or another recipe's folder, or a finished run kept as it is
    final: dict | None = None  # the run's final metrics, set by the caller once it trained
    value: float | None = None  # Hydra's job return value


@contextlib.contextmanager
def held(cfg: DictConfig, out_dir: Path, multirun: bool, dist=None):
    """The job in `out_dir`, the run folder's lock held throughout (`folder_lock`: a second writer is one line and
    exit code 2, and has touched nothing of the folder, `.hydra/` included), then the recipe guard and a finished
    run kept as it is (`nothing_to_do`). Yields a `Job`; the caller trains where `job.train` and sets `job.final`.
    A user error in the block is one line (`user_failure`); a bug keeps its traceback and marks metrics.json
    failed. An interrupted run stops the whole sweep too (exit 128 + signal; resume=auto continues it)."""
    is_main, done, job = dist is None or dist.rank == 0, out_dir / "metrics.json", Job()
    try:
        lock = folder_lock(out_dir, dist)
    except HighwayError as e:  # another writer's folder: its metrics.json is left as it is
        job.value = user_failure(e, None, multirun, is_main)
        yield job
        return
    try:
        left, job.value = nothing_to_do(cfg, out_dir, multirun, is_main)
        job.train = not left
        try:
            yield job
        except USER_ERRORS as e:
            job.value = user_failure(e, done, multirun, is_main)
            return
        except Exception as e:  # a bug: its traceback is shown; the report still marks the cell as failed
            if unwritable(e) is not None:  # a full disk or a read-only folder: the user's to fix
                job.value = user_failure(storage_error(unwritable(e)), done, multirun, is_main)
                return
            if is_main:
                write_json_atomic(done, {"status": "failed", "error": f"{type(e).__name__}: {e}"})
            raise
        if job.final is None:
            return
        if is_main:
            print(summary(job.final))
        if job.final.get("status") == "interrupted":
            sys.exit(128 + job.final.get("signal", 15))
        job.value = job.final.get("val/loss")
    finally:
        if lock is not None:
            lock.release()


def folder_lock(out_dir: Path, dist=None) -> Lock | None:
    """Rank 0's lock of the run folder (`<out_dir>/.writer.lock`, `highway_repro.lock`), None on the other ranks:
    the one `RunFolder` took as the job started (or why it could not), else taken now; under DDP every rank learns
    whether rank 0 was refused, so that all of them stop."""
    held, refused = None, None
    if dist is None or dist.rank == 0:
        taken = ADMITTED.pop(str(out_dir), None)  # by `RunFolder` as the job started: a second flock would refuse
        GROUPED.discard(str(out_dir))
        try:
            if isinstance(taken, Exception):
                raise taken
            held = taken or take(out_dir / RUN_LOCK, f"run folder {out_dir}", "one writer per run folder")
        except HighwayError as e:
            refused = e
    if dist is not None:
        refused = dist.broadcast_object(refused)
    if refused is not None:
        raise refused
    return held


def nothing_to_do(cfg: DictConfig, out_dir: Path, multirun: bool, is_main: bool = True) -> tuple[bool, object]:
    """(True, the job's return value) where the job in `out_dir` is not to train: another recipe's folder or a saved
    config or run_info.json that is not plain data (its line), a finished or diverged run (resume=auto: kept as it
    is)."""
    try:  # another recipe, or a saved config or metrics.json that is not plain data, or a link it would write through
        files.no_links(out_dir, RUN_ENTRIES)
        check_same_recipe(cfg, out_dir)
        files.read_json(out_dir / "run_info.json", out_dir.parent, kind=dict)  # (updated as the run starts)
        prev = (files.read_json(out_dir / "metrics.json", out_dir.parent, kind=dict) or {}) if cfg.resume == "auto" \
            else {}
    except USER_ERRORS as e:
        return True, user_failure(e, None, multirun, is_main)
    if prev.get("status") == "done":
        log.info("run in %s already finished (resume=auto): nothing to do", out_dir)
        return True, prev.get("val/loss")
    if prev.get("status") == "diverged":  # a rerun repeats it: same seed, same data order, same weights
        log.info("run in %s diverged at step %s (resume=auto): nothing to do; resume=%s continues it from the last "
                 "good checkpoint, if one was written (change trainer.nan_policy or the learning rate first)",
                 out_dir, prev.get("step"), out_dir / "ckpt" / "last.pt")
        return True, prev.get("val/loss")
    return False, None


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


def first_rank() -> bool:
    """Whether this process is rank 0 (or alone), as torchrun or SLURM number it before the process group starts."""
    return os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0"


class RunFolder(Callback):
    """Hydra callback (configs/train.yaml, hydra.callbacks): a job's `.hydra/` files (config.yaml, hydra.yaml,
    overrides.yaml, by which the report files a run) are written by its run folder's writer only. Hydra writes them
    before any callback hears of the job (`hydra.core.utils.run_job`), so `on_run_start` sets `hydra.output_subdir`
    to null, `on_multirun_start` adds `hydra.output_subdir=null` to the hydra overrides every job is composed with
    (multirun.yaml lists it), and `on_job_start` takes the folder's lock (rank 0 alone under torchrun), then writes
    Hydra's three files byte for byte. `folder_lock` hands the job that lock or why it was refused (one line, as
    ever); a lock the job did not take over is released at its end. It also notes the folder a command writes
    into, for the one-line error of a write that fails there (`one_line_errors`)."""

    folder: str | None = None

    def __init__(self) -> None:
        self.subdir, self.added = None, False  # the folder of `.hydra/` in the run folder; NO_SUBDIR added by us

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        RunFolder.folder, self.subdir = str(config.hydra.run.dir), config.hydra.output_subdir
        with read_write(config.hydra):
            config.hydra.output_subdir = None

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        RunFolder.folder, self.subdir = str(config.hydra.sweep.dir), config.hydra.output_subdir
        if self.subdir is not None:
            with read_write(config.hydra.overrides):
                config.hydra.overrides.hydra.append(NO_SUBDIR)
            self.added = True

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        if not first_rank():
            return
        out_dir = Path(config.hydra.runtime.output_dir)
        try:  # Hydra makes an error raised here a warning and goes on: the job hears it from `folder_lock`
            lock = take(out_dir / RUN_LOCK, f"run folder {out_dir}", "one writer per run folder")
        except Exception as e:
            ADMITTED[str(out_dir)] = e
            return
        try:
            if self.subdir is not None:
                self.save_hydra_files(config, out_dir / self.subdir)
        except Exception as e:
            lock.release()
            cause = None if isinstance(e, HighwayError) else unwritable(e)  # (a StorageError names its file)
            ADMITTED[str(out_dir)] = e if cause is None else storage_error(cause)
            return
        ADMITTED[str(out_dir)] = lock

    def save_hydra_files(self, config: DictConfig, folder: Path) -> None:
        """What Hydra's `run_job` writes into `.hydra/`, `hydra.output_subdir` and the hydra overrides as they
        were before this callback set them."""
        task, hydra_cfg = copy.deepcopy(config), copy.deepcopy(OmegaConf.masked_copy(config, "hydra"))
        with read_write(task), open_dict(task):
            del task["hydra"]
        with read_write(hydra_cfg.hydra):
            hydra_cfg.hydra.output_subdir = self.subdir
            ours = [i for i, o in enumerate(hydra_cfg.hydra.overrides.hydra) if o == NO_SUBDIR]
            if self.added and ours:
                del hydra_cfg.hydra.overrides.hydra[ours[-1]]
        root, ov = Path(config.hydra.runtime.output_dir), config.hydra.overrides.task  # no link below root: .hydra
        for name, node in (("config.yaml", task), ("hydra.yaml", hydra_cfg), ("overrides.yaml", ov)):
            files.write_atomic(folder / name, OmegaConf.to_yaml(node), root)

    def on_job_end(self, config: DictConfig, **kwargs) -> None:
        out_dir = str(config.hydra.runtime.output_dir)
        left = None if out_dir in GROUPED else ADMITTED.pop(out_dir, None)
        if isinstance(left, Lock):  # a job that ended before `held` (a config error)
            left.release()


def own_metrics(out_dir: Path) -> Path | None:
    """The metrics.json of the job in `out_dir` for a user error before `held`; None where `RunFolder` could not
    take the folder (another writer's: its metrics.json is left as it is)."""
    return None if isinstance(ADMITTED.get(str(out_dir)), Exception) else out_dir / "metrics.json"


def keep_for_group(out_dir: Path) -> None:
    """The job in `out_dir` trains later with its group (`hydra/launcher=grouped`): the lock `RunFolder` took for it
    stays held past the job's end, for `grouped.train_group` to take over through `folder_lock`."""
    GROUPED.add(str(out_dir))


def _run_dir() -> str | None:
    """The job's run folder, where Hydra knows it already (None before it composed)."""
    if HydraConfig.initialized():
        return HydraConfig.get().runtime.output_dir
    return RunFolder.folder


# The user's HYDRA_FULL_ERROR, kept while a command sets Hydra's own to 1 (`one_line_errors`); the jobs of a
# multirun inherit both.
USER_FULL_ERROR = "HIGHWAY_USER_FULL_ERROR"


def full_error() -> bool:
    """Did the user ask for tracebacks (HYDRA_FULL_ERROR=1)?"""
    return os.environ.get(USER_FULL_ERROR, os.environ.get("HYDRA_FULL_ERROR")) == "1"


@contextlib.contextmanager
def one_line_errors():
    """Hydra's own multi-line errors on the command line (a key not in the config, an override it cannot parse, a
    config it cannot find) and a run folder it cannot write (a path under a file, a full disk while it writes
    `.hydra/`) as one line and exit code 2, like the project's errors. Hydra's documented switch HYDRA_FULL_ERROR=1
    makes `hydra.main` raise them instead of printing its report; they are caught here. A bug keeps its traceback;
    the user's own HYDRA_FULL_ERROR=1 keeps every traceback. At the command's end, the lock of a run folder whose
    job ended before `held` (exit 2 on a config error) is released."""
    before = {k: os.environ.get(k) for k in (USER_FULL_ERROR, "HYDRA_FULL_ERROR")}
    os.environ.setdefault(USER_FULL_ERROR, os.environ.get("HYDRA_FULL_ERROR", "0"))
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        yield
    except Exception as e:
        if full_error():
            raise
        if isinstance(e, (ConfigCompositionException, MissingConfigException, OverrideParseException)):
            line = hydra_line(e)
        elif (cause := unwritable(e) or unmade(e, _run_dir())) is not None:  # the run folder, or a file in .hydra/
            line = str(storage_error(cause, cause.filename if cause.filename is not None else _run_dir()))
        elif isinstance(e, USER_ERRORS):
            line = str(e).splitlines()[0] if str(e) else type(e).__name__
        else:
            raise
        print(f"error: {line}", file=sys.stderr)
        sys.exit(2)
    finally:
        for k, v in before.items():  # as the command found them (for a caller in the same process)
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for out_dir in [k for k, v in ADMITTED.items() if isinstance(v, Lock)]:
            ADMITTED.pop(out_dir).release()


def hydra_flag(arg: str, flag: str, unique: str) -> bool:
    """Whether Hydra's parser takes `arg` for its long option `flag`, its value after `=` or as the next argument:
    argparse takes any prefix of a long option that no other option shares, here those from `unique` on."""
    key = arg.split("=", 1)[0]
    return key.startswith(unique) and flag.startswith(key)


def prepare(args: list[str], config_dir) -> None:
    """Before Hydra's `main` runs: `--experimental-rerun` (it unpickles a file) is refused in each spelling Hydra's
    parser takes (`--e` to `--experimental-rerun`, `=` or a separate value), and a misspelt config-group choice on
    the command line is one line and exit 2 before Hydra composes (unless the command adds config folders)."""
    rerun = next((a for a in args if hydra_flag(a, "--experimental-rerun", "--e")), None)
    if rerun is not None:  # Hydra's flag unpickles the file it is given: a file never runs code here
        print(f"error: {rerun} is not allowed: Hydra's --experimental-rerun unpickles a file (valid: rerun a job "
              "from its run folder's .hydra/overrides.yaml, e.g. python -m highway_repro.train <those overrides> "
              "hydra.run.dir=<folder> resume=auto)", file=sys.stderr)
        sys.exit(2)
    more_configs = any(hydra_flag(a, "--config-dir", "--config-d") or hydra_flag(a, "--config-path", "--config-p")
                       or a.split("=", 1)[0] in ("-cd", "-cp") or a.lstrip("+").startswith("hydra.searchpath")
                       for a in args)  # other folders: Hydra checks
    try:
        if not more_configs:
            check_group_choices([a for a in args if not a.startswith("-")], config_dir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
