"""Transformer-L3: a decoder-only causal Transformer LM with Highway Transformer gates.

Highway Transformer: Self-Gating Enhanced Self-Attentive Networks (Chai et al.,
ACL 2020, arXiv 2004.08178), char-PTB "Transformer-L3" (REFERENCE.md B1). The
self-dependency unit (SDU) sits in parallel with each sublayer, before the
post-LayerNorm (paper, REFERENCE.md B):

    U = LN(combine(attn_gate, X, Att(X)))     e.g. sdu: LN(X + Att(X) + psi(X W1 + b1) * (X W2 + b2))
    O = LN(combine(ffn_gate,  U, FFN(U)))

The gate input is the sublayer input X / U (the residual stream, not normalised).
With `norm_position='pre'` a layer is `x = combine(gate, x, Att(LN(x)))`, then
`x = combine(gate, x, FFN(LN(x)))`, and a final LN follows the last layer; the
gate again sees the un-normalised residual stream x (same convention as gates.py).
Gate kinds, placement and the convention T = transform gate, C = 1 - T: `gates.py`.
`fused=True` computes the gates with the kernels of `kernels.py` (same numbers, fewer memory passes);
the code below is the plain formula either way.

Choices:
- Embeddings are scaled by sqrt(d_model) (Vaswani et al. 2017 Sec. 3.4, Transformer-XL),
  so with the N(0, 0.02) init the token signal is not swamped by the +-1 sinusoids;
  dropout `emb_dropout` (default: `dropout`) on emb * sqrt(d) + pos.
- Tied input/output embeddings (`tie_embeddings`), logits = h E^T + b (bias of size V).
- Init as Transformer-XL: weights N(0, 0.02), biases 0, LayerNorm (1, 0).

Names (shared by the three transformers, see `layers.py`): `layers` (the list of `Layer`), per layer
`attn`, `ffn`, `ln_attn`, `ln_ffn`, `attn_gate`, `ffn_gate`; `ln_final` after the last layer (pre-LN).

Parameters (d = d_model, f = d_ff, V = vocab, L = n_layers), ungated, tied:
    V*d + V  +  L * (4d^2 + 4d  +  2df + f + d  +  2 * 2d)   [+ 2d final LN if pre] [+ max_len*d if learned]
each gated sublayer adds 2d^2 + 2d. `bias=False` (nanoGPT / x-transformers style) drops the biases of
the attention, FFN, LayerNorm and output layers (gates keep theirs): V*d + L * (4d^2 + 2df + 2d) [+ d].
"""

from __future__ import annotations

import math

import torch
from torch import nn

from highway_repro import options
from highway_repro.models import gates
from highway_repro.models.dropout import Dropout
from highway_repro.models.layers import CausalSelfAttention, FeedForward, sinusoidal_positions


class Layer(nn.Module):
    """One transformer layer: attention and FFN sublayers, each with an optional gate."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float, attn_dropout: float,
                 norm_position: str, placement: dict, gate_bias: float, bias: bool = True, fused: bool = False):
        super().__init__()
        self.norm_position = norm_position
        self.attn = CausalSelfAttention(d_model, n_heads, dropout, attn_dropout, bias=bias)
        self.ffn = FeedForward(d_model, d_ff, dropout, bias=bias)
        self.ln_attn = nn.LayerNorm(d_model, bias=bias)
        self.ln_ffn = nn.LayerNorm(d_model, bias=bias)
        self.attn_gate = gates.make_gate(placement["attn"], d_model, gate_bias, fused)  # None: no parameters
        self.ffn_gate = gates.make_gate(placement["ffn"], d_model, gate_bias, fused)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, C)
        if self.norm_position == "post":
            x = self.ln_attn(gates.combine(self.attn_gate, x, self.attn(x)))  # U, (B, T, C)
            return self.ln_ffn(gates.combine(self.ffn_gate, x, self.ffn(x)))  # O, (B, T, C)
        x = gates.combine(self.attn_gate, x, self.attn(self.ln_attn(x)))  # (B, T, C)
        return gates.combine(self.ffn_gate, x, self.ffn(self.ln_ffn(x)))  # (B, T, C)


class TransformerLM(nn.Module):
    """Causal Transformer LM; `forward(tokens (B, T), mems=None) -> (logits (B, T, V), None)`.

    Options and their valid values: `options.MODELS["TransformerLM"]`.
    """

    def __init__(self, vocab_size: int, n_layers: int = 3, d_model: int = 512, n_heads: int = 8,
                 d_ff: int = 2048, dropout: float = 0.1, attn_dropout: float = 0.0,
                 emb_dropout: float | None = None, norm_position: str = "post", pos: str = "sinusoidal",
                 max_len: int | None = None, tie_embeddings: bool = True,
                 gate_kind="none", gate_layers="all", gate_sublayers="both", gate_bias: float = 0.0,
                 bias: bool = True, fused: bool = False):
        options.check_model("TransformerLM", locals())
        super().__init__()
        emb_dropout = dropout if emb_dropout is None else emb_dropout
        self.d_model, self.norm_position, self.pos, self.max_len = d_model, norm_position, pos, max_len
        self.placement = gates.resolve_placement(n_layers, gate_kind, gate_layers, gate_sublayers)

        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_len, d_model) if pos == "learned" else None
        self.drop = Dropout(emb_dropout)
        self.layers = nn.ModuleList(
            Layer(d_model, n_heads, d_ff, dropout, attn_dropout, norm_position, p, gate_bias, bias, fused)
            for p in self.placement)
        self.ln_final = nn.LayerNorm(d_model, bias=bias) if norm_position == "pre" else None
        self.head = nn.Linear(d_model, vocab_size, bias=bias)
        nn.init.normal_(self.tok_emb.weight, 0.0, 0.02)
        if self.pos_emb is not None:
            nn.init.normal_(self.pos_emb.weight, 0.0, 0.02)
        nn.init.normal_(self.head.weight, 0.0, 0.02)
        if self.head.bias is not None:
            nn.init.zeros_(self.head.bias)
        if tie_embeddings:
            self.head.weight = self.tok_emb.weight  # (V, d), shared

    def forward(self, tokens: torch.Tensor, mems=None, score_len: int | None = None):
        """tokens (B, T) -> logits (B, S, V), None; S = score_len (the last positions, the only ones the
        head runs on: on word-level vocabularies the head is most of the step) or T when None."""
        if mems is not None:
            raise ValueError(f"{type(self).__name__} has no memory; mems must be None")
        B, T = tokens.shape
        x = self.tok_emb(tokens) * math.sqrt(self.d_model)  # (B, T, C)
        if self.pos == "sinusoidal":
            x = x + sinusoidal_positions(torch.arange(T, device=tokens.device), self.d_model, x.dtype)
        elif self.pos == "learned":
            if T > self.max_len:
                raise ValueError(f"sequence length T={T} exceeds max_len={self.max_len} of pos='learned'")
            x = x + self.pos_emb(torch.arange(T, device=tokens.device))  # (T, C) broadcast
        x = self.drop(x)  # (B, T, C)
        for layer in self.layers:
            x = layer(x)  # (B, T, C)
        if score_len is not None:
            x = x[:, T - score_len:]  # (B, S, C)
        if self.ln_final is not None:
            x = self.ln_final(x)
        return self.head(x), None  # (B, S, V)

    def extra_repr(self) -> str:
        return f"norm_position={self.norm_position}, pos={self.pos}, gates: {gates.describe_placement(self.placement)}"
