"""The checks of a composed config before anything is built and before torch is imported: one line naming the
field, the value and what is allowed. The rules are those of `highway_repro.options`, `models.placement` and
`engine.trainer_config` (pure Python), which the constructors call too; `validate_against_data` checks the built
data."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from pathlib import Path

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from highway_repro import options
from highway_repro.errors import ConfigError  # noqa: F401  (the entry point and the tests import it from here)

GATE_OPTIONS = ("gate_kind", "gate_layers", "gate_sublayers")


# The callables a config may name in a `_target_`, by node; anything else (`torch.load` of a pickle, say) is refused
# before anything is built: a config is data. Hydra's own node is the command line's and the config files'.
TARGETS: dict[str, tuple[str, ...]] = {
    "model": ("highway_repro.models.mlp.MLP", "highway_repro.models.convnets.MnistHighwayNet",
              "highway_repro.models.convnets.CifarHighwayNet", "highway_repro.models.transformer_lm.TransformerLM",
              "highway_repro.models.r_transformer.RTransformer",
              "highway_repro.models.transformer_xl.TransformerXL"),
    "data": ("highway_repro.data.build",),
    "optim.optimizer": tuple(f"torch.optim.{n}" for n in ("SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "Adamax",
                                                          "ASGD", "NAdam", "RAdam", "RMSprop", "Rprop")),
    "optim.scheduler": ("highway_repro.engine.schedules.build",),
}


def check_targets(cfg, where: str = "the config", at: str = "") -> None:
    """ConfigError for a `_target_` that `TARGETS` does not allow at its place, at any depth of `cfg` (a DictConfig
    or a saved config's dict, found at `at`), `hydra` left out; nothing is resolved."""
    def walk(node, path: str) -> None:
        for k, child in node.items() if isinstance(node, dict) else enumerate(node):
            key = f"{path}.{k}" if path else str(k)
            if k == "_target_" and child not in TARGETS.get(path, ()):
                allowed = (", ".join(TARGETS[path]) if path in TARGETS
                           else f"none here; a _target_ belongs to {', '.join(TARGETS)}")
                raise ConfigError(f"{key}={child} is not allowed in {where} (valid: {allowed})")
            if isinstance(child, (dict, list)) and key != "hydra":
                walk(child, key)

    walk(OmegaConf.to_container(cfg) if isinstance(cfg, (DictConfig, ListConfig)) else cfg, at)


def resolved(node) -> dict:
    """`node`'s keys (`hydra` left out) as plain values, every interpolation resolved; one that cannot be is a
    ConfigError naming its key."""
    plain = {}
    try:
        for k in (k for k in node if k != "hydra"):
            v = node[k]
            plain[k] = OmegaConf.to_container(v, resolve=True, throw_on_missing=True) if isinstance(
                v, (DictConfig, ListConfig)) else v
        return plain
    except OmegaConfBaseException as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"{e.full_key or 'config'} cannot be resolved ({type(e).__name__}: {msg})") from None


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError (one line: field, value, what is allowed) for a config that cannot run."""
    from highway_repro.models.placement import GATE_KINDS, check_placement, is_gated  # pure Python, no torch

    plain = resolved(cfg)
    for key, rule in options.RUN.items():
        if key in plain:
            rule.check(key, plain[key])
    model, data, optim = plain.get("model"), plain.get("data"), plain.get("optim")
    if not isinstance(model, dict) or "_target_" not in model:
        raise ConfigError("model is not set (choose one with model=<name>, e.g. model=mlp)")
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"data={data!r} is not allowed (choose a data set with data=<name>, e.g. data=mnist)")
    name = str(model["_target_"]).rsplit(".", 1)[-1]
    if name in options.MODELS:  # a model of this package (another _target_ is checked by its own constructor)
        options.check_model(name, model)
        if "gate_kind" in options.MODELS[name] and "n_layers" in model:
            defaults = ("none", "all", "both")
            check_placement(model["n_layers"], *(model.get(k, d) for k, d in zip(GATE_OPTIONS, defaults)))
    if data is not None:
        options.check_data(data)
    optimizer = optim.get("optimizer") if isinstance(optim, dict) else None
    if isinstance(optimizer, dict) and "lr" in optimizer:
        options.LEARNING_RATE.check("optim.optimizer.lr", optimizer["lr"])
    if plain.get("match_params") is not None:  # widens an ungated model's integer model.d_ff
        kind = str(plain["match_params"])
        if kind not in GATE_KINDS or not is_gated(kind):
            raise ConfigError(f"match_params={kind} is not a gate kind (valid: "
                              f"{', '.join(k for k in GATE_KINDS if is_gated(k))})")
        if model.get("gate_kind") != "none" or not options.is_int(model.get("d_ff")):
            raise ConfigError(f"match_params={kind} widens an ungated model with an integer model.d_ff (valid: model."
                              f"gate_kind=none; got gate_kind={model.get('gate_kind')}, d_ff={model.get('d_ff')})")
    if isinstance(plain.get("trainer"), dict):
        _check_trainer(plain["trainer"])
    if plain.get("resume") is not None and not isinstance(plain["resume"], str):
        raise ConfigError(f"resume={plain['resume']!r} is not allowed (valid: null, auto, or a checkpoint path)")


def _check_trainer(values: dict) -> None:
    """TrainerConfig's keys and types, the bounds of options.TRAINER, then TrainerConfig's own checks."""
    from highway_repro.engine.trainer_config import TrainerConfig

    fields = {f.name: f for f in dataclasses.fields(TrainerConfig)}
    for k, v in values.items():
        if k not in fields:
            raise ConfigError(f"trainer.{k} is not a trainer option (valid: {', '.join(fields)})")
        for rule in (options.annotation_rule(fields[k].type), options.TRAINER.get(k)):  # its type, then its bounds
            if rule is not None:
                rule.check(f"trainer.{k}", v)
    try:
        TrainerConfig(**values)
    except (TypeError, ValueError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(msg if msg.startswith("trainer.") else f"trainer: {msg}") from None


def validate_against_data(cfg: DictConfig, data, world_size: int = 1) -> None:
    """The built data: at least one training batch; under DDP, a global batch that divides over the processes."""
    if data.steps_per_epoch < 1:
        raise ConfigError(f"data.batch_size={cfg.data.get('batch_size')} is larger than the training data "
                          f"({data.describe()})")
    if getattr(data, "batch_size", 0) % world_size:  # data.batch_size is the global batch; each rank trains a slice
        raise ConfigError(f"data.batch_size={data.batch_size} (the global batch) does not divide over "
                          f"{world_size} processes (valid: a multiple of the world size)")


def check_scale_file(config_dir, experiment: str | None, scale: str | None) -> None:
    """configs/experiment_scale/<experiment>/<scale>.yaml must exist (the defaults list marks it `optional` only so
    that runs without an experiment compose): a misspelt scale is no silent run at the paper's sizes."""
    if not experiment or experiment == "null" or not scale:
        return
    folder = Path(config_dir) / "experiment_scale" / experiment
    if not (folder / f"{scale}.yaml").exists():
        valid = sorted(p.stem for p in folder.glob("*.yaml"))
        raise ConfigError(f"scale={scale} is not allowed for experiment={experiment} (valid: {', '.join(valid)}; "
                          f"a new scale needs configs/experiment_scale/{experiment}/{scale}.yaml)")


