"""The transformer toolkit: the parts the three transformers share.

`transformer_lm` (Transformer-L3), `r_transformer` and `transformer_xl` of the Highway Transformer
reproduction (Chai et al., ACL 2020, arXiv 2004.08178) are built from these parts; the layers follow
Vaswani et al. 2017 ("Attention Is All You Need", arXiv 1706.03762) and Dai et al. 2019 (Transformer-XL,
arXiv 1901.02860).

- positions: `sinusoidal_positions` (absolute or relative), `rel_shift` (Transformer-XL's alignment of
  relative scores), `causal_mask`;
- sublayers: `CausalSelfAttention`, `FeedForward` (every sublayer applies its own residual dropout to its
  output, so a layer only writes `gates.combine(gate, x, sublayer(x))`);
- init helpers: `normal_init_`, `normal_linear`, `init_layer_norm_`.

Options are checked by the model constructors (`highway_repro.options.check_model`); the parts trust their
arguments. Nothing here has a fixed maximum length: masks and positions are built per call, on the input's
device.

One naming scheme across the models: a model's list of layers is `layers`, a layer's sublayers are `attn`
and `ffn` with their gates `attn_gate` / `ffn_gate` and layer norms `ln_attn` / `ln_ffn`, the norm after the
last layer is `ln_final`, the FFN width is `d_ff`.

Parameter counts (d = d_model, f = d_ff), used by the tests:
    CausalSelfAttention  4*d*d + 4*d       (fused q/k/v d -> 3d, output d -> d; bias=False: 4*d*d)
    FeedForward          2*d*f + f + d     (bias=False: 2*d*f)
    nn.LayerNorm         2*d
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from highway_repro.models.dropout import Dropout, dropout, grouped
from highway_repro.options import error

# ----------------------------------------------------------------------------- init


def normal_init_(module: nn.Module, std: float | None) -> None:
    """Every Linear of `module`: weight N(0, std), bias 0; std=None keeps PyTorch's default."""
    if std is None:
        return
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def normal_linear(d_in: int, d_out: int, bias: bool = True, std: float = 0.02) -> nn.Linear:
    """nn.Linear initialised as soon as it is made: weight N(0, std), bias 0 (Transformer-XL's order)."""
    m = nn.Linear(d_in, d_out, bias=bias)
    normal_init_(m, std)
    return m


def init_layer_norm_(m: nn.LayerNorm, std: float = 0.02) -> nn.LayerNorm:
    """LayerNorm weight N(1, std), bias 0: the official Transformer-XL `weights_init`."""
    nn.init.normal_(m.weight, 1.0, std)
    nn.init.zeros_(m.bias)
    return m


# ----------------------------------------------------------------------------- positions


