"""Data sets by name: ``build(name, **options)``.

Classification (``kind == "classification"``): ``mnist``, ``cifar10``, ``cifar100``
(see :mod:`highway_repro.data.vision`). Language modelling (``kind == "lm"``):
``ptb_word``, ``ptb_char``, ``ptb_char_raw``, ``enwik8``, ``enwik8_prefix`` (see
:mod:`highway_repro.data.text`). Raw files come from ``$HIGHWAY_DATA_MIRROR``,
the cache dir or the public sources, and every use checks them and the prepared
arrays against their sha256s (see :mod:`highway_repro.data.sources` and
:mod:`highway_repro.data.prepared`).

Every returned object has ``kind``, ``meta``, ``splits``, ``train_batch(step)``,
``steps_per_epoch``, ``eval_batches(split)`` and ``describe()``; LM data also
``score_len`` / ``eval_score_len`` and ``num_targets(split)``.
"""

from __future__ import annotations

from highway_repro.errors import ConfigError

from . import sources, text, vision
from .sources import ChecksumError, DataError, DataNotFoundError
from .text import LM_OPTIONS, LMData
from .vision import VISION_OPTIONS, ImageData, UnsafePickleError

_CIFAR = VISION_OPTIONS + ("allow_partial",)
_ENWIK8 = LM_OPTIONS + ("newlines",)

# name -> (builder, accepted options)
REGISTRY = {
    "mnist": (vision.mnist, VISION_OPTIONS),
    "cifar10": (vision.cifar10, _CIFAR),
    "cifar100": (vision.cifar100, _CIFAR),
    "ptb_word": (text.ptb_word, LM_OPTIONS + ("reader", "vocab_size", "sp_model_type")),
    "ptb_char": (text.ptb_char, LM_OPTIONS),
    "ptb_char_raw": (text.ptb_char_raw, LM_OPTIONS),
    "enwik8": (text.enwik8, _ENWIK8),
    "enwik8_prefix": (text.enwik8_prefix, _ENWIK8),
}


def names() -> list[str]:
    return list(REGISTRY)


def build(name: str, **kwargs) -> ImageData | LMData:
    """The data set ``name`` with the given options (unknown names/options: a one-line error naming the valid ones)."""
    if name not in REGISTRY:
        raise DataError(f"unknown data set {name!r}; valid names: {', '.join(REGISTRY)}")
    builder, options = REGISTRY[name]
    unknown = sorted(set(kwargs) - set(options))
    if unknown:
        given = ", ".join(f"data.{k}={kwargs[k]!r}" for k in unknown)
        raise ConfigError(f"{given}: not an option of data set {name!r} (valid: {', '.join(options)})")
    return builder(**kwargs)


__all__ = ["build", "names", "REGISTRY", "ImageData", "LMData", "ChecksumError", "DataError", "DataNotFoundError",
           "UnsafePickleError", "sources"]