def check_group_choices(overrides: list[str], config_dir) -> None:
    """ConfigError for a command-line group choice with no file (`experiment=ht_char_pt`, `variant=a,b`), before
    Hydra composes; sweep functions, interpolations and Hydra's own groups are left to Hydra."""
    for arg in overrides:
        m = re.fullmatch(r"[+]{0,2}([a-z_]+)=([\w.,/-]*)", arg)
        if m is None or m[1] == "hydra" or not (Path(config_dir) / m[1]).is_dir():
            continue
        folder = Path(config_dir) / m[1]
        for choice in m[2].split(","):
            choice = choice.removesuffix(".yaml")
            if choice and choice != "null" and not (folder / f"{choice}.yaml").exists():
                valid = sorted(p.stem for p in folder.glob("*.yaml"))
                raise ConfigError(f"{m[1]}={choice} is not a config of configs/{m[1]}/ (valid: {', '.join(valid)})")


def check_added_keys(cfg: DictConfig, overrides: list[str], config_dir) -> None:
    """A key added with `+` (or added by `++`) is a constructor's argument: it goes into a node with a `_target_`
    (its constructor checks it); elsewhere (`+optim.lrr=1`, `++seedd=3`) nothing reads it: ConfigError. Group choices
    and Hydra's keys are left alone."""
    base = None
    if any(a.startswith("++") for a in overrides):  # the config without them: does a `++` set a key it has?
        from hydra import compose, initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra

        with (contextlib.nullcontext() if GlobalHydra.instance().is_initialized()
              else initialize_config_dir(config_dir=str(config_dir), version_base="1.3")):
            base = compose("train", overrides=[a for a in overrides if not a.startswith("++")])
    for arg in (a for a in overrides if a.startswith("+")):
        plus = "++" if arg.startswith("++") else "+"
        key, _, value = arg[len(plus):].partition("=")
        if key.startswith("hydra.") or not key or (Path(config_dir) / key.split("@")[0]).is_dir():
            continue
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent, throw_on_missing=False) if parent else cfg
        before = (OmegaConf.select(base, parent, throw_on_missing=False) if parent else base) if plus == "++" else None
        if (isinstance(node, DictConfig) and "_target_" in node) or (isinstance(before, DictConfig) and leaf in before):
            continue  # a constructor's argument, or a key the config has
        others = [str(k) for k in node if k != leaf] if isinstance(node, DictConfig) else []
        has = f"; {parent or 'the root'} has {', '.join(others)}" if others else ""
        raise ConfigError(f"{plus}{key}={value} is read by nothing: {parent or 'the config root'} has no _target_ "
                          f"(valid: + adds an argument to {', '.join(TARGETS)}{has})")


