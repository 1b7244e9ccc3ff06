"""Sublayer gates of the Highway Transformer (Chai et al., ACL 2020, arXiv 2004.08178).

Every transformer of the project (transformer_lm, r_transformer, transformer_xl)
builds its sublayers as `x_next = LN(combine(x, sub(x)))` (post-LN) or
`x_next = combine(x, sub(LN(x)))` (pre-LN), where `combine` is the gate module
of that sublayer, or the plain residual sum when the sublayer is ungated.

Kinds (string keys of the registry `placement.GATE_KINDS`; `x` is the sublayer input, i.e. the residual
stream, not normalised; in Transformer-XL the current segment only, not the memory):

=============  ===========  ===========================================  ==========================
kind           class        gate                                         pre-LayerNorm sum
=============  ===========  ===========================================  ==========================
none           (no module)  (no parameters)                              x + sub
sdu_sigmoid    SDUSigmoid   T = sigmoid(x W1 + b1), f = x W2 + b2        x + sub + T*f      (paper eq. SDU)
sdu_tanh       SDUTanh      T = tanh(x W1 + b1),    f = x W2 + b2        x + sub + T*f
highway        HighwayGate  T = sigmoid(x W1 + b1), f = x W2 + b2        (1-T)*x + sub + T*f
gated_attn     GatedAttn    T = sigmoid(x W1 + b1), f = x W2 + b2        x + (1-T)*sub + T*f
=============  ===========  ===========================================  ==========================

T is the transform gate and C = 1 - T the carry gate, as in Highway Networks.
`highway` and `gated_attn` are the two variants of the official code (REFERENCE.md
B): the same formula is used for the attention and the FFN sublayer. W1 and W2
are one fused projection d -> 2d. Init as the official code: weights N(0, 0.02),
biases 0 (`gate_bias` shifts b1; 0 by default, the paper used no special init).

A kind is a small subclass of `SublayerGate` with one method, `blend(x, sub, t, f)` (its pre-LayerNorm sum,
the formula of the table), and two class attributes: `psi`, the gate function, and `fused_term`, the term
that `kernels.gate_sum` adds to x + sub for the same sum (None: `fused=True` runs `blend` too). To add a
kind: one class (here or in any module) and one line in `placement.GATE_KINDS`.

Placement (`resolve_placement`) is explicit per layer and per sublayer. Layers
are numbered from 1 in configs, as in the paper; "layers 3-6" gates exactly
layers 3, 4, 5 and 6 (the official code's prefix-only defect is not copied). A
sublayer without a gate creates no parameters.
"""

from __future__ import annotations

import importlib

import torch
from torch import nn

from highway_repro.models import kernels
# placement and the registry are pure Python (config validation uses them before torch is imported)
from highway_repro.models.placement import (GATE_KINDS, SUBLAYERS, check_placement,  # noqa: F401
                                            describe_placement, is_gated, resolve_placement)
from highway_repro.models.probe import GateAct
from highway_repro.options import error


