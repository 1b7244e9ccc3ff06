"""Config validation before any work: one-line errors naming the field, the value and what is allowed.

`validate(cfg)` runs on the composed config before data or model are built, and
before torch is imported (this module and `highway_repro.models.placement` are
pure Python; `train.py` imports torch after validation), so a bad value fails in
about a second with exit code 2 instead of a deep traceback. Model constructors
and data builders validate again (they are also used from Python);
`validate_against_data` checks the built data exactly.
"""

from __future__ import annotations

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


class ConfigError(ValueError):
    pass


POSITIVE_MODEL = ("depth", "n_layers", "d_model", "n_heads", "d_ff", "d_inner", "d_head", "window",
                  "tgt_len", "rnn_layers_per_block", "max_len")
NON_NEGATIVE_MODEL = ("mem_len", "eval_mem_len")
POSITIVE_DATA = ("batch_size", "eval_batch_size", "seq_len", "score_len", "eval_seq_len", "eval_score_len",
                 "vocab_size", "train_limit", "train_limit_tokens")
MEMORY_MODELS = ("TransformerXL",)
GATED_MODELS = ("TransformerLM", "RTransformer", "TransformerXL")  # the models with gate_kind/layers/sublayers
GATE_OPTIONS = ("gate_kind", "gate_layers", "gate_sublayers")

# Upper bounds of the training-set sizes of the registered data sets (images, or tokens with the default
# tokenizer), so that a batch larger than the data fails here, before anything is loaded. They are upper
# bounds (CIFAR-10 with allow_partial may have fewer images): validate_against_data checks exactly later.
TRAIN_IMAGES = {"mnist": 60_000, "cifar10": 50_000, "cifar100": 50_000}
TRAIN_TOKENS = {"ptb_word": 929_589, "ptb_char": 5_017_482, "ptb_char_raw": 5_101_618, "enwik8": 90_000_000,
                "enwik8_prefix": 3_738_959}
DEFAULT_TOKENIZER = {"ptb_word": "word", "ptb_char": "char", "ptb_char_raw": "char"}  # else "byte"

# trainer fields checked here (before torch is imported): (kind, minimum); int? = integer or null,
# num? = number > minimum or null. TrainerConfig checks the rest (and unknown keys) afterwards.
TRAINER_NUMBERS = {"max_steps": ("int", 1), "log_every": ("int", 1), "eval_every": ("int", 0),
                   "checkpoint_every": ("int", 0), "gate_stats_every": ("int", 0), "max_bad_steps": ("int", 0),
                   "eval_max_batches": ("int?", 1), "final_max_batches": ("int?", 1), "grad_clip": ("num?", 0)}
TRAINER_CHOICES = {"precision": ("fp32", "bf16"), "nan_policy": ("stop", "skip"), "final_eval": ("last", "best")}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _get(node, section: str, key: str):
    """node[key] (None when absent); an interpolation that cannot be resolved is a ConfigError naming the field."""
    if node is None or key not in node:
        return None
    try:
        return node[key]
    except OmegaConfBaseException as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"{section + '.' if section else ''}{key} cannot be resolved ({type(e).__name__}: {msg})") \
            from None


def _plain(v):
    """A DictConfig / ListConfig as plain Python (for messages and for the placement parser)."""
    return OmegaConf.to_container(v, resolve=True) if isinstance(v, (DictConfig, ListConfig)) else v