def sinusoidal_positions(positions: torch.Tensor, d_model: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Sinusoidal encoding (Vaswani et al. 2017, Sec. 3.5) of `positions` (T,) -> (T, d_model), in `dtype` (the
    model's: a float64 model gets a float64 table; a half-precision one a table computed in float32, then cast).

    Layout [sin | cos] (the Transformer-XL layout), frequencies 1 / 10000^(2i / d_model).
    Positions may be any values (e.g. descending relative distances)."""
    if d_model % 2:
        raise error("model.d_model", d_model, "an even integer", "is not allowed with sinusoidal positions")
    work = torch.promote_types(dtype, torch.float32)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d_model, 2, device=positions.device, dtype=work)
                                / d_model))  # (d/2,)
    angles = positions.to(work).unsqueeze(1) * inv_freq.unsqueeze(0)  # (T, d/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1).to(dtype)  # (T, d)


def rel_shift(x: torch.Tensor) -> torch.Tensor:
    """Align relative scores: (..., Q, K) indexed by (query i, distance row k) -> (query i, key j).

    Row k of the input holds distance K-1-k (positions embedded from K-1 down to 0). For
    query i (absolute key index M+i, M = K-Q) and key j, the output holds the input at
    k = Q-1-i+j, i.e. distance M+i-j. Valid for j <= M+i (the causal part); the rest is
    garbage that the causal mask removes. Pad-and-reshape trick of the official Transformer-XL code.
    """
    *lead, q, k = x.shape
    x = F.pad(x, (1, 0))  # (..., Q, K+1), zero column in front
    x = x.reshape(*lead, k + 1, q)[..., 1:, :]  # (..., K, Q)
    return x.reshape(*lead, q, k)


def causal_mask(t_q: int, t_k: int | None = None, device=None) -> torch.Tensor:
    """Boolean mask (t_q, t_k), True = may attend. Query i sits at key position i + (t_k - t_q),
    so with t_k > t_q (keys = memory + current segment) every query also sees the whole memory."""
    t_k = t_q if t_k is None else t_k
    q = torch.arange(t_q, device=device).unsqueeze(1) + (t_k - t_q)  # (t_q, 1)
    k = torch.arange(t_k, device=device).unsqueeze(0)  # (1, t_k)
    return k <= q  # (t_q, t_k)


# ----------------------------------------------------------------------------- sublayers


class CausalSelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention with a causal mask built per call.

    `forward(x (B, T, d), attn_mask=None) -> (B, T, d)`. Without `attn_mask` the
    mask is causal (`is_causal=True`); otherwise `attn_mask` is a boolean
    (T, T) or (B, H, T, T) mask, True = may attend. Dropout `attn_dropout` on the
    attention probabilities, `dropout` on the output (residual dropout).
    Init: weights N(0, init_std), biases 0 (init_std=None: PyTorch's default).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, attn_dropout: float = 0.0,
                 init_std: float | None = 0.02, bias: bool = True):
        super().__init__()
        self.n_heads = n_heads
        self.attn_dropout = float(attn_dropout)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)  # fused [W_q | W_k | W_v]
        self.out = nn.Linear(d_model, d_model, bias=bias)
        self.drop = Dropout(dropout)
        normal_init_(self, init_std)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)  # (B, T, C) each
        q, k, v = (z.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for z in (q, k, v))  # (B, H, T, hd)
        if grouped():  # a group's stacked forward: the formula written out (no per-member rule for SDPA)
            score = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(C // self.n_heads)  # (B, H, T, T)
            allowed = causal_mask(T, T, x.device) if attn_mask is None else attn_mask
            prob = dropout(torch.softmax(score.masked_fill(~allowed, float("-inf")), dim=-1), self.attn_dropout,
                           self.training)  # SDPA's own dropout draws this mask too (CPU)
            y = torch.matmul(prob, v)  # (B, H, T, hd)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None,
                dropout_p=self.attn_dropout if self.training else 0.0)  # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return self.drop(self.out(y))  # (B, T, C)


class FeedForward(nn.Module):
    """Position-wise FFN: Dropout(W2 Dropout(ReLU(W1 x + b1)) + b2), (B, T, d) -> (B, T, d).

    Init: weights N(0, init_std), biases 0 (init_std=None: PyTorch's default). `init_each=True` initialises
    each Linear as soon as it is made (`normal_linear`, the official Transformer-XL order), else both after
    they are made; the random stream, so the initial weights, depend on that order.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, init_std: float | None = 0.02,
                 bias: bool = True, init_each: bool = False):
        super().__init__()
        def linear(d_in: int, d_out: int) -> nn.Linear:
            return normal_linear(d_in, d_out, bias, init_std) if init_each else nn.Linear(d_in, d_out, bias=bias)

        w1 = linear(d_model, d_ff)
        w2 = linear(d_ff, d_model)
        # not an inplace ReLU: on the view a 3-d linear returns, autograd would keep two (B, T, d_ff) copies
        self.net = nn.Sequential(w1, nn.ReLU(), Dropout(dropout),  # (B, T, d_ff)
                                 w2, Dropout(dropout))  # (B, T, d)
        if not init_each:
            normal_init_(self, init_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