class SublayerGate(nn.Module):
    """Gate beside one sublayer; `forward(x, sub)` returns the pre-LayerNorm sum of its kind (table above).

    T = psi(x W1 + b1) and f = x W2 + b2 come from one projection `proj` (d -> 2d); T passes through the
    `act` module (a `probe.GateAct`, so gate recorders see it). `fused=True` computes the sum with
    `kernels.gate_sum` (same values, fewer memory passes) when the kind has a `fused_term`.
    """

    psi = "sigmoid"  # the gate function, a key of probe.GATE_FUNCTIONS
    fused_term: str | None = None  # one of kernels.GATE_TERMS: blend == x + sub + fused_term

    def __init__(self, kind: str, d_model: int, gate_bias: float = 0.0, fused: bool = False,
                 init_std: float = 0.02):
        super().__init__()
        self.kind, self.fused = kind, fused
        self.proj = nn.Linear(d_model, 2 * d_model)  # fused [W1 | W2]: d -> 2d
        self.act = GateAct(self.psi)
        nn.init.normal_(self.proj.weight, 0.0, init_std)
        nn.init.zeros_(self.proj.bias)
        with torch.no_grad():
            self.proj.bias[:d_model].fill_(gate_bias)

    def blend(self, x: torch.Tensor, sub: torch.Tensor, t: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        """The pre-LayerNorm sum from x, sub and the gate's T and f, all (B, T, d)."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor, sub: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)  # (B, T, 2d) = [z1 | f]
        if self.fused and self.fused_term is not None:
            return kernels.gate_sum(h, x, sub, self.act, self.fused_term)
        z1, f = h.chunk(2, dim=-1)  # (B, T, d) each
        return self.blend(x, sub, self.act(z1), f)  # T = psi(z1), the transform gate

    def extra_repr(self) -> str:
        return f"kind={self.kind}, fused={self.fused}"


class SDUSigmoid(SublayerGate):
    """Self-dependency unit with a sigmoid gate: x + sub + T*f."""

    psi, fused_term = "sigmoid", "T*f"

    def blend(self, x, sub, t, f):
        return x + sub + t * f


class SDUTanh(SDUSigmoid):
    """Self-dependency unit with a tanh gate: x + sub + T*f."""

    psi = "tanh"


class HighwayGate(SublayerGate):
    """Highway gate of the official code: (1-T)*x + sub + T*f."""

    psi, fused_term = "sigmoid", "T*(f-x)"

    def blend(self, x, sub, t, f):
        return x + sub + t * (f - x)  # (1-T)*x + sub + T*f


class GatedAttn(SublayerGate):
    """Gated sublayer output of the official code: x + (1-T)*sub + T*f."""

    psi, fused_term = "sigmoid", "T*(f-sub)"

    def blend(self, x, sub, t, f):
        return x + sub + t * (f - sub)  # x + (1-T)*sub + T*f


def gate_class(kind: str) -> type[SublayerGate] | None:
    """The gate module class of a registered kind (`placement.GATE_KINDS`), None for a kind without a gate."""
    if not isinstance(kind, str) or kind not in GATE_KINDS:
        raise error("model.gate_kind", kind, ", ".join(GATE_KINDS), "is not known")
    if GATE_KINDS[kind] is None:
        return None
    module, _, name = GATE_KINDS[kind].partition(":")
    return getattr(importlib.import_module(module), name)


def make_gate(kind: str | None, d_model: int, gate_bias: float = 0.0, fused: bool = False) -> SublayerGate | None:
    """The gate module for one sublayer, or None for `none` / None (then no parameters exist)."""
    cls = None if kind is None else gate_class(kind)
    return None if cls is None else cls(kind, d_model, gate_bias, fused)


def combine(gate: SublayerGate | None, x: torch.Tensor, sub: torch.Tensor) -> torch.Tensor:
    """Pre-LayerNorm sum of a sublayer: plain residual x + sub when ungated."""
    return x + sub if gate is None else gate(x, sub)


def matched_d_ff(gated: nn.Module, d_ff: int) -> int:
    """The FFN width (`d_ff`) at which the ungated model has the parameter count of `gated`, the same model built at
    width `d_ff` with gates (the parameter-matched baseline of the gate zoo). The count is linear in d_ff: one more
    FFN unit adds a row of W1, its bias and a column of W2 to every `layers.FeedForward`, so the width grows by the
    gates' parameters over that, rounded to the nearest unit. Works on a model built on the meta device."""
    from highway_repro.models.layers import FeedForward

    gate_params = sum(p.numel() for m in gated.modules() if isinstance(m, SublayerGate) for p in m.parameters())
    per_unit = 0
    for ffn in (m for m in gated.modules() if isinstance(m, FeedForward)):
        w1, w2 = (m for m in ffn.modules() if isinstance(m, nn.Linear))
        per_unit += w1.in_features + (w1.bias is not None) + w2.out_features
    if not per_unit:
        raise error("model._target_", type(gated).__name__, "a model with FFN sublayers (layers.FeedForward)",
                    "has no FFN to widen for match_params")
    return d_ff + round(gate_params / per_unit)
