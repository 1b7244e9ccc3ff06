"""Transformer-XL language model (Dai et al. 2019, arXiv 1901.02860) with the self-gating
units of the Highway Transformer (Chai et al., ACL 2020, arXiv 2004.08178).

This is the model of the paper's enwik8 experiments (REFERENCE.md B1): segment-level
recurrence and relative positional attention as in the official PyTorch Transformer-XL
(`RelPartialLearnableMultiHeadAttn`, `MemTransformerLM`), one word-level tied softmax
(no adaptive softmax: the byte vocabulary has ~204 symbols).

Layer (post-LN, as in the paper's runs; X is the current segment only, never the memory):

    U = LN(combine(attn_gate, X, RelAttn(X, mem)))
    O = LN(combine(ffn_gate,  U, FFN(U)))

pre-LN (`norm_position='pre'`): U = combine(attn_gate, X, RelAttn(LN([mem; X])));
O = combine(ffn_gate, U, FFN(LN(U))), plus one final LayerNorm after the last layer
(the official pre-LN option has none; standard pre-LN practice adds it).
`combine` and the gate kinds are those of `highway_repro.models.gates`: T is the
transform gate, C = 1 - T the carry gate, `gate_bias` shifts the gate's pre-activation
(negative = carry by default). An ungated sublayer has no gate parameters.

`fused=True` runs the gates and the relative attention through `kernels.py` (same numbers, fewer
memory passes; the configs turn it on); the code below is the plain formula either way. `flex_attention=True`
runs the relative attention through FlexAttention instead (`kernels.rel_attention_flex`: AC as flex's product, BD
as a score modifier; the gates still follow `fused`); it trains on CUDA only (torch 2.13's FlexAttention has no CPU
backward) and is off in the configs: the hand-written core is the parity reference until a GPU measures flex faster.

Names (shared by the three transformers, see `layers.py`): `layers` (the list of `Layer`), per layer
`attn` (projections `qkv`, `r_proj`, `out`), `ffn`, `ln_attn`, `ln_ffn`, `attn_gate`, `ffn_gate`;
`ln_final` (pre-LN only); the embedding `tok_emb` (also the softmax weight) and `out_bias`; u, v are
`r_w_bias`, `r_r_bias` as in the official code.

Relative attention (paper section 3.3), per head, query position i, key position j:

    score(i, j) = (q_i + u) . k_j  +  (q_i + v) . W_R R_{i-j}          (terms AC + BD)

u = `r_w_bias`, v = `r_r_bias` are global (shared by all layers, as the official PyTorch
enwik8 runs: `untie_r` off), shape (n_heads, d_head). R is the sinusoid of Vaswani et al.
over the distance i - j, clamped to `clamp_len` when clamp_len > 0. BD is computed for all
K distances at once and aligned with `layers.rel_shift`. Scores are scaled by 1/sqrt(d_head),
the causal mask over [mem; current] is built per call (`layers.rel_shift`, `layers.sinusoidal_positions`).

Memory layout (`mems`, `new_mems`): a list of `n_layers` tensors, entry l of shape
(B, M, d_model), batch first: the last M inputs of layer l (entry 0 = the scaled, dropped
embeddings), detached. mems=None (or []) means empty memory (M = 0). After a call,
M_new = min(M + T, mem_len) with the active mem_len (train: `mem_len`, eval:
`eval_mem_len`); with mem_len = 0 every entry is (B, 0, d_model). The official code keeps
n_layers + 1 entries but never reads the last one (the final output), so it is not stored.
Memory passed in is attended to in full even if longer than the active mem_len.

Train vs eval: `model.train()` uses tgt_len / mem_len / clamp_len / same_length,
`model.eval()` the eval_* values where given (else the training value). `forward` splits
an input longer than the active tgt_len into consecutive segments of tgt_len, carrying
memory between them: e.g. eval_tgt_len=128, eval_mem_len=896 evaluates 512-token windows
exactly as the official evaluation does with 128-token segments.

same_length (as the official code): every query attends to exactly the active mem_len
keys ending at itself (itself and the mem_len - 1 previous positions), so the first
positions of a segment no longer see the oldest memory. Needs mem_len >= 1.

Init as the official `weights_init` with init_std 0.02: Linear and Embedding weights and
u, v ~ N(0, 0.02), biases 0, LayerNorm weight ~ N(1, 0.02). Gate modules keep the init of
gates.py. The embedding is multiplied by sqrt(d_model) (official `emb_scale`).

Dropout (official placement): on the scaled embedding, the relative position embedding,
the attention output, inside the FFN (after ReLU and after the second linear), and on the
last hidden state before the softmax; attention dropout on the attention probabilities.

Parameters (post-LN, tied): V*d (embedding = softmax weight) + V (softmax bias)
+ 2*H*dh (u, v) + n_layers * (5*H*dh*d [q, k, v, r, out projections, no biases]
+ 2*d*d_ff + d_ff + d [FFN] + 4*d [two LayerNorms]); each gated sublayer adds
2*d*d + 2*d. Paper enwik8 6-layer model (V=204): 20,580,556 baseline, 26,884,300 with
SDU gates on all 12 sublayers.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from highway_repro import options
from highway_repro.models import gates, kernels
from highway_repro.models.dropout import Dropout, dropout
from highway_repro.models.layers import (FeedForward, init_layer_norm_, normal_linear, rel_shift,
                                          sinusoidal_positions)

INIT_STD = 0.02


class RelMultiHeadAttn(nn.Module):
    """Relative multi-head attention with global biases u, v (given at call time)."""

    def __init__(self, d_model: int, n_heads: int, d_head: int, dropout: float, attn_dropout: float,
                 fused: bool = False, flex: bool = False):
        super().__init__()
        self.n_heads, self.d_head, self.fused, self.flex = n_heads, d_head, fused, flex
        self.scale = 1.0 / math.sqrt(d_head)
        self.attn_dropout = attn_dropout
        self.qkv = normal_linear(d_model, 3 * n_heads * d_head, bias=False, std=INIT_STD)  # [W_q | W_k | W_v]
        self.r_proj = normal_linear(d_model, n_heads * d_head, bias=False, std=INIT_STD)  # W_R
        self.out = normal_linear(n_heads * d_head, d_model, bias=False, std=INIT_STD)
        self.drop = Dropout(dropout)

    def forward(self, h: torch.Tensor, r: torch.Tensor, u: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """h (B, K, d) = [mem; current], r (K, d) distances K-1..0, mask (Q, K) bool True = hidden.

        Returns the attention output (B, Q, d) for the last Q = mask.shape[0] positions.
        """
        B, K, _ = h.shape
        Q, H, dh = mask.shape[0], self.n_heads, self.d_head
        w_q, w_kv = self.qkv.weight.split([H * dh, 2 * H * dh], dim=0)
        q = F.linear(h[:, K - Q:], w_q)  # (B, Q, H*dh): queries from the current segment only
        kv = F.linear(h, w_kv)  # (B, K, 2*H*dh) = [k | val] over [mem; current]
        rk = self.r_proj(r)  # (K, H*dh)
        p_drop = self.attn_dropout if self.training else 0.0
        if self.flex:
            if q.requires_grad and q.device.type == "cpu":
                raise options.error("model.flex_attention", True, "false on a CPU, true on CUDA",
                                    "cannot train on a CPU (torch's FlexAttention has no CPU backward)")
            return self.drop(self.out(kernels.rel_attention_flex(q, kv, rk, u, v, mask, self.scale)))
        if self.fused:
            out = kernels.rel_attention(q, kv, rk, u, v, mask, self.scale, p_drop)  # (B, Q, H*dh)
            return self.drop(self.out(out))
        q = q.view(B, Q, H, dh).transpose(1, 2)  # (B, H, Q, dh)
        k, val = kv.view(B, K, 2, H, dh).permute(2, 0, 3, 1, 4)  # (B, H, K, dh) each
        rk = rk.view(K, H, dh).transpose(0, 1)  # (H, K, dh)
        bd = rel_shift(torch.matmul(q + v[:, None], rk.transpose(-1, -2)))  # BD, (B, H, Q, K)
        ac = torch.matmul(q + u[:, None], k.transpose(-1, -2))  # AC, (B, H, Q, K)
        score = ((ac + bd) * self.scale).masked_fill(mask, float("-inf"))
        prob = F.softmax(score, dim=-1, dtype=torch.promote_types(score.dtype, torch.float32))
        prob = dropout(prob.to(val.dtype), p_drop, self.training)
        out = torch.matmul(prob, val)  # (B, H, Q, dh)
        out = out.transpose(1, 2).reshape(B, Q, H * dh)
        return self.drop(self.out(out))  # (B, Q, d)

    def extra_repr(self) -> str:
        return f"fused={self.fused}, flex={self.flex}"


class Layer(nn.Module):
    """One decoder layer: relative attention over [mem; X] and FFN, each with an optional gate."""

    def __init__(self, d_model: int, n_heads: int, d_head: int, d_ff: int, dropout: float,
                 attn_dropout: float, norm_position: str, placement: dict, gate_bias: float, fused: bool = False,
                 flex: bool = False):
        super().__init__()
        self.norm_position = norm_position
        self.attn = RelMultiHeadAttn(d_model, n_heads, d_head, dropout, attn_dropout, fused, flex)
        self.ffn = FeedForward(d_model, d_ff, dropout, init_std=INIT_STD, init_each=True)  # official CoreNet
        self.ln_attn = init_layer_norm_(nn.LayerNorm(d_model), INIT_STD)
        self.ln_ffn = init_layer_norm_(nn.LayerNorm(d_model), INIT_STD)
        self.attn_gate = gates.make_gate(placement["attn"], d_model, gate_bias, fused)  # None: no parameters
        self.ffn_gate = gates.make_gate(placement["ffn"], d_model, gate_bias, fused)

    def forward(self, x: torch.Tensor, mem: torch.Tensor | None, r: torch.Tensor, u: torch.Tensor,
                v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = x if mem is None or mem.size(1) == 0 else torch.cat([mem.to(x.dtype), x], dim=1)  # (B, K, d)
        if self.norm_position == "post":
            y = self.ln_attn(gates.combine(self.attn_gate, x, self.attn(h, r, u, v, mask)))  # U, (B, T, d)
            return self.ln_ffn(gates.combine(self.ffn_gate, y, self.ffn(y)))  # O, (B, T, d)
        y = gates.combine(self.attn_gate, x, self.attn(self.ln_attn(h), r, u, v, mask))
        return gates.combine(self.ffn_gate, y, self.ffn(self.ln_ffn(y)))


class TransformerXL(nn.Module):
    """Transformer-XL LM: `forward(tokens (B, T), mems=None) -> (logits (B, T, V), new_mems)`.

    See the module docstring for the layer, the memory layout and the train/eval settings.
    Gate placement: `gates.resolve_placement(n_layers, gate_kind, gate_layers, gate_sublayers)`
    (layers numbered from 1), kept as `self.placement`. Options and their valid values:
    `options.MODELS["TransformerXL"]`.
    """

    def __init__(self, vocab_size: int, n_layers: int = 6, d_model: int = 512, n_heads: int = 8,
                 d_head: int = 64, d_ff: int = 2048, dropout: float = 0.1, attn_dropout: float = 0.0,
                 tgt_len: int = 512, mem_len: int = 512, clamp_len: int = -1, same_length: bool = False,
                 eval_tgt_len: int | None = None, eval_mem_len: int | None = None,
                 eval_clamp_len: int | None = None, eval_same_length: bool | None = None,
                 norm_position: str = "post", tie_embeddings: bool = True, gate_kind="none", gate_layers="all",
                 gate_sublayers="both", gate_bias: float = 0.0, fused: bool = False, flex_attention: bool = False):
        options.check_model("TransformerXL", locals())
        super().__init__()
        train_cfg = {"tgt_len": tgt_len, "mem_len": mem_len, "clamp_len": clamp_len, "same_length": same_length}
        given = {"tgt_len": eval_tgt_len, "mem_len": eval_mem_len, "clamp_len": eval_clamp_len,
                 "same_length": eval_same_length}
        eval_cfg = {k: (train_cfg[k] if given[k] is None else given[k]) for k in train_cfg}

        self.vocab_size, self.n_layers, self.d_model = vocab_size, n_layers, d_model
        self.n_heads, self.d_head, self.d_ff, self.norm_position = n_heads, d_head, d_ff, norm_position
        self.train_cfg, self.eval_cfg = train_cfg, eval_cfg
        self.emb_scale = math.sqrt(d_model)
        self.placement = gates.resolve_placement(n_layers, gate_kind, gate_layers, gate_sublayers)

        self.tok_emb = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.tok_emb.weight, 0.0, INIT_STD)
        self.drop = Dropout(dropout)
        self.r_w_bias = nn.Parameter(torch.empty(n_heads, d_head).normal_(0.0, INIT_STD))  # u
        self.r_r_bias = nn.Parameter(torch.empty(n_heads, d_head).normal_(0.0, INIT_STD))  # v
        self.layers = nn.ModuleList(
            Layer(d_model, n_heads, d_head, d_ff, dropout, attn_dropout, norm_position, p, gate_bias, fused,
                  flex_attention) for p in self.placement)
        self.ln_final = init_layer_norm_(nn.LayerNorm(d_model), INIT_STD) if norm_position == "pre" else None
        self.out_bias = nn.Parameter(torch.zeros(vocab_size))  # softmax weight = self.tok_emb.weight

    # ---- settings --------------------------------------------------------------------
    @property
    def active(self) -> dict:
        """The settings in use now: eval_* values in eval mode, training values in train mode."""
        return self.train_cfg if self.training else self.eval_cfg

    @property
    def tgt_len(self) -> int:
        return self.active["tgt_len"]

    @property
    def mem_len(self) -> int:
        return self.active["mem_len"]

    def gated_sublayers(self) -> list[tuple[int, str]]:
        """(1-based layer, sublayer) pairs that hold a gate module."""
        return [(i + 1, s) for i, layer in enumerate(self.layers)
                for s, g in (("attn", layer.attn_gate), ("ffn", layer.ffn_gate)) if g is not None]

    def init_mems(self, batch_size: int, device=None, dtype=None) -> list[torch.Tensor]:
        """Empty memory: n_layers tensors of shape (B, 0, d_model)."""
        w = self.tok_emb.weight
        return [w.new_zeros(batch_size, 0, self.d_model, device=device, dtype=dtype)
                for _ in range(self.n_layers)]

    # ---- forward ---------------------------------------------------------------------
    def _attn_mask(self, q: int, m: int, device) -> torch.Tensor:
        """(Q, K) bool, True = hidden. Query i sits at key index m + i."""
        pos_q = torch.arange(q, device=device)[:, None] + m
        pos_k = torch.arange(q + m, device=device)[None, :]
        mask = pos_k > pos_q
        if self.active["same_length"]:
            mask = mask | (pos_k <= pos_q - self.mem_len)
        return mask

    def _check_mems(self, mems, batch: int) -> list[torch.Tensor] | None:
        if mems is None or len(mems) == 0:
            return None
        if len(mems) != self.n_layers:
            raise ValueError(f"mems has {len(mems)} entries but the model has {self.n_layers} layers "
                             "(valid: None or the new_mems of the previous call)")
        m = mems[0].shape[1] if mems[0].dim() == 3 else -1
        for t in mems:
            if tuple(t.shape) != (batch, m, self.d_model):
                raise ValueError(f"mems entry of shape {tuple(t.shape)} does not match "
                                 f"(batch={batch}, mem, d_model={self.d_model}) of the other entries")
        return list(mems)

    def _segment(self, tokens: torch.Tensor, mems: list[torch.Tensor] | None):
        B, T = tokens.shape
        M = 0 if mems is None else mems[0].size(1)
        K = M + T
        x = self.drop(self.tok_emb(tokens) * self.emb_scale)  # (B, T, d)
        pos = torch.arange(K - 1, -1, -1, device=tokens.device)  # distances K-1 .. 0
        clamp = self.active["clamp_len"]
        if clamp > 0:
            pos = pos.clamp(max=clamp)
        r = self.drop(sinusoidal_positions(pos, self.d_model, x.dtype))  # (K, d)
        mask = self._attn_mask(T, M, tokens.device)  # (T, K)
        hids = []
        for i, layer in enumerate(self.layers):
            hids.append(x)
            x = layer(x, None if mems is None else mems[i], r, self.r_w_bias, self.r_r_bias, mask)
        if self.ln_final is not None:
            x = self.ln_final(x)
        logits = F.linear(self.drop(x), self.tok_emb.weight, self.out_bias)  # (B, T, V)
        with torch.no_grad():
            keep = self.mem_len
            new_mems = []
            for i, hid in enumerate(hids):
                cat = hid if mems is None else torch.cat([mems[i].to(hid.dtype), hid], dim=1)
                new_mems.append(cat[:, max(0, cat.size(1) - keep):].detach())
        return logits, new_mems

    def forward(self, tokens: torch.Tensor, mems: list[torch.Tensor] | None = None,
                score_len: int | None = None):
        """tokens (B, T) int64, mems as documented -> logits (B, S, V), new_mems; S = score_len (the last
        positions) or T when None. Every position feeds the memory, so all are computed (the head too).

        T longer than the active tgt_len is processed as consecutive segments of tgt_len.
        """
        if tokens.dim() != 2:
            raise ValueError(f"tokens of shape {tuple(tokens.shape)} must be (batch, time)")
        B, T = tokens.shape
        mems = self._check_mems(mems, B)
        if T == 0:
            raise ValueError("tokens has 0 time steps (valid: T >= 1)")
        out = []
        for s in range(0, T, self.tgt_len):
            logits, mems = self._segment(tokens[:, s:s + self.tgt_len], mems)
            out.append(logits)
        logits = out[0] if len(out) == 1 else torch.cat(out, dim=1)  # (B, T, V)
        return (logits if score_len is None else logits[:, T - score_len:]), mems
