"""Transformer-XL language model (Dai et al. 2019, arXiv 1901.02860) with the self-gating
units of the Highway Transformer (Chai et al., ACL 2020, arXiv 2004.08178).

This is the model of the paper's enwik8 experiments (REFERENCE.md B1): segment-level
recurrence and relative positional attention as in the official PyTorch Transformer-XL
(`RelPartialLearnableMultiHeadAttn`, `MemTransformerLM`), one word-level tied softmax
(no adaptive softmax: the byte vocabulary has ~204 symbols).

Block (post-LN, as in the paper's runs; X is the current segment only, never the memory):

    U = LN(combine(attn_gate, X, RelAttn(X, mem)))
    O = LN(combine(ffn_gate,  U, FFN(U)))

pre-LN (`norm='pre'`): U = combine(attn_gate, X, RelAttn(LN([mem; X])));
O = combine(ffn_gate, U, FFN(LN(U))), plus one final LayerNorm after the last block
(the official pre-LN option has none; standard pre-LN practice adds it).
`combine` and the gate kinds are those of `highway_repro.models.gates`: T is the
transform gate, C = 1 - T the carry gate, `gate_bias` shifts the gate's pre-activation
(negative = carry by default). An ungated sublayer has no gate parameters.

Relative attention (paper section 3.3), per head, query position i, key position j:

    score(i, j) = (q_i + u) . k_j  +  (q_i + v) . W_R R_{i-j}          (terms AC + BD)

u = `r_w_bias`, v = `r_r_bias` are global (shared by all layers, as the official PyTorch
enwik8 runs: `untie_r` off), shape (n_heads, d_head). R is the sinusoid of Vaswani et al.
over the distance i - j, clamped to `clamp_len` when clamp_len > 0. BD is computed for all
K distances at once and aligned with `_rel_shift`. Scores are scaled by 1/sqrt(d_head),
the causal mask over [mem; current] is built per call.

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
+ 2*d*d_inner + d_inner + d [FFN] + 4*d [two LayerNorms]); each gated sublayer adds
2*d*d + 2*d. Paper enwik8 6-layer model (V=204): 20,580,556 baseline, 26,884,300 with
SDU gates on all 12 sublayers.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from highway_repro.models import gates as gates_mod

INIT_STD = 0.02
NORMS = ("post", "pre")


def _init_linear(m: nn.Linear, std: float = INIT_STD) -> nn.Linear:
    nn.init.normal_(m.weight, 0.0, std)
    if m.bias is not None:
        nn.init.zeros_(m.bias)
    return m


def _init_layer_norm(m: nn.LayerNorm, std: float = INIT_STD) -> nn.LayerNorm:
    nn.init.normal_(m.weight, 1.0, std)  # official weights_init quirk: N(1, init_std)
    nn.init.zeros_(m.bias)
    return m


def _rel_shift(x: torch.Tensor) -> torch.Tensor:
    """Align relative scores: (..., Q, K) indexed by (query i, distance row k) -> (query i, key j).

    Row k of the input holds distance K-1-k (positions embedded from K-1 down to 0). For
    query i (absolute key index M+i, M = K-Q) and key j, the output holds the input at
    k = Q-1-i+j, i.e. distance M+i-j. Valid for j <= M+i (the causal part); the rest is
    garbage that the causal mask removes. Pad-and-reshape trick of the official code.
    """
    *lead, q, k = x.shape
    x = F.pad(x, (1, 0))  # (..., Q, K+1), zero column in front
    x = x.reshape(*lead, k + 1, q)[..., 1:, :]  # (..., K, Q)
    return x.reshape(*lead, q, k)


def sinusoid(pos: torch.Tensor, d: int) -> torch.Tensor:
    """(len,) float positions -> (len, d) embedding [sin(p w) | cos(p w)], w = 10000^(-2i/d)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, device=pos.device, dtype=torch.float32) / d))
    ang = pos.float()[:, None] * inv_freq[None, :]  # (len, d/2)
    return torch.cat([ang.sin(), ang.cos()], dim=-1)


