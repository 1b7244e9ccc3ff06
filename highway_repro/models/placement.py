"""Gate kinds and gate placement of the Highway Transformer models: which sublayer of which layer gets which gate.

Pure Python (no torch), so that `highway_repro.train.config.validate` can check a gate placement before torch is
imported; `highway_repro.models.gates` re-exports everything here. Layers are numbered from 1, as in the
paper and the configs.

`GATE_KINDS` is THE registry of gate kinds: name -> "module:Class" of its gate module (`None` for `none`: no
gate, no parameters). The names are all that validation needs, so they live here, torch-free; the class is
imported only when a model builds a gate (`gates.gate_class`). Strings rather than classes keep this module
free of torch without a second hand-written list of names; a kind can live in any importable module. To add a
kind: write its class (a subclass of `gates.SublayerGate`, see the table of kinds in gates.py) and add one
line here.

Every invalid input raises `ConfigError` (a ValueError) with a one-line message that names the option as in
the configs (`model.gate_kind`, `model.gate_layers`, `model.gate_sublayers`, `model.n_layers`), the value and
what is allowed.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from highway_repro.errors import ConfigError
from highway_repro.options import error, is_int

GATE_KINDS: dict[str, str | None] = {
    "none": None,
    "sdu_sigmoid": "highway_repro.models.gates:SDUSigmoid",
    "sdu_tanh": "highway_repro.models.gates:SDUTanh",
    "highway": "highway_repro.models.gates:HighwayGate",
    "gated_attn": "highway_repro.models.gates:GatedAttn",
}
SUBLAYERS = ("attn", "ffn")


def is_gated(kind: str | None) -> bool:
    """True for a kind that builds a gate module (not `none`)."""
    return kind is not None and GATE_KINDS[kind] is not None


def _layer_set(layers, n_layers: int) -> range | set[int]:
    """The selected layers as a set, or a range for 'all' (never a list of n_layers items: n_layers comes from
    the user, and validation must not hang on a huge value)."""
    valid = f"valid: 1-{n_layers}, 'all', a list like [1, 2] or a range string like '1-3'"
    field = "model.gate_layers"
    if layers is None or (isinstance(layers, str) and layers.strip().lower() == "all"):
        return range(1, n_layers + 1)
    if isinstance(layers, bool):
        raise ConfigError(f"{field}={layers!r} is not a layer selection ({valid})")
    if isinstance(layers, int):
        items: list = [layers]
    elif isinstance(layers, str):
        items = []
        for part in layers.replace(" ", "").split(","):
            if not part:
                continue
            lo, sep, hi = part.partition("-")
            try:
                lo_i, hi_i = int(lo), int(hi) if sep else int(lo)
            except ValueError:
                raise ConfigError(f"{field}={layers!r} cannot be parsed ({valid})") from None
            if not (1 <= lo_i <= n_layers and 1 <= hi_i <= n_layers):
                bad = lo_i if not 1 <= lo_i <= n_layers else hi_i
                raise ConfigError(f"{field}={layers!r} names layer {bad}, but the model's layers are 1-{n_layers} "
                                  f"(numbered from 1; {valid})")
            if hi_i < lo_i:
                raise ConfigError(f"{field}={layers!r} has the empty range {part!r} ({valid})")
            items.extend(range(lo_i, hi_i + 1))
    elif isinstance(layers, Iterable) and not isinstance(layers, (bytes, bytearray)):
        items = list(layers)
    else:
        raise ConfigError(f"{field}={layers!r} is not a layer selection ({valid})")
    out = []
    for i in items:
        if not is_int(i):
            raise ConfigError(f"{field}={items!r} contains {i!r}, not an integer ({valid})")
        if not 1 <= i <= n_layers:
            raise ConfigError(f"{field}={items} names layer {i}, but the model's layers are 1-{n_layers} "
                              f"(numbered from 1; {valid})")
        out.append(i)
    return set(out)


def _parse_sublayers(sublayers) -> tuple[str, ...]:
    valid = "valid: 'both', 'attn', 'ffn' or a list of those"
    field = "model.gate_sublayers"
    if sublayers is None or sublayers == "both":
        return SUBLAYERS
    if isinstance(sublayers, str):
        items = [sublayers]
    elif isinstance(sublayers, Iterable) and not isinstance(sublayers, (bytes, bytearray)):
        items = list(sublayers)
    else:
        raise ConfigError(f"{field}={sublayers!r} is not a sublayer selection ({valid})")
    for s in items:
        if not isinstance(s, str) or s not in SUBLAYERS:
            raise ConfigError(f"{field}={sublayers!r} contains {s!r} ({valid})")
    return tuple(s for s in SUBLAYERS if s in items)


def _parse_kinds(kind, n_layers: int) -> list[str]:
    valid = f"valid: {', '.join(GATE_KINDS)}, or a list with one of those per layer"
    field = "model.gate_kind"
    if isinstance(kind, str):
        kinds = [kind] * n_layers
    elif isinstance(kind, Iterable) and not isinstance(kind, (bytes, bytearray, dict)):
        kinds = list(kind)
        if len(kinds) != n_layers:
            raise ConfigError(f"{field} has {len(kinds)} entries but the model has {n_layers} layers "
                              "(give one kind, or one per layer)")
    else:
        raise ConfigError(f"{field}={kind!r} is not a gate kind ({valid})")
    for k in kinds:
        if not isinstance(k, str) or k not in GATE_KINDS:
            raise ConfigError(f"{field}={k!r} is not known (valid: {', '.join(GATE_KINDS)})")
    return kinds


def check_placement(n_layers: int, kind: str | Sequence[str] = "none", layers="all", sublayers="both") -> None:
    """Raise the ConfigError resolve_placement would raise, without building the per-layer list."""
    if not is_int(n_layers) or n_layers < 1:
        raise error("model.n_layers", n_layers, "a positive integer")
    if isinstance(kind, str):
        _parse_kinds(kind, 1)
    else:
        _parse_kinds(kind, n_layers)
    _layer_set(layers, n_layers)
    _parse_sublayers(sublayers)


def resolve_placement(n_layers: int, kind: str | Sequence[str] = "none", layers="all",
                      sublayers="both") -> list[dict[str, str | None]]:
    """Per layer (list index 0 = paper layer 1), the gate kind of its attention and FFN sublayer.

    `kind` is one string or a list with one kind per layer (x-transformers style).
    `layers` selects the gated layers (1-based), `sublayers` which sublayers get gates.

    >>> resolve_placement(4, "sdu_tanh", layers="3-4", sublayers="attn")[2]
    {'attn': 'sdu_tanh', 'ffn': None}
    """
    if not is_int(n_layers) or n_layers < 1:
        raise error("model.n_layers", n_layers, "a positive integer")
    kinds = _parse_kinds(kind, n_layers)
    chosen = _layer_set(layers, n_layers)
    subs = _parse_sublayers(sublayers)
    out = []
    for i, k in enumerate(kinds, start=1):
        on = i in chosen and is_gated(k)
        out.append({s: (k if on and s in subs else None) for s in SUBLAYERS})
    return out


def describe_placement(placement: list[dict[str, str | None]]) -> str:
    """One line, e.g. 'L1 attn+ffn=sdu_tanh, L2 -' for logs and tables."""
    parts = []
    for i, p in enumerate(placement, start=1):
        on = [f"{s}={p[s]}" for s in SUBLAYERS if p[s]]
        parts.append(f"L{i} " + (",".join(on) if on else "-"))
    return "; ".join(parts)
