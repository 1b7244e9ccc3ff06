"""The jobs of a multirun trained in groups (`engine.group`): `hydra/launcher=grouped`.

    python -m highway_repro.train -m sweep=hn_fig1/cpu scale=cpu hydra/launcher=grouped hydra.launcher.size=4

The launcher (`hydra_plugins/highway_repro_launcher`) has `train.main` add each job to `JOBS`; `train_groups` trains
them in groups of one shape (`shape_key`), at most `size` each; a member is admitted as a lone job is, writes the
run folder it would write alone, and names its group in run_info.json.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys

from omegaconf import DictConfig, OmegaConf

from highway_repro.errors import ConfigError
from highway_repro.train.recipe import flat

log = logging.getLogger("highway_repro")

# The models a group can stack: forward a function of parameters and input, random draws through `models.dropout`.
GROUPABLE = ("MLP", "MnistHighwayNet", "CifarHighwayNet", "TransformerLM", "TransformerXL", "RTransformer")
# What a member of a group may have of its own; everything else of the resolved config must be equal.
MEMBER_KEYS = ("seed", "trial", "data.seed", "model.gate_bias", "optim.optimizer", "optim.scheduler", "hydra")
AUTO_SIZE = 32  # size=auto: every job of a shape, up to this many members a group
JOBS: list | None = None  # while the grouped launcher sets up its jobs: (cfg, run folder, multirun, `build_run`)


@contextlib.contextmanager
def collecting():
    """Within: `train.main` adds each composed job to `JOBS` (its folder's lock stays held) instead of training it."""
    global JOBS
    JOBS = []
    try:
        yield JOBS
    finally:
        JOBS = None


def shape_key(cfg: DictConfig) -> str:
    """The part of a config that all members of a group share (`MEMBER_KEYS` left out, but for their kind)."""
    def own(key: str) -> bool:
        return any(key == m or key.startswith(f"{m}.") and key[len(m) + 1:] not in ("_target_", "kind")
                   for m in MEMBER_KEYS)

    plain = flat(OmegaConf.to_container(cfg, resolve=True))
    return json.dumps({k: v for k, v in plain.items() if not own(k)}, sort_keys=True, default=str)


def check_groupable(cfgs: list) -> None:
    """One line naming the first member whose config cannot join a group."""
    for cfg in cfgs:
        if str(cfg.model._target_).rsplit(".", 1)[-1] not in GROUPABLE:
            raise ConfigError(f"model._target_={cfg.model._target_} cannot train in a group (valid: the models "
                              f"{', '.join(GROUPABLE)}; run it alone: without hydra/launcher=grouped, or GROUP=1)")
        if cfg.trainer.precision != "fp32":
            raise ConfigError(f"trainer.precision={cfg.trainer.precision} cannot train in a group (valid: fp32)")
        if cfg.trainer.get("compile", "off") != "off":
            raise ConfigError(f"trainer.compile={cfg.trainer.compile} cannot train in a group (valid: off; a group "
                              "runs its members' stacked forward under vmap)")
        if cfg.trainer.nan_policy == "skip" and str(cfg.model._target_).endswith("TransformerXL"):
            raise ConfigError("trainer.nan_policy=skip cannot train in a group with Transformer-XL (a skipped batch "
                              "empties one member's memory; valid: stop, or GROUP=1)")


def group_size(size) -> int:
    if size == "auto":
        return AUTO_SIZE
    if isinstance(size, int) and not isinstance(size, bool) and size >= 1:
        return size
    raise ConfigError(f"hydra.launcher.size={size!r} is not valid (valid: auto, or an integer >= 1)")


def plan_groups(jobs: list, size) -> list[list]:
    """The jobs in groups of one shape, at most `size` each, in the order of their first job."""
    n, by_shape = group_size(size), {}
    for job in jobs:
        by_shape.setdefault(shape_key(job[0]), []).append(job)
    return [same[i:i + n] for same in by_shape.values() for i in range(0, len(same), n)]


def train_groups(jobs: list, size) -> None:
    """Train the collected jobs in groups; a stop signal ends the multirun (exit 128 + signal) once every member
    has saved its state."""
    for group in plan_groups(jobs, size):
        stopped = train_group(group)
        if stopped:
            sys.exit(128 + stopped)


def train_group(jobs: list) -> int:
    """One group: admit its members, train them together, write their run_info.json and last lines. Returns the
    signal that stopped it, else 0."""
    from highway_repro.train.job import failures, folder_lock, summary, to_train
    from highway_repro.engine.group import Group, Member
    from highway_repro.engine.loggers import now, write_json_atomic, write_run_info
    from highway_repro.models.dropout import member_generators

    check_groupable([job[0] for job in jobs])
    members, locks = [], []
    try:
        for cfg, out_dir, multirun, build_run in jobs:
            train = False
            with failures(None, multirun):  # another writer's or recipe's folder: left as it is
                locks.append(folder_lock(out_dir))
                train = to_train(cfg, out_dir)[0]
            if train:
                with failures(out_dir / "metrics.json", multirun):
                    members.append((build_run(cfg, out_dir, trainer_cls=Member), out_dir))
        if not members:
            return 0
        folders = [out_dir.name for _, out_dir in members]
        name = f"{members[0][1].parent.name}/{folders[0]}+{len(folders) - 1}"  # its first member's folder: unique
        for i, (_, out_dir) in enumerate(members):  # the members by their folders' names
            write_run_info(out_dir, start_time=now(), group={"id": name, "size": len(members), "position": i,
                                                             "members": folders})
        log.info("group %s: %d members trained together", name, len(members))
        try:
            finals = Group([m for m, _ in members], name, draws=member_generators).fit()
        except Exception as e:  # a bug: every member's cell is marked failed, with the traceback shown
            for m, out_dir in members:
                write_json_atomic(out_dir / "metrics.json", {"status": "failed", "error": f"{type(e).__name__}: {e}"})
            raise
        for (m, out_dir), final in zip(members, finals):
            write_run_info(out_dir, end_time=now(), peak_rss_gb=round(m.peak_rss_gb(), 3))
            print(summary(final))
        return next((f.get("signal", 15) for f in finals if f.get("status") == "interrupted"), 0)
    finally:
        for lock in locks:
            lock.release()