class _RelAttnCore(torch.autograd.Function):
    """softmax(((q+u) k^T + rel_shift((q+v) rk^T)) / sqrt(dh), causal mask) @ val, training path.

    Inputs are the projections as the linear layers give them, q (B, Q, H*dh), kv (B, K, 2*H*dh)
    ([k | val]), rk (K, H*dh), and u, v (H, dh), mask (Q, K) bool (True = hidden); the gradients
    come back in those layouts. The autograd graph of the plain formula keeps and copies several
    (B, H, Q, K) tensors (pad, reshape, scale, mask, the math fallback of scaled_dot_product_attention
    when the bias needs a gradient). Here the forward keeps one (the probabilities); BD is computed
    head-major, (H, B*Q, dh) @ (H, dh, K), so no operand is expanded over the batch, and its shift is
    a strided view (`_rel_shift` without the copies); the scale is applied to the small q. The
    backward un-shifts the score gradient with one copy into a padded buffer (the official pad trick
    run backwards). Same values as the plain formula (tests). No attention dropout (the caller
    uses the plain path for it).
    """

    @staticmethod
    def forward(ctx, q, kv, rk, u, v, mask, scale):
        (B, Q, _), K, (H, dh) = q.shape, kv.shape[1], u.shape
        ctx.dtypes = (q.dtype, kv.dtype, rk.dtype, u.dtype, v.dtype)
        with torch.autocast(q.device.type, enabled=False):
            dt = q.dtype
            q4 = q.view(B, Q, H, dh)
            qu = torch.add(q4.transpose(1, 2), u.to(dt)[:, None], out=q.new_empty(B, H, Q, dh)).mul_(scale)
            qv = torch.add(q4.permute(2, 0, 1, 3), v.to(dt)[:, None, None],
                           out=q.new_empty(H, B, Q, dh)).mul_(scale)  # head-major
            kv5 = kv.to(dt).view(B, K, 2, H, dh)
            k, val = kv5[:, :, 0].transpose(1, 2).contiguous(), kv5[:, :, 1].transpose(1, 2).contiguous()
            rkh = rk.to(dt).view(K, H, dh).transpose(0, 1)  # (H, K, dh)
            scores = torch.matmul(qu, k.transpose(-1, -2))  # AC, (B, H, Q, K)
            bd = torch.bmm(qv.view(H, B * Q, dh), rkh.transpose(1, 2))  # BD before the shift, (H, B*Q, K)
            # rel shift as a view: out[b, h, i, j] = bd[h, b, i, Q-1-i+j] (j > M+i: garbage, masked)
            shifted = bd.as_strided((B, H, Q, K), (Q * K, B * Q * K, K - 1, 1), bd.storage_offset() + Q - 1)
            scores.add_(shifted).masked_fill_(mask, float("-inf"))
            del bd, shifted
            prob = torch.softmax(scores, dim=-1, dtype=torch.promote_types(dt, torch.float32))
            del scores
            out = torch.matmul(prob.to(dt), val)  # (B, H, Q, dh)
        ctx.save_for_backward(prob, qu, qv, k, val, rkh)
        ctx.scale = scale
        return out.transpose(1, 2).reshape(B, Q, H * dh)

    @staticmethod
    def backward(ctx, g):
        prob, qu, qv, k, val, rkh = ctx.saved_tensors
        B, H, Q, K = prob.shape
        dh, dt, s = qu.shape[-1], qu.dtype, ctx.scale
        g4 = g.to(dt).view(B, Q, H, dh).transpose(1, 2).contiguous()  # (B, H, Q, dh)
        p = prob.to(dt)
        dval = torch.matmul(p.transpose(-1, -2), g4)  # (B, H, K, dh)
        dprob = torch.matmul(g4, val.transpose(-1, -2))  # (B, H, Q, K)
        ds = torch._softmax_backward_data(dprob.to(prob.dtype), prob, -1, prob.dtype).to(dt)  # d scores
        del dprob, p
        dqu = torch.matmul(ds, k)  # (B, H, Q, dh)
        dk = torch.matmul(ds.transpose(-1, -2), qu)  # (B, H, K, dh)
        # un-shift: the shifted view is the flat range [Q, Q + Q*K) of [0 | bd] laid out (Q, K+1)
        pad = ds.new_empty(H, B, Q * (K + 1))
        pad[..., :Q].zero_()
        pad[..., Q:].view(H, B, Q, K).copy_(ds.transpose(0, 1))
        del ds
        dbd = pad.view(H, B, Q, K + 1)[..., 1:].view(H, B * Q, K)  # row stride K+1
        dqv = torch.bmm(dbd, rkh)  # (H, B*Q, dh)
        drk = torch.bmm(dbd.transpose(1, 2), qv.view(H, B * Q, dh))  # (H, K, dh)
        del pad, dbd
        dq = torch.add(dqu.transpose(1, 2), dqv.view(H, B, Q, dh).permute(1, 2, 0, 3),
                       out=qu.new_empty(B, Q, H, dh)).mul_(s)
        dkv = qu.new_empty(B, K, 2, H, dh)
        dkv[:, :, 0].copy_(dk.transpose(1, 2))
        dkv[:, :, 1].copy_(dval.transpose(1, 2))
        q_dt, kv_dt, rk_dt, u_dt, v_dt = ctx.dtypes
        return (dq.view(B, Q, H * dh).to(q_dt), dkv.view(B, K, 2 * H * dh).to(kv_dt),
                drk.transpose(0, 1).reshape(K, H * dh).to(rk_dt), (dqu.sum((0, 2)) * s).to(u_dt),
                (dqv.sum(1) * s).to(v_dt), None, None)


