"""Transformer-L3: a decoder-only causal Transformer LM with Highway Transformer gates.

Highway Transformer: Self-Gating Enhanced Self-Attentive Networks (Chai et al.,
ACL 2020, arXiv 2004.08178), char-PTB "Transformer-L3" (REFERENCE.md B1). The
self-dependency unit (SDU) sits in parallel with each sublayer, before the
post-LayerNorm (paper, REFERENCE.md B):

    U = LN(combine(attn_gate, X, Att(X)))     e.g. sdu: LN(X + Att(X) + psi(X W1 + b1) * (X W2 + b2))
    O = LN(combine(ffn_gate,  U, FFN(U)))

The gate input is the sublayer input X / U (the residual stream, not normalised).
With `norm='pre'` a block is `x = combine(gate, x, Att(LN(x)))`, then
`x = combine(gate, x, FFN(LN(x)))`, and a final LN follows the last block; the
gate again sees the un-normalised residual stream x (same convention as gates.py).
Gate kinds, placement and the convention T = transform gate, C = 1 - T: `gates.py`.

Choices:
- Embeddings are scaled by sqrt(d_model) (Vaswani et al. 2017 Sec. 3.4, Transformer-XL),
  so with the N(0, 0.02) init the token signal is not swamped by the +-1 sinusoids;
  dropout `emb_dropout` (default: `dropout`) on emb * sqrt(d) + pos.
- Tied input/output embeddings (`tie_embeddings`), logits = h E^T + b (bias of size V).
- Init as Transformer-XL: weights N(0, 0.02), biases 0, LayerNorm (1, 0).

Parameters (d = d_model, f = d_ff, V = vocab, L = n_layers), ungated, tied:
    V*d + V  +  L * (4d^2 + 4d  +  2df + f + d  +  2 * 2d)   [+ 2d final LN if pre] [+ max_len*d if learned]
each gated sublayer adds 2d^2 + 2d. `bias=False` (nanoGPT / x-transformers style) drops the biases of
the attention, FFN, LayerNorm and output layers (gates keep theirs): V*d + L * (4d^2 + 2df + 2d) [+ d].
"""

from __future__ import annotations

import math

import torch
from torch import nn

from highway_repro.models import gates
from highway_repro.models.layers import (CausalSelfAttention, FeedForward, check_choice, check_heads,
                                          check_positive_int, check_probability, sinusoidal_positions)

NORMS = ("post", "pre")
POSITIONS = ("sinusoidal", "learned", "none")


class Block(nn.Module):
    """One transformer block: attention and FFN sublayers, each with an optional gate."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float, attn_dropout: float,
                 norm: str, placement: dict, gate_bias: float, bias: bool = True):
        super().__init__()
        self.norm = norm
        self.attn = CausalSelfAttention(d_model, n_heads, dropout, attn_dropout, bias=bias)
        self.ffn = FeedForward(d_model, d_ff, dropout, bias=bias)
        self.ln1 = nn.LayerNorm(d_model, bias=bias)
        self.ln2 = nn.LayerNorm(d_model, bias=bias)
        self.attn_gate = gates.make_gate(placement["attn"], d_model, gate_bias)  # None: no parameters
        self.ffn_gate = gates.make_gate(placement["ffn"], d_model, gate_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, C)
        if self.norm == "post":
            x = self.ln1(gates.combine(self.attn_gate, x, self.attn(x)))  # U, (B, T, C)
            return self.ln2(gates.combine(self.ffn_gate, x, self.ffn(x)))  # O, (B, T, C)
        x = gates.combine(self.attn_gate, x, self.attn(self.ln1(x)))  # (B, T, C)
        return gates.combine(self.ffn_gate, x, self.ffn(self.ln2(x)))  # (B, T, C)


class TransformerLM(nn.Module):
    """Causal Transformer LM; `forward(tokens (B, T), mems=None) -> (logits (B, T, V), None)`."""

    def __init__(self, vocab_size: int, n_layers: int = 3, d_model: int = 512, n_heads: int = 8,
                 d_ff: int = 2048, dropout: float = 0.1, attn_dropout: float = 0.0,
                 emb_dropout: float | None = None, norm: str = "post", pos: str = "sinusoidal",
                 max_len: int | None = None, tie_embeddings: bool = True,
                 gate_kind="none", gate_layers="all", gate_sublayers="both", gate_bias: float = 0.0,
                 bias: bool = True):
        super().__init__()
        owner = type(self).__name__
        check_positive_int(owner, "vocab_size", vocab_size)
        check_positive_int(owner, "n_layers", n_layers)
        check_heads(owner, d_model, n_heads)
        check_positive_int(owner, "d_ff", d_ff)
        check_choice(owner, "norm", norm, NORMS)
        check_choice(owner, "pos", pos, POSITIONS)
        emb_dropout = dropout if emb_dropout is None else emb_dropout
        for field, p in (("dropout", dropout), ("attn_dropout", attn_dropout), ("emb_dropout", emb_dropout)):
            check_probability(owner, field, p)
        if pos == "sinusoidal" and d_model % 2:
            raise ValueError(f"{owner} d_model={d_model} must be even for pos='sinusoidal'")
        if pos == "learned":
            if max_len is None:
                raise ValueError(f"{owner} pos='learned' needs max_len (the number of learned positions)")
            check_positive_int(owner, "max_len", max_len)
        self.d_model, self.norm, self.pos, self.max_len = d_model, norm, pos, max_len
        self.placement = gates.resolve_placement(n_layers, gate_kind, gate_layers, gate_sublayers)

        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_len, d_model) if pos == "learned" else None
        self.drop = nn.Dropout(emb_dropout)
        self.blocks = nn.ModuleList(
            Block(d_model, n_heads, d_ff, dropout, attn_dropout, norm, p, gate_bias, bias) for p in self.placement)
        self.ln_f = nn.LayerNorm(d_model, bias=bias) if norm == "pre" else None
        self.head = nn.Linear(d_model, vocab_size, bias=bias)
        nn.init.normal_(self.tok_emb.weight, 0.0, 0.02)
        if self.pos_emb is not None:
            nn.init.normal_(self.pos_emb.weight, 0.0, 0.02)
        nn.init.normal_(self.head.weight, 0.0, 0.02)
        if self.head.bias is not None:
            nn.init.zeros_(self.head.bias)
        if tie_embeddings:
            self.head.weight = self.tok_emb.weight  # (V, d), shared

    def forward(self, tokens: torch.Tensor, mems=None):
        if mems is not None:
            raise ValueError(f"{type(self).__name__} has no memory; mems must be None")
        B, T = tokens.shape
        x = self.tok_emb(tokens) * math.sqrt(self.d_model)  # (B, T, C)
        if self.pos == "sinusoidal":
            x = x + sinusoidal_positions(torch.arange(T, device=tokens.device), self.d_model).to(x.dtype)
        elif self.pos == "learned":
            if T > self.max_len:
                raise ValueError(f"sequence length T={T} exceeds max_len={self.max_len} of pos='learned'")
            x = x + self.pos_emb(torch.arange(T, device=tokens.device))  # (T, C) broadcast
        x = self.drop(x)  # (B, T, C)
        for block in self.blocks:
            x = block(x)  # (B, T, C)
        if self.ln_f is not None:
            x = self.ln_f(x)
        return self.head(x), None  # (B, T, V)

    def extra_repr(self) -> str:
        return f"norm={self.norm}, pos={self.pos}, gates: {gates.describe_placement(self.placement)}"
