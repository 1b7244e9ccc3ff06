"""R-Transformer LM (Wang et al. 2019, arXiv 1907.05572) with Highway Transformer gates.

The word-PTB "R-Transformer-L3" of Highway Transformer (Chai et al., ACL 2020,
arXiv 2004.08178; REFERENCE.md B1). Each layer is pre-LN, no positional encoding:

    x = x + Dropout(LocalRNN(LN(x)))              (`rnn_layers_per_block` times; never gated)
    x = combine(attn_gate, x, Att(LN(x)))         causal multi-head attention
    x = combine(ffn_gate,  x, FFN(LN(x)))

optionally followed by a final LayerNorm after the last layer (`final_norm`).

Conventions (`norm_impl`, `final_norm`): the official R-Transformer code (DSE-MSU/R-transformer), whose
runs gave the paper's R-Transformer numbers, normalises with its own LayerNorm,
a * (x - mean) / (std + 1e-6) + b with the UNBIASED std (`norm_impl='official'`, `OfficialLayerNorm`),
and has no final LayerNorm (`final_norm=False`); these are the defaults. `norm_impl='torch'` uses
nn.LayerNorm (biased variance, eps 1e-5 inside the square root) and `final_norm=True` adds the final norm
of a standard pre-LN stack (the behaviour of this code before the option existed; the loss at
initialisation moves by about 7e-3).

Where the gates sit: the SDU sits beside the attention and the FFN sublayer, the
paper's two gate points; the local-RNN sublayer stays ungated (it is the
R-Transformer's replacement for positional encoding, not a sublayer of the
Highway Transformer). The gate input is the un-normalised residual stream x, the
sublayer input, as in the post-LN formula `LN(X + Att(X) + SDU(X))` of the paper;
only the sublayer itself sees LN(x). Gate kinds / placement / T = transform gate,
C = 1 - T: see `gates.py`; `fused=True` computes the gates, the local RNN and the official LayerNorm with
`kernels.py`.

Local RNN: the output at position t is the last hidden state of an RNN run over
the `window` positions t-window+1..t (zero-padded before the start). It is
computed for all positions at once: left-pad by window-1, `unfold` into windows
(B*T, window, d), one batched nn.GRU / nn.LSTM call, keep the last step.
`fused=True` computes the same with `kernels.local_rnn` (each position's input
projection once instead of once per window holding it; same parameters).

Choices (as the official R-Transformer code): embeddings not scaled (no position
signal to balance), init N(0, 0.01); attention / FFN / RNN keep PyTorch's default
init; attention-probability dropout = `dropout` unless `attn_dropout` is given;
tied input/output embeddings with an output bias of size V.

Names (shared by the three transformers, see `layers.py`): `layers` (the list of `Layer`), per layer
`rnns` and their norms `ln_rnns`, `attn`, `ffn`, `ln_attn`, `ln_ffn`, `attn_gate`, `ffn_gate`; `ln_final`.

Parameters (d = d_model, f = d_ff, V = vocab, L = n_layers, R = rnn_layers_per_block,
g = 3 for GRU / 4 for LSTM), ungated, tied, either norm_impl:
    V*d + V  +  L * (R * (g*(2d^2 + 2d) + 2d)  +  4d^2 + 4d  +  2df + f + d  +  2 * 2d)   [+ 2d if final_norm]
each gated sublayer adds 2d^2 + 2d.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from highway_repro import options
from highway_repro.models import gates, kernels
from highway_repro.models.dropout import Dropout, grouped
from highway_repro.models.layers import CausalSelfAttention, FeedForward

RNNS = {"gru": nn.GRU, "lstm": nn.LSTM}  # the names: options.RNNS


class OfficialLayerNorm(nn.Module):
    """LayerNorm of the official R-Transformer code: weight * (x - mean) / (std + eps) + bias over the last
    dimension, std the UNBIASED standard deviation (divides by d - 1), eps added to the std (nn.LayerNorm:
    biased variance, eps inside the square root). Parameters as nn.LayerNorm: weight 1, bias 0 (2d)."""

    def __init__(self, d_model: int, eps: float = 1e-6, fused: bool = False):
        super().__init__()
        self.eps, self.fused = eps, fused
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return kernels.official_layer_norm(x, self.weight, self.bias, self.eps)  # same numbers, ~4x faster
        mean = x.mean(-1, keepdim=True)  # (B, T, 1)
        std = x.std(-1, keepdim=True)  # (B, T, 1), unbiased
        return self.weight * (x - mean) / (std + self.eps) + self.bias

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, unbiased std"


def make_norm(norm_impl: str, d_model: int, fused: bool) -> nn.Module:
    """The LayerNorm of `norm_impl` (`options.NORM_IMPLS`): 'official' (`OfficialLayerNorm`; `fused` only changes
    how it computes) or 'torch' (nn.LayerNorm)."""
    return OfficialLayerNorm(d_model, fused=fused) if norm_impl == "official" else nn.LayerNorm(d_model)


class LocalRNN(nn.Module):
    """RNN over the `window` positions ending at each t; (B, T, d) -> (B, T, d), no loop over t."""

    def __init__(self, d_model: int, rnn: str = "gru", window: int = 9, fused: bool = False):
        super().__init__()
        self.window, self.fused = window, fused
        self.rnn = RNNS[rnn](d_model, d_model, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return kernels.local_rnn(x, self.rnn, self.window)  # same numbers, ~window x less input projection
        if grouped():
            return self._written_out(x)
        B, T, C = x.shape
        k = self.window
        x = F.pad(x, (0, 0, k - 1, 0))  # (B, T+k-1, C), zeros before the start
        w = x.unfold(1, k, 1)  # (B, T, C, k): w[b, t, :, j] = x_padded[b, t + j]
        w = w.permute(0, 1, 3, 2).reshape(B * T, k, C)  # (B*T, k, C)
        out, _ = self.rnn(w)  # (B*T, k, C)
        return out[:, -1].reshape(B, T, C)  # last hidden state of each window, (B, T, C)


    def _written_out(self, x: torch.Tensor) -> torch.Tensor:
        """The same windows with the recurrence written out (torch's RNN has no per-member rule in a group's stacked
        forward): each position's input projection once, then `window` steps over all positions. (B, T, C)."""
        B, T, C = x.shape
        k, rnn = self.window, self.rnn
        proj = F.linear(F.pad(x, (0, 0, k - 1, 0)), rnn.weight_ih_l0, rnn.bias_ih_l0)  # (B, T+k-1, gates*C)
        h, c = x.new_zeros(B, T, C), x.new_zeros(B, T, C)
        for j in range(k):  # step j of every window: input position t + j of the padded sequence
            g, hh = proj[:, j:j + T], F.linear(h, rnn.weight_hh_l0, rnn.bias_hh_l0)  # (B, T, gates*C) each
            if isinstance(rnn, nn.LSTM):  # gates i, f, g, o
                i, f, cand, o = (g + hh).chunk(4, dim=-1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(cand)
                h = torch.sigmoid(o) * torch.tanh(c)
            else:  # GRU: gates r, z, n
                (ir, iz, i_n), (hr, hz, h_n) = g.chunk(3, dim=-1), hh.chunk(3, dim=-1)
                r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
                h = (1 - z) * torch.tanh(i_n + r * h_n) + z * h
        return h


class Layer(nn.Module):
    """Pre-LN R-Transformer layer: local RNN(s) -> attention -> FFN; gates beside attention / FFN."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, rnn: str, window: int, rnn_layers: int,
                 dropout: float, attn_dropout: float, placement: dict, gate_bias: float,
                 norm_impl: str = "official", fused: bool = False):
        super().__init__()
        self.rnns = nn.ModuleList(LocalRNN(d_model, rnn, window, fused) for _ in range(rnn_layers))
        self.ln_rnns = nn.ModuleList(make_norm(norm_impl, d_model, fused) for _ in range(rnn_layers))
        self.drop = Dropout(dropout)
        self.attn = CausalSelfAttention(d_model, n_heads, dropout, attn_dropout, init_std=None)
        self.ffn = FeedForward(d_model, d_ff, dropout, init_std=None)
        self.ln_attn = make_norm(norm_impl, d_model, fused)
        self.ln_ffn = make_norm(norm_impl, d_model, fused)
        self.attn_gate = gates.make_gate(placement["attn"], d_model, gate_bias, fused)  # None: no parameters
        self.ffn_gate = gates.make_gate(placement["ffn"], d_model, gate_bias, fused)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, C)
        for ln, rnn in zip(self.ln_rnns, self.rnns):
            x = x + self.drop(rnn(ln(x)))  # (B, T, C)
        x = gates.combine(self.attn_gate, x, self.attn(self.ln_attn(x)))  # (B, T, C)
        return gates.combine(self.ffn_gate, x, self.ffn(self.ln_ffn(x)))  # (B, T, C)


class RTransformer(nn.Module):
    """R-Transformer LM; `forward(tokens (B, T), mems=None) -> (logits (B, T, V), None)`.

    Options and their valid values: `options.MODELS["RTransformer"]`.
    """

    def __init__(self, vocab_size: int, n_layers: int = 3, d_model: int = 128, n_heads: int = 8,
                 d_ff: int = 512, rnn: str = "gru", window: int = 9, rnn_layers_per_block: int = 1,
                 dropout: float = 0.35, emb_dropout: float = 0.15, tie_embeddings: bool = True,
                 gate_kind="none", gate_layers="all", gate_sublayers="both", gate_bias: float = 0.0,
                 attn_dropout: float | None = None, norm_impl: str = "official", final_norm: bool = False,
                 fused: bool = False):
        options.check_model("RTransformer", locals())
        super().__init__()
        attn_dropout = dropout if attn_dropout is None else attn_dropout
        self.norm_impl = norm_impl
        self.placement = gates.resolve_placement(n_layers, gate_kind, gate_layers, gate_sublayers)

        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.drop = Dropout(emb_dropout)
        self.layers = nn.ModuleList(
            Layer(d_model, n_heads, d_ff, rnn, window, rnn_layers_per_block, dropout, attn_dropout, p,
                  gate_bias, norm_impl, fused)
            for p in self.placement)
        self.ln_final = make_norm(norm_impl, d_model, fused) if final_norm else None
        self.head = nn.Linear(d_model, vocab_size)
        nn.init.normal_(self.tok_emb.weight, 0.0, 0.01)
        nn.init.normal_(self.head.weight, 0.0, 0.01)
        nn.init.zeros_(self.head.bias)
        if tie_embeddings:
            self.head.weight = self.tok_emb.weight  # (V, d), shared

    def forward(self, tokens: torch.Tensor, mems=None, score_len: int | None = None):
        """tokens (B, T) -> logits (B, S, V), None; S = score_len (the last positions, the only ones the
        head runs on) or T when None."""
        if mems is not None:
            raise ValueError(f"{type(self).__name__} has no memory; mems must be None")
        x = self.drop(self.tok_emb(tokens))  # (B, T, C)
        for layer in self.layers:
            x = layer(x)  # (B, T, C)
        if score_len is not None:
            x = x[:, x.shape[1] - score_len:]  # (B, S, C)
        if self.ln_final is not None:
            x = self.ln_final(x)
        return self.head(x), None  # (B, S, V)

    def extra_repr(self) -> str:
        return f"norm_impl={self.norm_impl}, gates: {gates.describe_placement(self.placement)}"