class RelMultiHeadAttn(nn.Module):
    """Relative multi-head attention with global biases u, v (given at call time)."""

    def __init__(self, d_model: int, n_heads: int, d_head: int, dropout: float, attn_dropout: float):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_head
        self.scale = 1.0 / math.sqrt(d_head)
        self.attn_dropout = attn_dropout
        self.qkv_net = _init_linear(nn.Linear(d_model, 3 * n_heads * d_head, bias=False))
        self.r_net = _init_linear(nn.Linear(d_model, n_heads * d_head, bias=False))
        self.o_net = _init_linear(nn.Linear(n_heads * d_head, d_model, bias=False))
        self.drop = nn.Dropout(dropout)
        # True: training uses _RelAttnCore, inference scaled_dot_product_attention with BD as an additive
        # bias (attention dropout: that path in training too); False: the explicit softmax (reference)
        self.fused = True

    def forward(self, h: torch.Tensor, r: torch.Tensor, u: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """h (B, K, d) = [mem; current], r (K, d) distances K-1..0, mask (Q, K) bool True = hidden.

        Returns the attention output (B, Q, d) for the last Q = mask.shape[0] positions.
        """
        B, K, _ = h.shape
        Q, H, dh = mask.shape[0], self.n_heads, self.d_head
        w_q, w_kv = self.qkv_net.weight.split([H * dh, 2 * H * dh], dim=0)
        p_drop = self.attn_dropout if self.training else 0.0
        if self.fused and p_drop == 0.0 and torch.is_grad_enabled():
            out = _RelAttnCore.apply(F.linear(h[:, K - Q:], w_q), F.linear(h, w_kv), self.r_net(r), u, v, mask,
                                     self.scale)  # (B, Q, H*dh)
            return self.drop(self.o_net(out))
        q = F.linear(h[:, K - Q:], w_q).view(B, Q, H, dh).transpose(1, 2)  # (B, H, Q, dh)
        k, val = F.linear(h, w_kv).view(B, K, 2, H, dh).permute(2, 0, 3, 1, 4)  # (B, H, K, dh) each
        rk = self.r_net(r).view(K, H, dh).transpose(0, 1)  # (H, K, dh)
        bd = _rel_shift(torch.matmul(q + v[:, None], rk.transpose(-1, -2)))  # (B, H, Q, K)
        if self.fused:
            bias = (bd * self.scale).masked_fill(mask, float("-inf")).to(q.dtype)
            out = F.scaled_dot_product_attention(q + u[:, None], k, val, attn_mask=bias,
                                                 dropout_p=p_drop, scale=self.scale)
        else:
            ac = torch.matmul(q + u[:, None], k.transpose(-1, -2))  # (B, H, Q, K)
            score = ((ac + bd) * self.scale).masked_fill(mask, float("-inf"))
            prob = F.softmax(score, dim=-1, dtype=torch.promote_types(score.dtype, torch.float32))
            prob = F.dropout(prob.to(val.dtype), p_drop, self.training)
            out = torch.matmul(prob, val)  # (B, H, Q, dh)
        out = out.transpose(1, 2).reshape(B, Q, H * dh)
        return self.drop(self.o_net(out))  # (B, Q, d)


class PositionwiseFF(nn.Module):
    """Linear(d, d_inner) -> ReLU -> Dropout -> Linear(d_inner, d) -> Dropout (official CoreNet)."""

    def __init__(self, d_model: int, d_inner: int, dropout: float):
        super().__init__()
        # not inplace: ReLU on the view a 3-d linear returns costs autograd two (B, T, d_inner) copies
        self.net = nn.Sequential(_init_linear(nn.Linear(d_model, d_inner)), nn.ReLU(),
                                 nn.Dropout(dropout), _init_linear(nn.Linear(d_inner, d_model)),
                                 nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class TXLBlock(nn.Module):
    """One decoder layer: relative attention over [mem; X] and FFN, each with an optional gate."""

    def __init__(self, d_model: int, n_heads: int, d_head: int, d_inner: int, dropout: float,
                 attn_dropout: float, norm: str, placement: dict, gate_bias: float):
        super().__init__()
        self.norm = norm
        self.attn = RelMultiHeadAttn(d_model, n_heads, d_head, dropout, attn_dropout)
        self.ffn = PositionwiseFF(d_model, d_inner, dropout)
        self.ln_attn = _init_layer_norm(nn.LayerNorm(d_model))
        self.ln_ffn = _init_layer_norm(nn.LayerNorm(d_model))
        self.attn_gate = gates_mod.make_gate(placement["attn"], d_model, gate_bias)
        self.ffn_gate = gates_mod.make_gate(placement["ffn"], d_model, gate_bias)

    def forward(self, x: torch.Tensor, mem: torch.Tensor | None, r: torch.Tensor, u: torch.Tensor,
                v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = x if mem is None or mem.size(1) == 0 else torch.cat([mem.to(x.dtype), x], dim=1)  # (B, K, d)
        if self.norm == "post":
            y = self.ln_attn(gates_mod.combine(self.attn_gate, x, self.attn(h, r, u, v, mask)))
            return self.ln_ffn(gates_mod.combine(self.ffn_gate, y, self.ffn(y)))
        y = gates_mod.combine(self.attn_gate, x, self.attn(self.ln_attn(h), r, u, v, mask))
        return gates_mod.combine(self.ffn_gate, y, self.ffn(self.ln_ffn(y)))


def _check(cond: bool, field: str, value, valid: str) -> None:
    if not cond:
        raise ValueError(f"TransformerXL {field}={value!r} is invalid (valid: {valid})")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class TransformerXL(nn.Module):
    """Transformer-XL LM: `forward(tokens (B, T), mems=None) -> (logits (B, T, V), new_mems)`.

    See the module docstring for the block, the memory layout and the train/eval settings.
    Gate placement: `gates.resolve_placement(n_layers, gate_kind, gate_layers, gate_sublayers)`
    (layers numbered from 1), kept as `self.placement`.
    """

    def __init__(self, vocab_size: int, n_layers: int = 6, d_model: int = 512, n_heads: int = 8,
                 d_head: int = 64, d_inner: int = 2048, dropout: float = 0.1, attn_dropout: float = 0.0,
                 tgt_len: int = 512, mem_len: int = 512, clamp_len: int = -1, same_length: bool = False,
                 eval_tgt_len: int | None = None, eval_mem_len: int | None = None,
                 eval_clamp_len: int | None = None, eval_same_length: bool | None = None,
                 norm: str = "post", tie_embeddings: bool = True, gate_kind="none", gate_layers="all",
                 gate_sublayers="both", gate_bias: float = 0.0):
        super().__init__()
        for name, val, lo in (("vocab_size", vocab_size, 1), ("n_layers", n_layers, 1),
                              ("d_model", d_model, 2), ("n_heads", n_heads, 1), ("d_head", d_head, 1),
                              ("d_inner", d_inner, 1)):
            _check(_is_int(val) and val >= lo, name, val, f"an integer >= {lo}")
        _check(d_model % 2 == 0, "d_model", d_model, "an even integer (sinusoidal positions)")
        for name, val in (("dropout", dropout), ("attn_dropout", attn_dropout)):
            _check(isinstance(val, (int, float)) and 0.0 <= val < 1.0, name, val, "0 <= p < 1")
        _check(norm in NORMS, "norm", norm, " or ".join(map(repr, NORMS)))
        train_cfg = {"tgt_len": tgt_len, "mem_len": mem_len, "clamp_len": clamp_len, "same_length": same_length}
        given = {"tgt_len": eval_tgt_len, "mem_len": eval_mem_len, "clamp_len": eval_clamp_len,
                 "same_length": eval_same_length}
        eval_cfg = {k: (train_cfg[k] if given[k] is None else given[k]) for k in train_cfg}
        for prefix, cfg in (("", train_cfg), ("eval_", eval_cfg)):
            _check(_is_int(cfg["tgt_len"]) and cfg["tgt_len"] > 0, prefix + "tgt_len", cfg["tgt_len"],
                   "an integer > 0")
            _check(_is_int(cfg["mem_len"]) and cfg["mem_len"] >= 0, prefix + "mem_len", cfg["mem_len"],
                   "an integer >= 0")
            _check(_is_int(cfg["clamp_len"]) and (cfg["clamp_len"] == -1 or cfg["clamp_len"] >= 1),
                   prefix + "clamp_len", cfg["clamp_len"], "-1 (no clamping) or an integer >= 1")
            _check(isinstance(cfg["same_length"], bool), prefix + "same_length", cfg["same_length"],
                   "True or False")
            _check(not cfg["same_length"] or cfg["mem_len"] >= 1, prefix + "same_length",
                   cfg["same_length"], f"False when {prefix}mem_len=0 (the window is mem_len keys)")
        _check(tie_embeddings is True, "tie_embeddings", tie_embeddings,
               "True (only the tied softmax of the paper's runs is implemented)")
        _check(isinstance(gate_bias, (int, float)) and not isinstance(gate_bias, bool), "gate_bias",
               gate_bias, "a number")

        self.vocab_size, self.n_layers, self.d_model = vocab_size, n_layers, d_model
        self.n_heads, self.d_head, self.d_inner, self.norm = n_heads, d_head, d_inner, norm
        self.train_cfg, self.eval_cfg = train_cfg, eval_cfg
        self.emb_scale = math.sqrt(d_model)
        self.placement = gates_mod.resolve_placement(n_layers, gate_kind, gate_layers, gate_sublayers)

        self.emb = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.emb.weight, 0.0, INIT_STD)
        self.drop = nn.Dropout(dropout)
        self.r_w_bias = nn.Parameter(torch.empty(n_heads, d_head).normal_(0.0, INIT_STD))  # u
        self.r_r_bias = nn.Parameter(torch.empty(n_heads, d_head).normal_(0.0, INIT_STD))  # v
        self.layers = nn.ModuleList(
            TXLBlock(d_model, n_heads, d_head, d_inner, dropout, attn_dropout, norm, p, gate_bias)
            for p in self.placement)
        self.ln_final = _init_layer_norm(nn.LayerNorm(d_model)) if norm == "pre" else None
        self.out_bias = nn.Parameter(torch.zeros(vocab_size))  # softmax weight = self.emb.weight

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

    def set_fused_attention(self, fused: bool) -> None:
        """True: scaled_dot_product_attention with BD as additive bias; False: explicit softmax."""
        for layer in self.layers:
            layer.attn.fused = fused

    def gated_sublayers(self) -> list[tuple[int, str]]:
        """(1-based layer, sublayer) pairs that hold a gate module."""
        return [(i + 1, s) for i, layer in enumerate(self.layers)
                for s, g in (("attn", layer.attn_gate), ("ffn", layer.ffn_gate)) if g is not None]

    def init_mems(self, batch_size: int, device=None, dtype=None) -> list[torch.Tensor]:
        """Empty memory: n_layers tensors of shape (B, 0, d_model)."""
        w = self.emb.weight
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
        x = self.drop(self.emb(tokens) * self.emb_scale)  # (B, T, d)
        pos = torch.arange(K - 1, -1, -1, device=tokens.device)  # distances K-1 .. 0
        clamp = self.active["clamp_len"]
        if clamp > 0:
            pos = pos.clamp(max=clamp)
        r = self.drop(sinusoid(pos, self.d_model).to(x.dtype))  # (K, d)
        mask = self._attn_mask(T, M, tokens.device)  # (T, K)
        hids = []
        for i, layer in enumerate(self.layers):
            hids.append(x)
            x = layer(x, None if mems is None else mems[i], r, self.r_w_bias, self.r_r_bias, mask)
        if self.ln_final is not None:
            x = self.ln_final(x)
        logits = F.linear(self.drop(x), self.emb.weight, self.out_bias)  # (B, T, V)
        with torch.no_grad():
            keep = self.mem_len
            new_mems = []
            for i, hid in enumerate(hids):
                cat = hid if mems is None else torch.cat([mems[i].to(hid.dtype), hid], dim=1)
                new_mems.append(cat[:, max(0, cat.size(1) - keep):].detach())
        return logits, new_mems

    def forward(self, tokens: torch.Tensor, mems: list[torch.Tensor] | None = None):
        """tokens (B, T) int64, mems as documented -> logits (B, T, V), new_mems.

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
        return (out[0] if len(out) == 1 else torch.cat(out, dim=1)), mems