def check_command(cfg: DictConfig, config_dir, choices: dict, overrides: list[str]) -> None:
    """Every check of a config composed from the command line (its group `choices`, the `overrides`), before
    torch is imported."""
    check_scale_file(config_dir, choices.get("experiment"), choices.get("scale"))
    settle_variant(cfg, config_dir, any(o.lstrip("+~").startswith("variant=") for o in overrides))
    check_added_keys(cfg, overrides, config_dir)
    check_targets(cfg)
    validate(cfg)


def settle_variant(cfg: DictConfig, config_dir, given: bool) -> None:
    """Gate options set by hand over a `variant` row: with `variant=` given too (`given`), ConfigError; else the run's
    `variant` and `variant_label` become those options (`gate_kind=sdu_tanh`), so a report files it as trained."""
    name = cfg.get("variant")
    path = Path(config_dir) / "variant" / f"{name}.yaml"
    if name is None or not path.exists():
        return
    row = (yaml.safe_load(path.read_text()) or {}).get("model") or {}
    model = resolved(cfg.model)
    diff = [k for k in GATE_OPTIONS if k in row and str(model.get(k)) != str(row[k])]
    if not diff:
        return
    shown = ", ".join(f"{k}={model.get(k)}" for k in diff)
    if given:
        raise ConfigError(f"variant={name} sets {', '.join(f'model.{k}={row[k]}' for k in diff)}, but "
                          f"model.{shown.replace(', ', ', model.')} was given as well (valid: a variant alone, e.g. "
                          "variant=sdu_tanh, or the gate options alone)")
    with open_dict(cfg):
        cfg.variant = cfg.variant_label = shown