def _check_positive(section: str, node, keys, minimum: int) -> None:
    for k in keys:
        v = _get(node, section, k)
        if v is None:
            continue
        if not _is_int(v) or v < minimum:
            rule = "a positive integer" if minimum == 1 else "an integer >= 0"
            raise ConfigError(f"{section}.{k}={v!r} is not allowed (must be {rule})")


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError (one line: field, value, what is allowed) for a config that cannot run."""
    try:
        _validate(cfg)
    except ConfigError:
        raise
    except OmegaConfBaseException as e:  # an interpolation elsewhere that cannot be resolved
        key = getattr(e, "full_key", None) or "config"
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"{key} cannot be resolved ({type(e).__name__}: {msg})") from None


def _validate(cfg: DictConfig) -> None:
    model, data = _get(cfg, "", "model"), _get(cfg, "", "data")
    if not isinstance(model, DictConfig) or "_target_" not in model:
        raise ConfigError("model is not set (choose one with model=<name>, e.g. model=mlp)")
    target = str(model._target_).rsplit(".", 1)[-1]
    _check_positive("model", model, POSITIVE_MODEL, 1)
    _check_positive("model", model, NON_NEGATIVE_MODEL, 0)
    if data is not None and not isinstance(data, DictConfig):
        raise ConfigError(f"data={_plain(data)!r} is not allowed (choose a data set with data=<name>, e.g. data=mnist)")
    _check_positive("data", data, POSITIVE_DATA, 1)
    width = _get(model, "model", "width")
    if width is not None and not (width in ("paper", "match") or (_is_int(width) and width >= 1)):
        raise ConfigError(f"model.width={_plain(width)!r} is not allowed "
                          "(valid: a positive integer, 'paper' or 'match')")
    d_model, n_heads = _get(model, "model", "d_model"), _get(model, "model", "n_heads")
    if d_model and n_heads and target not in MEMORY_MODELS and d_model % n_heads:
        raise ConfigError(f"model.n_heads={n_heads} does not divide model.d_model={d_model} "
                          f"(valid: a divisor of {d_model})")
    if target not in MEMORY_MODELS:
        for k in ("mem_len", "eval_mem_len"):
            if k in model:
                raise ConfigError(f"model.{k}={_plain(_get(model, 'model', k))!r} is not allowed: {target} has no "
                                  f"memory (valid only for {', '.join(MEMORY_MODELS)}; remove model.{k})")
    if target not in GATED_MODELS:
        for k in GATE_OPTIONS:
            if k in model:
                raise ConfigError(f"model.{k}={_plain(_get(model, 'model', k))!r} is not allowed: {target} has no "
                                  f"sublayer gates (valid only for {', '.join(GATED_MODELS)}; remove model.{k})")
    elif "gate_kind" in model:
        from highway_repro.models.placement import check_placement  # pure Python, no torch

        try:
            check_placement(_get(model, "model", "n_layers"), _plain(_get(model, "model", "gate_kind")),
                            _plain(_get(model, "model", "gate_layers")) if "gate_layers" in model else "all",
                            _plain(_get(model, "model", "gate_sublayers")) if "gate_sublayers" in model else "both")
        except ValueError as e:
            raise ConfigError(f"model.{e}") from None
    _check_data_size(data)
    _check_trainer(_get(cfg, "", "trainer"))
    resume = _get(cfg, "", "resume")
    if resume is not None and not isinstance(resume, str):
        raise ConfigError(f"resume={_plain(resume)!r} is not allowed (valid: null, auto, or a checkpoint path)")


def _check_data_size(data) -> None:
    """A batch larger than the training data fails here, from the known sizes, before any data is loaded."""
    if data is None:
        return
    name, batch = _get(data, "data", "name"), _get(data, "data", "batch_size")
    if not isinstance(name, str) or batch is None:
        return
    if name in TRAIN_IMAGES:
        val = _get(data, "data", "val_size") or 0
        limit = _get(data, "data", "train_limit")
        if not _is_int(val) or not 0 <= val < TRAIN_IMAGES[name]:
            raise ConfigError(f"data.val_size={_plain(val)!r} is not allowed (valid: 0..{TRAIN_IMAGES[name] - 1}, "
                              f"{name} has {TRAIN_IMAGES[name]:,} training images)")
        n = TRAIN_IMAGES[name] - val
        what = f"{name} has at most {n:,} training images" + (f" with data.val_size={val}" if val else "")
        if limit is not None and limit < n:
            n, what = limit, f"{name} has {limit:,} training images with data.train_limit={limit}"
        if batch > n:
            raise ConfigError(f"data.batch_size={batch} is larger than the training data ({what}; valid: 1..{n})")
    elif name in TRAIN_TOKENS:
        tokenizer = _get(data, "data", "tokenizer")
        if tokenizer not in (None, DEFAULT_TOKENIZER.get(name, "byte")):
            return  # a subword vocabulary: the token count is only known after tokenising
        n = TRAIN_TOKENS[name]
        what = f"{name} has at most {n:,} training tokens"
        limit = _get(data, "data", "train_limit_tokens")
        if limit is not None and limit < n:
            n, what = limit, f"{name} has {limit:,} training tokens with data.train_limit_tokens={limit}"
        seq_len = _get(data, "data", "seq_len") or 1
        most = (n - 1) // seq_len  # batchify: batch_size columns of (n - 1) // batch_size >= seq_len tokens
        if batch > most:
            raise ConfigError(f"data.batch_size={batch} is larger than the training data ({what}, in columns of at "
                              f"least data.seq_len={seq_len}; valid: 1..{most})" if most >= 1 else
                              f"data.batch_size={batch} is larger than the training data ({what}, fewer than "
                              f"data.seq_len={seq_len} + 1; valid: none, lower data.seq_len)")


def _check_trainer(trainer) -> None:
    if trainer is None:
        return
    for k, (kind, minimum) in TRAINER_NUMBERS.items():
        v = _get(trainer, "trainer", k)
        if v is None and kind.endswith("?"):
            continue
        ok = (_is_int(v) if kind.startswith("int") else isinstance(v, (int, float)) and not isinstance(v, bool)) \
            and (v >= minimum if kind.startswith("int") else v > minimum)
        if not ok:
            rule = {"int": f"an integer >= {minimum}", "int?": f"an integer >= {minimum} or null",
                    "num?": "a number > 0 or null"}[kind]
            raise ConfigError(f"trainer.{k}={_plain(v)!r} is not allowed (valid: {rule})")
    for k, choices in TRAINER_CHOICES.items():
        v = _get(trainer, "trainer", k)
        if v is not None and (not isinstance(v, str) or v not in choices):
            raise ConfigError(f"trainer.{k}={_plain(v)!r} is not allowed (valid: {', '.join(choices)})")
    device = _get(trainer, "trainer", "device")
    if device is not None and not isinstance(device, str):
        raise ConfigError(f"trainer.device={_plain(device)!r} is not allowed (valid: auto, cpu, cuda, cuda:N)")
    # unknown keys and the remaining checks: TrainerConfig itself (imports torch, so it comes last)
    import dataclasses

    from highway_repro.engine.trainer import TrainerConfig

    known = [f.name for f in dataclasses.fields(TrainerConfig)]
    unknown = sorted(set(trainer) - set(known))
    if unknown:
        raise ConfigError(f"trainer.{unknown[0]} is not a trainer option (valid: {', '.join(known)})")
    try:
        TrainerConfig(**{k: _plain(_get(trainer, "trainer", k)) for k in trainer})
    except (TypeError, ValueError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(msg if msg.startswith("trainer.") else f"trainer: {msg}") from None


def validate_against_data(cfg: DictConfig, data) -> None:
    if data.steps_per_epoch < 1:
        raise ConfigError(f"data.batch_size={cfg.data.get('batch_size')} is larger than the training data "
                          f"({data.describe() if hasattr(data, 'describe') else cfg.data.name})")


def check_scale_file(config_dir, experiment: str | None, scale: str | None) -> None:
    """Every experiment has a file per scale (configs/experiment_scale/<experiment>/<scale>.yaml): a missing or
    misspelt scale is an error, not a silent run at the paper's sizes (the defaults list marks it `optional`
    only so that runs without an experiment compose)."""
    from pathlib import Path

    if not experiment or experiment == "null" or not scale:
        return
    folder = Path(config_dir) / "experiment_scale" / experiment
    if not (folder / f"{scale}.yaml").exists():
        valid = sorted(p.stem for p in folder.glob("*.yaml"))
        raise ConfigError(f"scale={scale} is not allowed for experiment={experiment} (valid: {', '.join(valid)}; "
                          f"a new scale needs configs/experiment_scale/{experiment}/{scale}.yaml)")
