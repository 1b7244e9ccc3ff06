"""Sublayer gates of the Highway Transformer (Chai et al., ACL 2020, arXiv 2004.08178).

Every transformer of the project (transformer_lm, r_transformer, transformer_xl)
builds its sublayers as `x_next = LN(combine(x, sub(x)))` (post-LN) or
`x_next = combine(x, sub(LN(x)))` (pre-LN), where `combine` is the gate module
of that sublayer, or the plain residual sum when the sublayer is ungated.

Kinds (string keys; `x` is the sublayer input, i.e. the residual stream, not
normalised; in Transformer-XL the current segment only, not the memory):

=============  ===========================================  ==========================
kind           gate                                         pre-LayerNorm sum
=============  ===========================================  ==========================
none           (no parameters)                              x + sub
sdu_sigmoid    T = sigmoid(x W1 + b1), f = x W2 + b2        x + sub + T*f      (paper eq. SDU)
sdu_tanh       T = tanh(x W1 + b1),    f = x W2 + b2        x + sub + T*f
highway        T = sigmoid(x W1 + b1), f = x W2 + b2        (1-T)*x + sub + T*f
gated_attn     T = sigmoid(x W1 + b1), f = x W2 + b2        x + (1-T)*sub + T*f
=============  ===========================================  ==========================

T is the transform gate and C = 1 - T the carry gate, as in Highway Networks.
`highway` and `gated_attn` are the two variants of the official code (REFERENCE.md
B): the same formula is used for the attention and the FFN sublayer. W1 and W2
are one fused projection d -> 2d. Init as the official code: weights N(0, 0.02),
biases 0 (`gate_bias` shifts b1; 0 by default, the paper used no special init).

Placement (`resolve_placement`) is explicit per layer and per sublayer. Layers
are numbered from 1 in configs, as in the paper; "layers 3-6" gates exactly
layers 3, 4, 5 and 6 (the official code's prefix-only defect is not copied). A
sublayer without a gate creates no parameters.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch
from torch import nn

from highway_repro.models.probe import GateAct

GATE_KINDS = ("none", "sdu_sigmoid", "sdu_tanh", "highway", "gated_attn")
SUBLAYERS = ("attn", "ffn")
_PSI = {"sdu_sigmoid": "sigmoid", "sdu_tanh": "tanh", "highway": "sigmoid", "gated_attn": "sigmoid"}


class SublayerGate(nn.Module):
    """Gate beside one sublayer; `forward(x, sub)` returns the pre-LayerNorm sum (table above)."""

    def __init__(self, kind: str, d_model: int, gate_bias: float = 0.0, init_std: float = 0.02):
        super().__init__()
        if kind not in _PSI:
            raise ValueError(f"gate kind {kind!r} has no gate module (valid: {', '.join(_PSI)})")
        self.kind = kind
        self.proj = nn.Linear(d_model, 2 * d_model)  # fused [W1 | W2]: d -> 2d
        self.act = GateAct(_PSI[kind])
        nn.init.normal_(self.proj.weight, 0.0, init_std)
        nn.init.zeros_(self.proj.bias)
        with torch.no_grad():
            self.proj.bias[:d_model].fill_(gate_bias)

    def forward(self, x: torch.Tensor, sub: torch.Tensor) -> torch.Tensor:
        z1, f = self.proj(x).chunk(2, dim=-1)  # (B, T, d) each
        t = self.act(z1)  # transform gate T, (B, T, d)
        if self.kind == "highway":
            return x + sub + t * (f - x)  # (1-T)*x + sub + T*f
        if self.kind == "gated_attn":
            return x + sub + t * (f - sub)  # x + (1-T)*sub + T*f
        return x + sub + t * f  # SDU

    def extra_repr(self) -> str:
        return f"kind={self.kind}"


def make_gate(kind: str | None, d_model: int, gate_bias: float = 0.0) -> SublayerGate | None:
    """The gate module for one sublayer, or None for `none` (then no parameters exist)."""
    if kind is None or kind == "none":
        return None
    return SublayerGate(kind, d_model, gate_bias)


def combine(gate: SublayerGate | None, x: torch.Tensor, sub: torch.Tensor) -> torch.Tensor:
    """Pre-LayerNorm sum of a sublayer: plain residual x + sub when ungated."""
    return x + sub if gate is None else gate(x, sub)


def _parse_layers(layers, n_layers: int) -> list[int]:
    """1-based layer numbers from 'all', an int, a list of ints, or strings like '1-3' / '3,4,5'."""
    valid = f"valid: 1-{n_layers}, 'all', a list like [1, 2] or a range string like '1-3'"
    if layers is None or (isinstance(layers, str) and layers.strip().lower() == "all"):
        return list(range(1, n_layers + 1))
    if isinstance(layers, bool):
        raise ValueError(f"gate_layers={layers!r} is not a layer selection ({valid})")
    if isinstance(layers, int):
        items: list = [layers]
    elif isinstance(layers, str):
        items = []
        for part in layers.replace(" ", "").split(","):
            if not part:
                continue
            lo, sep, hi = part.partition("-")
            try:
                items.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
            except ValueError:
                raise ValueError(f"gate_layers={layers!r} cannot be parsed ({valid})") from None
    elif isinstance(layers, Iterable):
        items = list(layers)
    else:
        raise ValueError(f"gate_layers={layers!r} is not a layer selection ({valid})")
    out = []
    for i in items:
        if isinstance(i, bool) or not isinstance(i, int):
            raise ValueError(f"gate_layers={layers!r} contains {i!r}, not an integer ({valid})")
        if not 1 <= i <= n_layers:
            raise ValueError(f"gate_layers={list(items)} but the model has {n_layers} layers ({valid})")
        out.append(i)
    return sorted(set(out))


def _parse_sublayers(sublayers) -> tuple[str, ...]:
    valid = "valid: 'both', 'attn', 'ffn' or a list of those"
    if sublayers is None or sublayers == "both":
        return SUBLAYERS
    items = [sublayers] if isinstance(sublayers, str) else list(sublayers)
    for s in items:
        if s not in SUBLAYERS:
            raise ValueError(f"gate_sublayers={sublayers!r} contains {s!r} ({valid})")
    return tuple(s for s in SUBLAYERS if s in items)


def resolve_placement(n_layers: int, kind: str | Sequence[str] = "none", layers="all",
                      sublayers="both") -> list[dict[str, str | None]]:
    """Per layer (list index 0 = paper layer 1), the gate kind of its attention and FFN sublayer.

    `kind` is one string or a list with one kind per layer (x-transformers style).
    `layers` selects the gated layers (1-based), `sublayers` which sublayers get gates.

    >>> resolve_placement(4, "sdu_tanh", layers="3-4", sublayers="attn")[2]
    {'attn': 'sdu_tanh', 'ffn': None}
    """
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"n_layers={n_layers!r} must be a positive integer")
    if isinstance(kind, str):
        kinds = [kind] * n_layers
    else:
        kinds = list(kind)
        if len(kinds) != n_layers:
            raise ValueError(f"gate_kind has {len(kinds)} entries but the model has {n_layers} layers "
                             "(give one kind, or one per layer)")
    for k in kinds:
        if k not in GATE_KINDS:
            raise ValueError(f"gate_kind={k!r} is not known (valid: {', '.join(GATE_KINDS)})")
    chosen = set(_parse_layers(layers, n_layers))
    subs = _parse_sublayers(sublayers)
    out = []
    for i, k in enumerate(kinds, start=1):
        on = i in chosen and k != "none"
        out.append({s: (k if on and s in subs else None) for s in SUBLAYERS})
    return out


def describe_placement(placement: list[dict[str, str | None]]) -> str:
    """One line, e.g. 'L1 attn+ffn=sdu_tanh, L2 -' for logs and tables."""
    parts = []
    for i, p in enumerate(placement, start=1):
        on = [f"{s}={p[s]}" for s in SUBLAYERS if p[s]]
        parts.append(f"L{i} " + (",".join(on) if on else "-"))
    return "; ".join(parts)
