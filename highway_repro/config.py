"""Config validation before any work: one-line errors naming the field, the value and what is allowed.

`validate(cfg)` runs on the composed config before data or model are built, so a
bad value fails in about a second with exit code 2 instead of a deep traceback.
Model constructors validate again (they are also used from Python).
"""

from __future__ import annotations

from omegaconf import DictConfig

from highway_repro.engine.trainer import TrainerConfig


class ConfigError(ValueError):
    pass


POSITIVE_MODEL = ("depth", "n_layers", "d_model", "n_heads", "d_ff", "d_inner", "d_head", "window",
                  "tgt_len", "rnn_layers_per_block", "max_len")
NON_NEGATIVE_MODEL = ("mem_len", "eval_mem_len")
POSITIVE_DATA = ("batch_size", "eval_batch_size", "seq_len", "score_len", "eval_seq_len", "eval_score_len",
                 "vocab_size", "train_limit", "train_limit_tokens")
MEMORY_MODELS = ("TransformerXL",)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_positive(section: str, node, keys, minimum: int) -> None:
    for k in keys:
        v = node.get(k) if node is not None else None
        if v is None:
            continue
        if not _is_int(v) or v < minimum:
            rule = "a positive integer" if minimum == 1 else "an integer >= 0"
            raise ConfigError(f"{section}.{k}={v!r} is not allowed (must be {rule})")


def validate(cfg: DictConfig) -> None:
    model, data = cfg.get("model"), cfg.get("data")
    if model is None or "_target_" not in model:
        raise ConfigError("model is not set (choose one with model=<name>, e.g. model=mlp)")
    target = str(model._target_).rsplit(".", 1)[-1]
    _check_positive("model", model, POSITIVE_MODEL, 1)
    _check_positive("model", model, NON_NEGATIVE_MODEL, 0)
    _check_positive("data", data, POSITIVE_DATA, 1)
    width = model.get("width")
    if width is not None and not (isinstance(width, str) or (_is_int(width) and width >= 1)):
        raise ConfigError(f"model.width={width!r} is not allowed (valid: a positive integer, 'paper' or 'match')")
    d_model, n_heads = model.get("d_model"), model.get("n_heads")
    if d_model and n_heads and target not in MEMORY_MODELS and d_model % n_heads:
        raise ConfigError(f"model.n_heads={n_heads} does not divide model.d_model={d_model} "
                          f"(valid: a divisor of {d_model})")
    if target not in MEMORY_MODELS and ("mem_len" in model or "eval_mem_len" in model):
        raise ConfigError(f"model.mem_len is set but {target} has no memory (memory models: "
                          f"{', '.join(MEMORY_MODELS)}; remove model.mem_len)")
    if "gate_kind" in model:
        from highway_repro.models.gates import resolve_placement

        n_layers = model.get("n_layers")
        try:
            resolve_placement(n_layers, model.gate_kind if isinstance(model.gate_kind, str) else list(model.gate_kind),
                              model.get("gate_layers", "all"), model.get("gate_sublayers", "both"))
        except ValueError as e:
            raise ConfigError(f"model.{e}") from None
    try:
        TrainerConfig(**{k: v for k, v in cfg.trainer.items()})
    except TypeError as e:
        raise ConfigError(f"trainer: {e}") from None
    if cfg.get("resume") not in (None, "auto") and not isinstance(cfg.resume, str):
        raise ConfigError(f"resume={cfg.resume!r} is not allowed (valid: null, auto, or a checkpoint path)")


def validate_against_data(cfg: DictConfig, data) -> None:
    if data.steps_per_epoch < 1:
        raise ConfigError(f"data.batch_size={cfg.data.get('batch_size')} is larger than the training data "
                          f"({data.describe() if hasattr(data, 'describe') else cfg.data.name})")
