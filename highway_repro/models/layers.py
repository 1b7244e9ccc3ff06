"""Shared transformer pieces: causal multi-head attention, position-wise FFN, sinusoidal positions.

Used by `transformer_lm` (Transformer-L3) and `r_transformer` of the Highway
Transformer reproduction (Chai et al., ACL 2020, arXiv 2004.08178); the blocks
themselves follow Vaswani et al. 2017 ("Attention Is All You Need", arXiv 1706.03762).

Every sublayer applies its own residual dropout to its output, so a block only
has to write `combine(gate, x, sublayer(x))` (see `gates.py`). Nothing here has a
fixed maximum length: masks and positions are built per call, on the input's device.

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


def check_choice(owner: str, field: str, value, valid) -> None:
    """Raise `owner field='value' is not known (valid: a, b)` unless value is one of `valid`."""
    if value not in valid:
        raise ValueError(f"{owner} {field}={value!r} is not known (valid: {', '.join(map(repr, valid))})")


def check_positive_int(owner: str, field: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner} {field}={value!r} must be a positive integer")


def check_probability(owner: str, field: str, value) -> None:
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{owner} {field}={value!r} must be a dropout probability in [0, 1)")


def check_heads(owner: str, d_model: int, n_heads: int) -> None:
    check_positive_int(owner, "d_model", d_model)
    check_positive_int(owner, "n_heads", n_heads)
    if d_model % n_heads:
        raise ValueError(f"{owner} n_heads={n_heads} does not divide d_model={d_model} "
                         f"(valid: a divisor of {d_model})")


def normal_init_(module: nn.Module, std: float | None) -> None:
    """Linear weights N(0, std) and zero biases (Transformer-XL init); std=None keeps PyTorch's default."""
    if std is None:
        return
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def causal_mask(t_q: int, t_k: int | None = None, device=None) -> torch.Tensor:
    """Boolean mask (t_q, t_k), True = may attend. Query i sits at key position i + (t_k - t_q),
    so with t_k > t_q (keys = memory + current segment) every query also sees the whole memory."""
    t_k = t_q if t_k is None else t_k
    q = torch.arange(t_q, device=device).unsqueeze(1) + (t_k - t_q)  # (t_q, 1)
    k = torch.arange(t_k, device=device).unsqueeze(0)  # (1, t_k)
    return k <= q  # (t_q, t_k)


class CausalSelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention with a causal mask built per call.

    `forward(x (B, T, d), attn_mask=None) -> (B, T, d)`. Without `attn_mask` the
    mask is causal (`is_causal=True`); otherwise `attn_mask` is a boolean
    (T, T) or (B, H, T, T) mask, True = may attend. Dropout `attn_dropout` on the
    attention probabilities, `dropout` on the output (residual dropout).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, attn_dropout: float = 0.0,
                 init_std: float | None = 0.02, bias: bool = True):
        super().__init__()
        check_heads(type(self).__name__, d_model, n_heads)
        check_probability(type(self).__name__, "dropout", dropout)
        check_probability(type(self).__name__, "attn_dropout", attn_dropout)
        self.n_heads = n_heads
        self.attn_dropout = float(attn_dropout)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)  # fused [W_q | W_k | W_v]
        self.out = nn.Linear(d_model, d_model, bias=bias)
        self.drop = nn.Dropout(dropout)
        normal_init_(self, init_std)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)  # (B, T, C) each
        q, k, v = (z.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for z in (q, k, v))  # (B, H, T, hd)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None,
            dropout_p=self.attn_dropout if self.training else 0.0)  # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return self.drop(self.out(y))  # (B, T, C)


class FeedForward(nn.Module):
    """Position-wise FFN: Dropout(W2 Dropout(ReLU(W1 x + b1)) + b2), (B, T, d) -> (B, T, d)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, init_std: float | None = 0.02,
                 bias: bool = True):
        super().__init__()
        check_positive_int(type(self).__name__, "d_ff", d_ff)
        check_probability(type(self).__name__, "dropout", dropout)
        self.net = nn.Sequential(
            nn.Linear(d_model, d_ff, bias=bias), nn.ReLU(), nn.Dropout(dropout),  # (B, T, d_ff)
            nn.Linear(d_ff, d_model, bias=bias), nn.Dropout(dropout),  # (B, T, d)
        )
        normal_init_(self, init_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def sinusoidal_positions(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """Sinusoidal encoding (Vaswani et al. 2017, Sec. 3.5) of float `positions` (T,) -> (T, d_model).

    Layout [sin | cos] (the Transformer-XL layout), frequencies 1 / 10000^(2i / d_model).
    Positions may be any values (e.g. descending relative distances)."""
    if d_model % 2:
        raise ValueError(f"sinusoidal positions need an even d_model, got d_model={d_model}")
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d_model, 2, device=positions.device, dtype=torch.float32)
                                / d_model))  # (d/2,)
    angles = positions.float().unsqueeze(1) * inv_freq.unsqueeze(0)  # (T, d/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)  # (T, d)
