"""A job in its run folder, and the one failure policy of a command (`failures`, `one_line_errors`).

- The user's mistake (`USER_ERRORS`, a write the user can fix, Hydra's composition errors) is one line on stderr
  and exit code 2; in a multirun the line names the job, its metrics.json says failed, the other jobs run and the
  multirun exits 2 at its end (`SweepEnd`). Anything else is a bug: metrics.json says failed, the traceback stays.
  HYDRA_FULL_ERROR=1 shows every traceback.
- One writer per run folder: `RunFolder` takes the lock before `.hydra/` is written; `held` keeps it while the job
  trains, after the recipe guard; a finished run is left as it is.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import re
import shutil
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException, InstantiationException, OverrideParseException
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

USER_ERRORS = (ConfigError, HighwayError)  # the user's input: one line, exit 2, no traceback
MULTIRUN_ENV = "HIGHWAY_MULTIRUN_ERRORS"  # where a multirun's jobs note their user errors (set by SweepEnd)
USER_FULL_ERROR = "HIGHWAY_USER_FULL_ERROR"  # the user's HYDRA_FULL_ERROR, while a command sets Hydra's to 1
NO_SUBDIR = "hydra.output_subdir=null"  # keeps Hydra from writing a job's .hydra/ (RunFolder writes it)
ADMITTED: dict[str, Lock | Exception] = {}  # run folder -> the lock RunFolder took for its job, or why it could not
log = logging.getLogger("highway_repro")


def user_failure(e: Exception, done: Path | None, multirun: bool, is_main: bool = True):
    """One line on stderr for a user error; alone, exit 2; in a multirun, `done` (metrics.json; None: another
    run's folder) says failed, the job is noted for `SweepEnd`, and the other jobs go on."""
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    if os.environ.get(USER_FULL_ERROR, os.environ.get("HYDRA_FULL_ERROR")) == "1":  # the user asked for tracebacks
        traceback.print_exception(e)
    if not multirun:
        print(f"error: {msg}", file=sys.stderr)
        sys.exit(2)
    if is_main:
        job = " ".join(HydraConfig.get().overrides.task) if HydraConfig.initialized() else ""
        with contextlib.suppress(StorageError):  # an unwritable folder: the line says why
            if done is not None:
                write_json_atomic(done, {"status": "failed", "error": f"{type(e).__name__}: {msg}"})
        if os.environ.get(MULTIRUN_ENV):
            files.write_atomic(Path(os.environ[MULTIRUN_ENV]) / f"{os.getpid()}-{time.time_ns()}", job)
        print(f"error: [{job}] {msg}" if job else f"error: {msg}", file=sys.stderr, flush=True)


def user_error(e: Exception) -> Exception | None:
    """The user's error that `e` is (USER_ERRORS, Hydra's composition errors as one line: `hydra_line`) or stands for
    (a write the user can fix, a run folder that cannot be made: StorageError), else None: a bug."""
    if isinstance(e, USER_ERRORS):
        return e
    if isinstance(e, (ConfigCompositionException, OverrideParseException)):  # (a missing config's too)
        return ConfigError(hydra_line(e))
    run_dir = HydraConfig.get().runtime.output_dir if HydraConfig.initialized() else RunFolder.folder
    cause = unwritable(e) or unmade(e, run_dir)
    return None if cause is None else storage_error(cause, cause.filename if cause.filename is not None else run_dir)


@contextlib.contextmanager
def failures(done: Path | None, multirun: bool, is_main: bool = True):
    """The failure policy of a job: the user's error is `user_failure`; a bug marks `done` failed and keeps its
    traceback."""
    try:
        yield
    except Exception as e:
        if user_error(e) is None:
            if is_main and done is not None:
                write_json_atomic(done, {"status": "failed", "error": f"{type(e).__name__}: {e}"})
            raise
        user_failure(user_error(e), done, multirun, is_main)


class SweepEnd(Callback):
    """Hydra callback: a multirun in which a job failed on the user's input exits 2 once all its jobs have run (they
    note themselves in `<sweep dir>/.user_errors/<this multirun>/`)."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        folder = Path(config.hydra.sweep.dir) / ".user_errors" / f"{os.getpid()}-{time.time_ns()}"
        os.environ[MULTIRUN_ENV] = str(folder.resolve())

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        folder = os.environ.pop(MULTIRUN_ENV, None)
        if folder is None or not Path(folder).is_dir():
            return
        jobs = [f.read_text(errors="replace") or "?" for f in sorted(Path(folder).glob("[!.]*"))]
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):  # another multirun's notes are still there
            Path(folder).parent.rmdir()
        print(f"error: {len(jobs)} job{'s' if len(jobs) > 1 else ''} of this multirun failed ({'; '.join(jobs)}); the "
              "lines above say why", file=sys.stderr)
        sys.exit(2)


def build(node, at: str, **kwargs):
    """`instantiate` of the config node at `at`, once `check_targets` allows its `_target_`s; a project error
    raised by the constructor comes out as raised, not wrapped by Hydra."""
    check_targets(node, at=at)
    try:
        return instantiate(node, _convert_="all", **kwargs)
    except InstantiationException as e:
        if isinstance(e.__cause__, USER_ERRORS):
            raise e.__cause__ from None
        raise


def with_config(what: str, fn, *args, **kwargs):
    """fn(*args, **kwargs) with the other arguments from config node `what`: what fn refuses is a ConfigError."""
    try:
        return fn(*args, **kwargs)
    except (TypeError, ValueError) as e:
        if isinstance(e, USER_ERRORS):
            raise
        raise ConfigError(f"{what}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


@contextlib.contextmanager
def ranks(cfg: DictConfig, out_dir: Path):
    """(dist, run folder): (None, `out_dir`) alone; under torchrun or SLURM tasks, the process group and rank 0's
    folder for all (a later rank's stray folder is removed at the end)."""
    from highway_repro.engine.distributed import init_from_env, world_size_from_env

    if world_size_from_env() <= 1:
        yield None, out_dir
        return
    dist = init_from_env(str(cfg.trainer.device), seed=int(cfg.seed))
    own_dir, out_dir = out_dir, Path(dist.broadcast_object(str(out_dir)))
    if dist.rank:
        logging.getLogger().setLevel(logging.WARNING)
    try:
        yield dist, out_dir
    finally:
        dist.cleanup()
        if own_dir != out_dir and own_dir.is_dir() and {p.name for p in own_dir.iterdir()} <= {".hydra", "train.log"}:
            shutil.rmtree(own_dir, ignore_errors=True)


@dataclass
class Job:
    train: bool = False  # False: another writer's or recipe's folder, a damaged kept file, or a finished run
    final: dict | None = None  # the run's final metrics, set by the caller
    value: float | None = None  # Hydra's return value: val/loss


@contextlib.contextmanager
def held(cfg: DictConfig, out_dir: Path, multirun: bool, dist=None):
    """The job in `out_dir` with the folder's lock held (`folder_lock`), past the recipe guard (`to_train`),
    under `failures` (a refused folder's metrics.json is left as it is). The caller trains where `job.train` and
    sets `job.final`; an interrupted run exits 128 + signal."""
    is_main, job, lock = dist is None or dist.rank == 0, Job(), None
    try:
        with failures(None, multirun, is_main):
            lock = folder_lock(out_dir, dist)
            job.train, job.value = to_train(cfg, out_dir)
        with failures(out_dir / "metrics.json", multirun, is_main):
            yield job
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
    """Rank 0's lock of the run folder (the one `RunFolder` took, else taken now), None on other ranks; a refusal
    (HighwayError) reaches every rank."""
    held, refused = None, None
    if dist is None or dist.rank == 0:
        taken = ADMITTED.pop(str(out_dir), None)
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


def to_train(cfg: DictConfig, out_dir: Path) -> tuple[bool, object]:
    """(whether to train, else the job's value): a kept file (a saved config, run_info.json) that is not plain data
    or a link, or another recipe's folder, is the user's error; a finished or diverged run (resume=auto) is kept."""
    files.no_links(out_dir, RUN_ENTRIES)
    check_same_recipe(cfg, out_dir)
    files.read_json(out_dir / "run_info.json", out_dir.parent, kind=dict)  # (updated as the run starts)
    prev = (files.read_json(out_dir / "metrics.json", out_dir.parent, kind=dict) or {}) if cfg.resume == "auto" else {}
    if prev.get("status") == "done":
        log.info("run in %s already finished (resume=auto): nothing to do", out_dir)
    elif prev.get("status") == "diverged":  # a rerun repeats it: same seed, same data order, same weights
        log.info("run in %s diverged at step %s (resume=auto): nothing to do; resume=%s continues it from the last "
                 "good checkpoint, if one was written (change trainer.nan_policy or the learning rate first)",
                 out_dir, prev.get("step"), out_dir / "ckpt" / "last.pt")
    else:
        return True, None
    return False, prev.get("val/loss")


def summary(final: dict) -> str:
    """The run's last line: status, step and final metrics."""
    keys = [k for k in final if k.split("/")[0] in ("train", "val", "test") and isinstance(final[k], float)]
    metrics = ", ".join(f"{k}={final[k]:.4f}" for k in sorted(keys))
    line = f"[{final.get('status')}] step {final.get('step')}" + (f": {metrics}" if metrics else "")
    if final.get("status") == "interrupted":
        line += f" (signal {final.get('signal')}; resume=auto continues it)"
    return line + (f" ({final['error']})" if final.get("error") else "")


def first_rank() -> bool:
    """Whether this process is rank 0 (or alone), as torchrun or SLURM number it before the process group starts."""
    return os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0"


class RunFolder(Callback):
    """Hydra callback: a job's `.hydra/` files are written by its folder's writer only. Hydra writes them before any
    callback hears of the job, so the run or multirun start turns them off (`hydra.output_subdir` null), and the
    job start takes the folder's lock (rank 0 alone), then writes Hydra's three files byte for byte. `folder_lock`
    hands the job that lock, or why it was refused; a lock no job took over is released as `main` ends."""

    folder: str | None = None  # the folder a command writes into, for the line of a write that fails there

    def __init__(self) -> None:
        self.subdir, self.added = None, False  # `.hydra/`'s folder in the run folder; NO_SUBDIR added by us

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
        try:  # Hydra makes an error raised here a warning: the job hears it from `folder_lock`
            lock = take(out_dir / RUN_LOCK, f"run folder {out_dir}", "one writer per run folder")
        except Exception as e:
            ADMITTED[str(out_dir)] = e
            return
        try:
            if self.subdir is not None:
                self.save_hydra_files(config, out_dir / self.subdir)
        except Exception as e:
            lock.release()
            cause = None if isinstance(e, HighwayError) else unwritable(e)
            ADMITTED[str(out_dir)] = e if cause is None else storage_error(cause)
            return
        ADMITTED[str(out_dir)] = lock

    def save_hydra_files(self, config: DictConfig, folder: Path) -> None:
        """What Hydra's `run_job` writes into `.hydra/`, with its settings as they were before this callback."""
        task, hydra_cfg = copy.deepcopy(config), copy.deepcopy(OmegaConf.masked_copy(config, "hydra"))
        with read_write(task), open_dict(task):
            del task["hydra"]
        with read_write(hydra_cfg.hydra):
            hydra_cfg.hydra.output_subdir = self.subdir
            ours = [i for i, o in enumerate(hydra_cfg.hydra.overrides.hydra) if o == NO_SUBDIR]
            if self.added and ours:
                del hydra_cfg.hydra.overrides.hydra[ours[-1]]
        root, ov = Path(config.hydra.runtime.output_dir), config.hydra.overrides.task  # no link below root
        for name, node in (("config.yaml", task), ("hydra.yaml", hydra_cfg), ("overrides.yaml", ov)):
            files.write_atomic(folder / name, OmegaConf.to_yaml(node), root)


def hydra_line(e: Exception) -> str:
    """One line for Hydra's multi-line error: a key not in the config names its node's keys (or an option's new
    name); an override Hydra cannot parse names the grammar; else Hydra's message up to its details."""
    cause = e.__cause__
    key, node = getattr(cause, "full_key", None), getattr(cause, "parent_node", None)
    if key and isinstance(node, DictConfig) and getattr(cause, "key", None) not in node:
        given = str(e).partition("To append to your config use +")[2] or key  # the override as Hydra parsed it
        model = str(node.get("_target_", "")).rsplit(".", 1)[-1] if key.startswith("model.") else ""
        old = options.renamed(model, key.rpartition(".")[2], given.partition("=")[2] or None)
        if old is not None:
            return str(old)
        return f"{given} is not a key of {key.rpartition('.')[0] or 'the config'} (valid: {', '.join(map(str, node))})"
    if isinstance(e, OverrideParseException):
        return f"{e.override} cannot be parsed ({str(e).splitlines()[0]}) (valid: Hydra's override grammar, " \
               "https://hydra.cc/docs/advanced/override_grammar/basic/)"
    texts = (str(e), str(cause) if isinstance(cause, OmegaConfBaseException) else "")  # each up to its details
    return " ".join(" ".join(re.split(r"\n\s*(?:See https://|Config search path|full_key:)", t)[0].split())
                    for t in texts).strip()


@contextlib.contextmanager
def one_line_errors():
    """The command's failure policy around Hydra (`user_error`: one line, exit 2; a bug keeps its traceback). Hydra
    raises its errors under its documented HYDRA_FULL_ERROR=1, set here; the user's own keeps every traceback. At
    the end, the locks no job took over are released."""
    before = {k: os.environ.get(k) for k in (USER_FULL_ERROR, "HYDRA_FULL_ERROR")}
    os.environ.setdefault(USER_FULL_ERROR, os.environ.get("HYDRA_FULL_ERROR", "0"))
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        yield
    except Exception as e:
        if os.environ[USER_FULL_ERROR] == "1" or user_error(e) is None:
            raise
        user_failure(user_error(e), None, multirun=False)
    finally:
        for k, v in before.items():  # as the command found them
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for out_dir in [k for k, v in ADMITTED.items() if isinstance(v, Lock)]:
            ADMITTED.pop(out_dir).release()


def hydra_flag(arg: str, flag: str, unique: str) -> bool:
    """Whether Hydra's parser takes `arg` for its long option `flag` (argparse takes any unambiguous prefix: from
    `unique` on)."""
    key = arg.split("=", 1)[0]
    return key.startswith(unique) and flag.startswith(key)


def prepare(args: list[str], config_dir) -> None:
    """Before Hydra (a multirun writes its sweep folder first): `--experimental-rerun` (it unpickles a file) is
    refused in every spelling, and a misspelt config-group choice is one line (unless the command adds config
    folders)."""
    rerun = next((a for a in args if hydra_flag(a, "--experimental-rerun", "--e")), None)
    if rerun is not None:
        raise ConfigError(f"{rerun} is not allowed: Hydra's --experimental-rerun unpickles a file (valid: rerun a job "
                          "from its run folder's .hydra/overrides.yaml, e.g. python -m highway_repro.train <those "
                          "overrides> hydra.run.dir=<folder> resume=auto)")
    if not any(hydra_flag(a, "--config-dir", "--config-d") or hydra_flag(a, "--config-path", "--config-p")
               or a.split("=", 1)[0] in ("-cd", "-cp") or a.lstrip("+").startswith("hydra.searchpath") for a in args):
        check_group_choices([a for a in args if not a.startswith("-")], config_dir)
