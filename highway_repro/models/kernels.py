"""Fast paths: hand-written autograd kernels, used only by models built with `fused=True` (config `model.fused`).

Each function computes what the plain formula in the model file computes; the plain formula is the code to
read, this is the code that saves memory passes. tests/test_fast_paths.py checks that both agree in values
and gradients (and gradcheck in float64). No model imports this module for anything but speed.

- `gate_sum(h, x, sub, act, term)`: the pre-LayerNorm sum of a sublayer gate (`gates.SublayerGate`), for the
  kinds whose formula is x + sub + term with term one of `GATE_TERMS`.
- `rel_attention(q, kv, rk, u, v, mask, scale, p_drop)`: the relative multi-head attention of Transformer-XL
  (`transformer_xl.RelMultiHeadAttn`); `rel_attention_flex`, the same through FlexAttention (`flex_attention=True`).
- `local_rnn(x, rnn, window)`: the R-Transformer's local RNN (`r_transformer.LocalRNN`) with each position's
  input projection computed once; the window recurrence with a hand-written backward (`_LocalGRU`,
  `_LocalLSTM`).
- `official_layer_norm(x, weight, bias, eps)`: the official R-Transformer LayerNorm
  (`r_transformer.OfficialLayerNorm`: unbiased std + eps) with a hand-written backward.

`gate_sum`, `rel_attention` and `local_rnn` use private or low-level operations (aten's sigmoid/tanh backward,
`torch._softmax_backward_data`, `as_strided`): they are tied to the torch 2.x API and are the first place to
look when a torch upgrade changes numbers.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from highway_repro.models.layers import rel_shift

# ----------------------------------------------------------------------------- gates

GATE_TERMS = ("T*f", "T*(f-x)", "T*(f-sub)")  # out = x + sub + term
_ACT_GRAD = {"sigmoid": torch.ops.aten.sigmoid_backward, "tanh": torch.ops.aten.tanh_backward}


def gate_sum(h: torch.Tensor, x: torch.Tensor, sub: torch.Tensor, act, term: str) -> torch.Tensor:
    """x + sub + term from h = proj(x) = [z1 | f] (B, T, 2d), T = act(z1); `term` one of GATE_TERMS.

    `act` is the gate's `probe.GateAct` module (so gate recorders see T); its `fn_name` is sigmoid or tanh.
    """
    if term not in GATE_TERMS:
        raise ValueError(f"gate_sum term={term!r} is not known (valid: {', '.join(GATE_TERMS)})")
    return _GateSum.apply(h, x, sub, act, term)


class _GateSum(torch.autograd.Function):
    """The pre-LayerNorm sum of a gate from h = proj(x) = [z1 | f] (B, T, 2d), x and sub, in few memory passes.

    Forward: T = psi(z1) through the GateAct module (so recorders see it), then
    out = x + sub + T * v with v = f, f - x or f - sub (the term), as one add and one in-place addcmul.
    Backward writes [psi'(T) * g * v | g * T] straight into one (B, T, 2d) gradient of h (no concatenation),
    and dx / dsub reuse g. About half the elementwise passes and allocations of the plain formula.
    """

    @staticmethod
    def forward(ctx, h, x, sub, act, term):
        d = x.shape[-1]
        z1, f = h[..., :d], h[..., d:]
        t = act(z1.detach())  # (B, T, d), the gate value (detached: module hooks see a plain tensor)
        v = f - x if term == "T*(f-x)" else f - sub if term == "T*(f-sub)" else f
        out = torch.add(x, sub)
        out.addcmul_(t, v)  # x + sub + T * v
        ctx.save_for_backward(t, v)
        ctx.term, ctx.fn, ctx.dtypes = term, act.fn_name, (h.dtype, x.dtype, sub.dtype)
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
        if ctx.term == "T*(f-x)":
            dx = g - df  # (1 - T) * g
        elif ctx.term == "T*(f-sub)":
            dsub = g - df
        return dh, dx.to(x_dtype), dsub.to(sub_dtype), None, None


# ----------------------------------------------------------------------------- Transformer-XL attention


def rel_attention(q: torch.Tensor, kv: torch.Tensor, rk: torch.Tensor, u: torch.Tensor, v: torch.Tensor,
                  mask: torch.Tensor, scale: float, p_drop: float = 0.0) -> torch.Tensor:
    """softmax(((q+u) k^T + rel_shift((q+v) rk^T)) * scale, mask) @ val, attention dropout p_drop.

    q (B, Q, H*dh), kv (B, K, 2*H*dh) = [k | val], rk (K, H*dh) as the linear layers give them; u, v (H, dh);
    mask (Q, K) bool, True = hidden. Returns (B, Q, H*dh). With gradients and no attention dropout: the
    hand-written `_RelAttnCore`; otherwise (inference, attention dropout) PyTorch's scaled_dot_product_attention
    with the position term BD as an additive bias.
    """
    if p_drop == 0.0 and torch.is_grad_enabled():
        return _RelAttnCore.apply(q, kv, rk, u, v, mask, scale)
    (B, Q, _), K, (H, dh) = q.shape, kv.shape[1], u.shape
    q = q.view(B, Q, H, dh).transpose(1, 2)  # (B, H, Q, dh)
    k, val = kv.view(B, K, 2, H, dh).permute(2, 0, 3, 1, 4)  # (B, H, K, dh) each
    rk = rk.view(K, H, dh).transpose(0, 1)  # (H, K, dh)
    bd = rel_shift(torch.matmul(q + v[:, None], rk.transpose(-1, -2)))  # (B, H, Q, K)
    bias = (bd * scale).masked_fill(mask, float("-inf")).to(q.dtype)
    out = F.scaled_dot_product_attention(q + u[:, None], k, val, attn_mask=bias, dropout_p=p_drop, scale=scale)
    return out.transpose(1, 2).reshape(B, Q, H * dh)  # (B, Q, H*dh)


def rel_attention_flex(q: torch.Tensor, kv: torch.Tensor, rk: torch.Tensor, u: torch.Tensor, v: torch.Tensor,
                       mask: torch.Tensor, scale: float) -> torch.Tensor:
    """`rel_attention` through FlexAttention (`torch.nn.attention.flex_attention`, Guessous et al. 2024): the
    content term AC is flex's own product of the queries q+u with the keys, the position term BD enters through a
    score modifier, and the mask through a block mask (blocks wholly hidden are skipped).

    q (B, Q, H*dh), kv (B, K, 2*H*dh) = [k | val], rk (K, H*dh), u, v (H, dh), mask (Q, K) bool (True = hidden)
    -> (B, Q, H*dh), as `rel_attention`. BD before the shift, (q+v) rk^T * scale (B, H, Q, K), is one matmul;
    the modifier reads it at the shifted column: score(i, j) += BD[i, Q-1-i+j] (`layers.rel_shift`: row Q-1-i+j
    of rk holds the distance M+i-j, M = K-Q), clamped into range where the mask hides (j > M+i). No attention
    dropout (the constructor refuses `attn_dropout` > 0 with it). Arithmetic in q's dtype (bf16 under autocast).

    Torch 2.13's FlexAttention has no backward on a CPU (its own NotImplementedError): there it computes
    inference only, and `RelMultiHeadAttn` refuses to train with it. Eager on a GPU it is torch's unfused
    reference; the fused kernel comes with `trainer.compile`. tests/test_flex_attention.py ties it to the core.
    """
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    (B, Q, _), K, (H, dh) = q.shape, kv.shape[1], u.shape
    with torch.autocast(q.device.type, enabled=False):
        dt = q.dtype
        q4 = q.view(B, Q, H, dh).transpose(1, 2)  # (B, H, Q, dh)
        k, val = kv.to(dt).view(B, K, 2, H, dh).permute(2, 0, 3, 1, 4)  # (B, H, K, dh) each
        rkh = rk.to(dt).view(K, H, dh).transpose(0, 1)  # (H, K, dh)
        bd = torch.matmul(q4 + v.to(dt)[:, None], rkh.transpose(-1, -2)) * scale  # BD before the shift, (B, H, Q, K)

        def add_bd(score, b, h, i, j):
            return score + bd[b, h, i, (Q - 1 - i + j).clamp(max=K - 1)]

        def visible(b, h, i, j):
            return ~mask[i, j]

        block = create_block_mask(visible, None, None, Q, K, device=q.device)
        out = flex_attention(q4 + u.to(dt)[:, None], k.contiguous(), val.contiguous(), score_mod=add_bd,
                             block_mask=block, scale=scale)  # (B, H, Q, dh)
    return out.transpose(1, 2).reshape(B, Q, H * dh)


class _RelAttnCore(torch.autograd.Function):
    """softmax(((q+u) k^T + rel_shift((q+v) rk^T)) / sqrt(dh), causal mask) @ val, training path.

    Inputs are the projections as the linear layers give them, q (B, Q, H*dh), kv (B, K, 2*H*dh)
    ([k | val]), rk (K, H*dh), and u, v (H, dh), mask (Q, K) bool (True = hidden); the gradients
    come back in those layouts. The autograd graph of the plain formula keeps and copies several
    (B, H, Q, K) tensors (pad, reshape, scale, mask, the math fallback of scaled_dot_product_attention
    when the bias needs a gradient). Here the forward keeps one (the probabilities); BD is computed
    head-major, (H, B*Q, dh) @ (H, dh, K), so no operand is expanded over the batch, and its shift is
    a strided view (`rel_shift` without the copies); the scale is applied to the small q. The
    backward un-shifts the score gradient with one copy into a padded buffer (the official pad trick
    run backwards). No attention dropout (`rel_attention` takes the other path for it).
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


# ----------------------------------------------------------------------------- R-Transformer local RNN


def local_rnn(x: torch.Tensor, rnn: torch.nn.Module, window: int) -> torch.Tensor:
    """The local RNN of `r_transformer.LocalRNN` (last hidden state of `rnn` over the `window` positions
    ending at each t, zero-padded before the start), with each position's input projection computed once.

    x (B, T, d); `rnn` the module's single-layer, batch-first nn.GRU or nn.LSTM, whose parameters are used as
    they are (weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0). The plain path runs the RNN over
    (B*T, window, d) windows, projecting every position `window` times; here x_j W_ih^T + b_ih is computed
    once per padded position, (B, T+window-1, G*d), and the window's step j reads the slice [j, j+T) of it,
    so only h W_hh^T runs per window step. The cell equations are torch's (GRU gates r, z, n with b_hn
    inside the r * (...) term; LSTM gates i, f, g, o); the first step starts from h = 0 (and c = 0), so
    its hidden product is just b_hh. Returns (B, T, d).
    """
    k = window
    w_ih, w_hh, b_ih, b_hh = rnn.weight_ih_l0, rnn.weight_hh_l0, rnn.bias_ih_l0, rnn.bias_hh_l0
    gi = F.linear(F.pad(x, (0, 0, k - 1, 0)), w_ih, b_ih)  # (B, T+k-1, G*d), padded rows = b_ih
    if isinstance(rnn, torch.nn.LSTM):
        return _LocalLSTM.apply(gi, w_hh, b_hh, k)
    return _LocalGRU.apply(gi, w_hh, b_hh, k)


def _save_recurrence(ctx, saved: list, k: int, w_hh: torch.Tensor, b_hh: torch.Tensor, w: torch.Tensor) -> None:
    """What the backward of a window recurrence needs: the per-step tensors, k, the parameters' dtypes, W_hh."""
    ctx.saved = saved  # tensors made here, not inputs: plain attributes are safe (no version checks needed)
    ctx.k, ctx.dtypes = k, (w_hh.dtype, b_hh.dtype)
    ctx.save_for_backward(w)


def _recurrence_grads(ctx, dh: torch.Tensor, gates: int):
    """The start of a window recurrence's backward: W_hh, the saved steps, k, dh in W_hh's dtype, zero gradients of
    gi (B, T+k-1, G*d), W_hh and b_hh, and the step buffer (B, T, G*d) for the gate gradients."""
    (w,) = ctx.saved_tensors
    B, T, d = dh.shape
    dh = dh.to(w.dtype)
    dgi = dh.new_zeros(B, T + ctx.k - 1, gates * d)
    buf = dh.new_empty(B, T, gates * d)
    return w, ctx.saved, ctx.k, dh, dgi, torch.zeros_like(w), dh.new_zeros(gates * d), buf


def _hidden_back(buf: torch.Tensor, h, w: torch.Tensor, dw: torch.Tensor, db: torch.Tensor, dh_direct=None):
    """Backward through one step's hidden product h W_hh^T + b_hh, with `buf` (B, T, G*d) its gradient: adds to db
    and dw; returns dh = dh_direct + buf W_hh (B, T, d), or None at the first step (h = 0: nothing before it)."""
    B, T, G = buf.shape
    g2 = buf.view(-1, G)  # (B*T, G*d)
    db += g2.sum(0)
    if h is None:
        return None
    d = h.shape[-1]
    dw.addmm_(g2.t(), h.reshape(-1, d))  # (G*d, d)
    out = torch.mm(g2, w) if dh_direct is None else torch.addmm(dh_direct.view(-1, d), g2, w)
    return out.view(B, T, d)


class _LocalGRU(torch.autograd.Function):
    """The window recurrence of the local GRU from the input projections gi (B, T+k-1, 3d): returns the last
    hidden state h_k (B, T, d) of the k steps, step j reading gi[:, j:j+T] (torch's cell: r, z, n with b_hn
    inside r * (...); h_0 = 0).

    Forward per step: one addmm (h W_hh^T + b_hh), one add and one sigmoid for [r | z], an addcmul and a tanh
    for n, an addcmul for h = n + z * (h - n). Backward writes [da_r | da_z | da_n] into one (B, T, 3d)
    buffer, adds it to the step's slice of d gi in place, turns its n part into d(h W_hh^T)_n = da_n * r, and
    runs one mm for dh and one addmm_ for d W_hh (autograd through the same loop zero-fills a copy of gi and
    concatenates the gate gradients at every step). Float arithmetic in gi's dtype (bf16 under autocast).
    """

    @staticmethod
    def forward(ctx, gi, w_hh, b_hh, k):
        B, Tp, G = gi.shape
        T, d = Tp - k + 1, G // 3
        w, b = w_hh.to(gi.dtype), b_hh.to(gi.dtype)
        saved = []  # per step: h_j (None for h_0 = 0), rz (B, T, 2d), n (B, T, d), gh_n (B, T, d) or (d,)
        h = None
        with torch.autocast(gi.device.type, enabled=False):
            for j in range(k):
                gij = gi[:, j:j + T]  # (B, T, 3d), a view
                gh = b if h is None else torch.addmm(b, h.reshape(-1, d), w.t()).view(B, T, G)  # (.., 3d)
                rz = torch.sigmoid(gij[..., :2 * d] + gh[..., :2 * d])  # (B, T, 2d): [r | z]
                gh_n = gh[..., 2 * d:]
                n = torch.tanh(torch.addcmul(gij[..., 2 * d:], rz[..., :d], gh_n))  # (B, T, d)
                z = rz[..., d:]
                h_new = n - z * n if h is None else torch.addcmul(n, z, h - n)  # (1 - z) n + z h
                saved.append((h, rz, n, gh_n))
                h = h_new
        _save_recurrence(ctx, saved, k, w_hh, b_hh, w)
        return h

    @staticmethod
    def backward(ctx, dh):
        w, saved, k, dh, dgi, dw, db, buf = _recurrence_grads(ctx, dh, 3)
        T, d = dh.shape[1:]
        # buf: [da_r | da_z | da_n], then [da_r | da_z | da_n * r]
        da_r, da_z, da_n = buf[..., :d], buf[..., d:2 * d], buf[..., 2 * d:]
        for j in reversed(range(k)):
            h, rz, n, gh_n = saved[j]
            r, z = rz[..., :d], rz[..., d:]
            dh_z = dh * z  # the direct path to h_j: d h_{j+1} / d h_j = z
            _ACT_GRAD["tanh"](dh - dh_z, n, grad_input=da_n)  # (1 - z) dh through tanh
            dz = dh * (h - n) if h is not None else (dh * n).neg_()
            _ACT_GRAD["sigmoid"](dz, z, grad_input=da_z)
            _ACT_GRAD["sigmoid"](da_n * gh_n, r, grad_input=da_r)
            dgi[:, j:j + T] += buf
            da_n.mul_(r)  # now d gh_n: buf holds d gh
            dh = _hidden_back(buf, h, w, dw, db, dh_z)  # dh_z + d gh W_hh
            if dh is None:
                break
        return dgi, dw.to(ctx.dtypes[0]), db.to(ctx.dtypes[1]), None


class _LocalLSTM(torch.autograd.Function):
    """The window recurrence of the local LSTM from the input projections gi (B, T+k-1, 4d): returns the last
    hidden state h_k (B, T, d) of the k steps (torch's cell: gates i, f, g, o; h_0 = c_0 = 0).

    Forward per step: one addmm (h W_hh^T + b_hh), one add, the activations in place on the step's (B, T, 4d)
    gate tensor, c = f * c + i * g, h = o * tanh(c). Backward writes the four pre-activation gradients into one
    (B, T, 4d) buffer, adds it to the step's slice of d gi in place and runs one mm for dh and one addmm_ for
    d W_hh, carrying dc. Float arithmetic in gi's dtype (bf16 under autocast).
    """

    @staticmethod
    def forward(ctx, gi, w_hh, b_hh, k):
        B, Tp, G = gi.shape
        T, d = Tp - k + 1, G // 4
        w, b = w_hh.to(gi.dtype), b_hh.to(gi.dtype)
        saved = []  # per step: h_j and c_j (None for the zero start), the activated gates (B, T, 4d), tanh(c)
        h = c = None
        with torch.autocast(gi.device.type, enabled=False):
            for j in range(k):
                a = gi[:, j:j + T] + (b if h is None else torch.addmm(b, h.reshape(-1, d), w.t()).view(B, T, G))
                a[..., :2 * d].sigmoid_()  # i, f
                a[..., 2 * d:3 * d].tanh_()  # g
                a[..., 3 * d:].sigmoid_()  # o
                i, f, g, o = a.split(d, dim=-1)
                c_new = i * g if c is None else torch.addcmul(i * g, f, c)  # (B, T, d)
                tc = torch.tanh(c_new)
                saved.append((h, c, a, tc))
                h, c = o * tc, c_new
        _save_recurrence(ctx, saved, k, w_hh, b_hh, w)
        return h

    @staticmethod
    def backward(ctx, dh):
        w, saved, k, dh, dgi, dw, db, buf = _recurrence_grads(ctx, dh, 4)
        T, d = dh.shape[1:]
        # buf: the pre-activation gradients [i | f | g | o], which are also those of the gates' hidden product
        da_i, da_f, da_g, da_o = buf.split(d, dim=-1)
        dc = None  # d loss / d c_{j+1} from the later steps
        for j in reversed(range(k)):
            h, c, a, tc = saved[j]
            i, f, g, o = a.split(d, dim=-1)
            _ACT_GRAD["sigmoid"](dh * tc, o, grad_input=da_o)
            dc_j = _ACT_GRAD["tanh"](dh * o, tc)  # through h = o * tanh(c)
            dc = dc_j if dc is None else dc_j.add_(dc)
            _ACT_GRAD["sigmoid"](dc * g, i, grad_input=da_i)
            _ACT_GRAD["tanh"](dc * i, g, grad_input=da_g)
            if c is None:
                da_f.zero_()  # c_0 = 0: the forget gate has no effect at the first step
            else:
                _ACT_GRAD["sigmoid"](dc * c, f, grad_input=da_f)
            dgi[:, j:j + T] += buf
            dh = _hidden_back(buf, h, w, dw, db)
            if dh is None:
                break
            dc = dc * f
        return dgi, dw.to(ctx.dtypes[0]), db.to(ctx.dtypes[1]), None


# ----------------------------------------------------------------------------- R-Transformer LayerNorm


def official_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * (x - mean) / (std + eps) + bias over the last dimension, std the UNBIASED standard deviation
    (`r_transformer.OfficialLayerNorm`). x (..., d) -> (..., d)."""
    return _OfficialLayerNorm.apply(x, weight, bias, eps)


class _OfficialLayerNorm(torch.autograd.Function):
    """The official R-Transformer LayerNorm in few memory passes.

    Forward: u = x - mean, std = ||u|| / sqrt(d - 1) (two-pass, as exact as torch.std and ~40x faster on
    CPU, where torch.std's last-dimension reduction is not vectorised), xhat = u / (std + eps), out = bias +
    xhat * weight. Backward, with s = std + eps and g' = g * weight:
        dx = (g' - mean(g')) / s - xhat * sum(g' * xhat) / ((d - 1) * std)
    (the second term is d std / dx = u / ((d - 1) std), which sums to 0 over the row), dweight = sum g * xhat,
    dbias = sum g over all rows. Autograd through the plain formula takes ~4x the time (broadcast division
    backward, torch.std and its backward).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        d = x.shape[-1]
        u = x - x.mean(-1, keepdim=True)  # (..., d)
        std = torch.linalg.vector_norm(u, dim=-1, keepdim=True).div_(math.sqrt(d - 1))  # (..., 1), unbiased
        rs = (std + eps).reciprocal_()  # (..., 1)
        xhat = u.mul_(rs)  # (..., d)
        ctx.save_for_backward(xhat, rs, std, weight)
        return torch.addcmul(bias, xhat, weight)

    @staticmethod
    def backward(ctx, g):
        xhat, rs, std, weight = ctx.saved_tensors
        d = xhat.shape[-1]
        dxhat = g * weight  # (..., d)
        dbias = g.reshape(-1, d).sum(0)
        dweight = (g * xhat).reshape(-1, d).sum(0)
        a = dxhat.mean(-1, keepdim=True)  # (..., 1)
        c = (dxhat * xhat).sum(-1, keepdim=True).div_(std).mul_(1.0 / (d - 1))  # (..., 1)
        dx = (dxhat - a).mul_(rs).sub_(xhat * c)
        return dx, dweight, dbias, None
