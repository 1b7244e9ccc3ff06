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

import torch
from torch import nn

# placement parsing is pure Python (config validation uses it before torch is imported)
from highway_repro.models.placement import (GATE_KINDS, SUBLAYERS, _parse_layers, _parse_sublayers,  # noqa: F401
                                            describe_placement, resolve_placement)
from highway_repro.models.probe import GateAct
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

    fused = True  # False: the plain formula below, one autograd node per operation (reference)

    def forward(self, x: torch.Tensor, sub: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return _FusedGate.apply(self.proj(x), x, sub, self.act, self.kind)
        z1, f = self.proj(x).chunk(2, dim=-1)  # (B, T, d) each
        t = self.act(z1)  # transform gate T, (B, T, d)
        if self.kind == "highway":
            return x + sub + t * (f - x)  # (1-T)*x + sub + T*f
        if self.kind == "gated_attn":
            return x + sub + t * (f - sub)  # x + (1-T)*sub + T*f
        return x + sub + t * f  # SDU

    def extra_repr(self) -> str:
        return f"kind={self.kind}"


_ACT_GRAD = {"sigmoid": torch.ops.aten.sigmoid_backward, "tanh": torch.ops.aten.tanh_backward}


class _FusedGate(torch.autograd.Function):
    """The pre-LayerNorm sum of a gate from h = proj(x) = [z1 | f] (B, T, 2d), x and sub, in few memory passes.

    Forward: T = psi(z1) through the GateAct module (so recorders see it), then
    out = x + sub + T * v with v = f (SDU), f - x (highway), f - sub (gated_attn), as
    one add and one in-place addcmul. Backward writes [psi'(T) * g * v | g * T] straight
    into one (B, T, 2d) gradient of h (no concatenation), and dx / dsub reuse g.
    Same values and gradients as the plain formula (tests/test_gates.py), about half
    the elementwise passes and allocations.
    """

    @staticmethod
    def forward(ctx, h, x, sub, act, kind):
        d = x.shape[-1]
        z1, f = h[..., :d], h[..., d:]
        t = act(z1.detach())  # (B, T, d), the gate value (detached: module hooks see a plain tensor)
        v = f - x if kind == "highway" else f - sub if kind == "gated_attn" else f
        out = torch.add(x, sub)
        out.addcmul_(t, v)  # x + sub + T * v
        ctx.save_for_backward(t, v)
        ctx.kind, ctx.fn, ctx.dtypes = kind, act.fn_name, (h.dtype, x.dtype, sub.dtype)
        return out

    @staticmethod
    def backward(ctx, g):
        t, v = ctx.saved_tensors
        h_dtype, x_dtype, sub_dtype = ctx.dtypes
        d = t.shape[-1]
        dh = g.new_empty((*g.shape[:-1], 2 * d), dtype=h_dtype)
        df = torch.mul(g, t, out=dh[..., d:])  # d out / d f = T
        _ACT_GRAD[ctx.fn](g * v, t, grad_input=dh[..., :d])  # d out / d z1 = psi'(z1) * v
        dx = dsub = g
        if ctx.kind == "highway":
            dx = g - df  # (1 - T) * g
        elif ctx.kind == "gated_attn":
            dsub = g - df
        return dh, dx.to(x_dtype), dsub.to(sub_dtype), None, None


def make_gate(kind: str | None, d_model: int, gate_bias: float = 0.0) -> SublayerGate | None:
    """The gate module for one sublayer, or None for `none` (then no parameters exist)."""
    if kind is None or kind == "none":
        return None
    return SublayerGate(kind, d_model, gate_bias)


def combine(gate: SublayerGate | None, x: torch.Tensor, sub: torch.Tensor) -> torch.Tensor:
    """Pre-LayerNorm sum of a sublayer: plain residual x + sub when ungated."""
    return x + sub if gate is None else gate(x, sub)
