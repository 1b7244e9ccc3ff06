"""Transformer-XL with self-gating units: memory, relative attention, gates, counts."""

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import n_params, overfit_one_batch
from highway_repro.models.probe import GateRecorder
from highway_repro.errors import ConfigError
from highway_repro.models.layers import rel_shift, sinusoidal_positions
from highway_repro.models.transformer_xl import TransformerXL

V = 23
TINY = dict(n_layers=2, d_model=16, n_heads=2, d_head=6, d_ff=24, dropout=0.0, attn_dropout=0.0)


def tiny(**kw) -> TransformerXL:
    torch.manual_seed(0)
    cfg = {**TINY, "tgt_len": 8, "mem_len": 8, **kw}
    return TransformerXL(V, **cfg)


def toks(b=2, t=8, seed=1):
    return torch.randint(0, V, (b, t), generator=torch.Generator().manual_seed(seed))


def nll(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


# ---- memory ------------------------------------------------------------------------------
def test_memory_shapes_grow_then_cap_and_are_detached():
    m = tiny(tgt_len=6, mem_len=10)
    x1, x2, x3 = toks(3, 6, 1), toks(3, 6, 2), toks(3, 6, 3)
    logits, mems = m(x1)
    assert logits.shape == (3, 6, V)
    assert len(mems) == m.n_layers and all(t.shape == (3, 6, 16) for t in mems)
    assert all(not t.requires_grad for t in mems)
    loss1 = nll(logits, x1)
    logits2, mems2 = m(x2, mems)
    assert all(t.shape == (3, 10, 16) for t in mems2)  # 6 + 6 capped at mem_len 10
    # the memory is the last mem_len layer inputs: its tail is the previous memory's tail
    assert torch.equal(mems2[1][:, :4], mems[1][:, 2:])
    _, mems3 = m(x3, mems2)
    assert all(t.shape == (3, 10, 16) for t in mems3)
    nll(logits2, x2).backward()
    loss1.backward()  # would fail (graph already freed) if segment 2's backward had entered segment 1


def test_memory_is_layer_input_and_empty_memory_forms():
    m = tiny(mem_len=8).eval()
    x = toks()
    _, mems = m(x)
    emb = m.tok_emb(x) * math.sqrt(m.d_model)
    torch.testing.assert_close(mems[0], emb)  # entry 0 = scaled embeddings (dropout off)
    a, _ = m(x, None)
    b, _ = m(x, [])
    c, _ = m(x, m.init_mems(2))
    assert torch.equal(a, b) and torch.equal(a, c)
    m0 = tiny(mem_len=0)
    _, mems0 = m0(x)
    assert all(t.shape == (2, 0, 16) for t in mems0)
    with pytest.raises(ValueError, match="mems has 1 entries"):
        m(x, mems[:1])


def test_segments_with_memory_equal_one_pass_full_context():
    L, S = 24, 8
    m = tiny(tgt_len=L, mem_len=L).eval()
    x = toks(2, L + 1, 5)
    inp, tgt = x[:, :-1], x[:, 1:]
    with torch.no_grad():
        full, _ = m(inp)
        mems, parts = None, []
        for s in range(0, L, S):
            lg, mems = m(inp[:, s:s + S], mems)
            parts.append(lg)
        seg = torch.cat(parts, 1)
    torch.testing.assert_close(seg, full, atol=1e-5, rtol=1e-5)
    assert abs(nll(seg, tgt).item() - nll(full, tgt).item()) < 1e-5


def test_eval_settings_split_long_input_into_eval_segments():
    m = tiny(tgt_len=8, mem_len=8, eval_tgt_len=4, eval_mem_len=12)
    x = toks(2, 8)
    _, mems = m(x)  # train: one segment of 8, mem_len 8
    assert mems[0].shape == (2, 8, 16)
    m.eval()
    assert (m.tgt_len, m.mem_len) == (4, 12)
    with torch.no_grad():
        once, mems = m(x)  # two segments of 4 inside, memory 4 + 4
        assert mems[0].shape == (2, 8, 16)
        a, ma = m(x[:, :4])
        b, _ = m(x[:, 4:], ma)
        _, mems = m(x, mems)
        assert mems[0].shape == (2, 12, 16)
    torch.testing.assert_close(once, torch.cat([a, b], 1), atol=1e-6, rtol=1e-6)
    m.train()
    assert (m.tgt_len, m.mem_len) == (8, 8)


# ---- relative attention --------------------------------------------------------------------
def naive_rel_attn(attn, h, u, v, q_len, clamp_len=-1, same_length_window=None):
    """Each score computed explicitly: ((q_i + u) k_j + (q_i + v) W_r R(dist)) / sqrt(dh)."""
    B, K, d = h.shape
    H, dh = attn.n_heads, attn.d_head
    M = K - q_len
    qkv = h @ attn.qkv.weight.t()
    q, k, val = qkv.view(B, K, 3, H, dh).unbind(2)  # (B, K, H, dh)
    out = torch.zeros(B, q_len, H, dh, dtype=h.dtype)
    for i in range(q_len):
        qi = q[:, M + i]  # (B, H, dh)
        scores = torch.full((B, H, K), float("-inf"), dtype=h.dtype)
        for j in range(K):
            dist = M + i - j
            if dist < 0 or (same_length_window is not None and dist >= same_length_window):
                continue
            dc = dist if clamp_len < 0 else min(dist, clamp_len)
            rj = (sinusoidal_positions(torch.tensor([float(dc)]), d).to(h.dtype) @ attn.r_proj.weight.t()).view(H, dh)
            scores[:, :, j] = (((qi + u) * k[:, j]).sum(-1) + ((qi + v) * rj).sum(-1)) / math.sqrt(dh)
        p = scores.softmax(-1)  # (B, H, K)
        out[:, i] = torch.einsum("bhj,bjhd->bhd", p, val)
    return attn.out(out.reshape(B, q_len, H * dh))


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("clamp_len,same_length", [(-1, False), (3, False), (-1, True)])
def test_rel_shift_attention_equals_naive_with_memory(fused, clamp_len, same_length):
    mem_len = 5
    m = tiny(mem_len=mem_len, clamp_len=clamp_len, same_length=same_length, fused=fused).double().eval()
    with torch.no_grad():
        m.r_w_bias.normal_(0, 1.0)  # make u, v matter
        m.r_r_bias.normal_(0, 1.0)
    attn = m.layers[0].attn
    B, M, Q = 2, mem_len, 4
    h = torch.randn(B, M + Q, 16, dtype=torch.float64)  # [mem; current]
    pos = torch.arange(M + Q - 1, -1, -1)
    if clamp_len > 0:
        pos = pos.clamp(max=clamp_len)
    r = sinusoidal_positions(pos, 16).double()
    mask = m._attn_mask(Q, M, "cpu")
    with torch.no_grad():
        fast = attn(h, r, m.r_w_bias, m.r_r_bias, mask)
        slow = naive_rel_attn(attn, h, m.r_w_bias, m.r_r_bias, Q, clamp_len,
                              mem_len if same_length else None)
    torch.testing.assert_close(fast, slow, atol=1e-10, rtol=1e-10)


def test_rel_shift_indexing():
    Q, K = 3, 5
    M = K - Q
    x = torch.arange(Q * K).view(1, Q, K)  # x[i, k] holds distance K-1-k
    y = rel_shift(x)
    for i in range(Q):
        for j in range(M + i + 1):
            assert y[0, i, j] == x[0, i, Q - 1 - i + j]  # distance M + i - j


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("kind", ["none", "sdu_tanh", "highway"])
def test_no_causal_leak_with_memory(norm, kind):
    m = tiny(norm=norm, gate_kind=kind, mem_len=6).eval()
    x0, x = toks(2, 8, 1), toks(2, 8, 2)
    with torch.no_grad():
        _, mems = m(x0)
        base, _ = m(x, mems)
        for t in (0, 3, 7):
            y = x.clone()
            y[:, t] = (y[:, t] + 1) % V
            out, _ = m(y, mems)
            torch.testing.assert_close(out[:, :t], base[:, :t], atol=0, rtol=0)
            assert (out[:, t] - base[:, t]).abs().max() > 1e-6


# ---- gates ------------------------------------------------------------------------------
def test_placement_gates_exactly_chosen_layers():
    m = TransformerXL(V, n_layers=6, d_model=16, n_heads=2, d_head=8, d_ff=32, tgt_len=8, mem_len=8,
                      gate_kind="sdu_tanh", gate_layers=[3, 4, 5, 6])
    assert m.gated_sublayers() == [(i, s) for i in (3, 4, 5, 6) for s in ("attn", "ffn")]
    for i, layer in enumerate(m.layers, start=1):
        assert (layer.attn_gate is not None) == (i >= 3) and (layer.ffn_gate is not None) == (i >= 3)
    with GateRecorder(m) as rec:
        m(toks())
    assert sorted(rec.stats()) == sorted(f"layers.{i}.{s}_gate.act" for i in (2, 3, 4, 5)
                                         for s in ("attn", "ffn"))


def test_attention_only_gating_runs():
    m = tiny(gate_kind="sdu_sigmoid", gate_sublayers="attn", mem_len=4)
    assert m.gated_sublayers() == [(1, "attn"), (2, "attn")]
    assert all(layer.ffn_gate is None for layer in m.layers)
    x = toks()
    logits, mems = m(x)
    logits, _ = m(x, mems)
    nll(logits, x).backward()
    assert m.layers[0].attn_gate.proj.weight.grad.abs().sum() > 0  # the attention gate is in the graph


def test_parameter_count_matches_formula():
    Vv, L, d, H, dh, di = 11, 2, 16, 2, 6, 40  # H * dh = 12 != d, allowed as in Transformer-XL
    kw = dict(n_layers=L, d_model=d, n_heads=H, d_head=dh, d_ff=di, tgt_len=4, mem_len=4)
    per_layer = (3 * H * dh * d  # q, k, v projections (no bias)   = 576
                 + H * dh * d  # r_proj (no bias)                  = 192
                 + H * dh * d  # out (no bias)                     = 192
                 + d * di + di + di * d + d  # FFN                  = 640 + 40 + 640 + 16
                 + 2 * 2 * d)  # two LayerNorms                     = 64
    assert per_layer == 576 + 192 + 192 + 1336 + 64 == 2360
    total = Vv * d + Vv + 2 * H * dh + L * per_layer  # tied embedding, softmax bias, u, v
    assert total == 176 + 11 + 24 + 4720 == 4931
    base = TransformerXL(Vv, **kw)
    assert n_params(base) == total
    assert n_params(TransformerXL(Vv, norm="pre", **kw)) == total + 2 * d  # final LayerNorm
    assert base.gated_sublayers() == []
    assert not any("gate" in n for n, _ in base.named_parameters())
    gate = 2 * d * d + 2 * d
    for kind, layers, subs, n in (("sdu_tanh", "all", "both", 4), ("sdu_sigmoid", [2], "both", 2),
                                  ("highway", "all", "attn", 2), ("gated_attn", "1", "ffn", 1)):
        g = TransformerXL(Vv, gate_kind=kind, gate_layers=layers, gate_sublayers=subs, **kw)
        assert n_params(g) - total == n * gate
    # the paper's enwik8 6-layer model, vocabulary 204
    paper = 204 * 512 + 204 + 2 * 512 + 6 * (5 * 512 * 512 + 2 * 512 * 2048 + 2048 + 512 + 4 * 512)
    assert paper == 20_580_556
    assert n_params(TransformerXL(204)) == paper
    assert n_params(TransformerXL(204, gate_kind="sdu_tanh")) == paper + 12 * (2 * 512 * 512 + 2 * 512)


def _naive_positions_f64(distances, d: int) -> torch.Tensor:
    """Vaswani et al. (2017) Sec. 3.5 written out in Python floats (float64): [sin | cos] of p / 10000^(2i/d)."""
    rows = [[math.sin(p / 10000 ** (2 * i / d)) for i in range(d // 2)] + [math.cos(p / 10000 ** (2 * i / d))
            for i in range(d // 2)] for p in distances]
    return torch.tensor(rows, dtype=torch.float64)


def test_float64_model_has_a_float64_position_table():
    """A float64 model is float64 throughout: its relative position table R too (an fp32 table is off by ~1e-7)."""
    m = tiny(mem_len=5).double().eval()
    seen = []
    m.layers[0].register_forward_pre_hook(lambda mod, args: seen.append(args[2]))  # layer(x, mem, r, ...)
    with torch.no_grad():
        _, mems = m(toks(2, 8))
        m(toks(2, 8, seed=2), mems)
    r = seen[-1]  # (K, d) with K = 5 memory + 8 current positions, distances 12 .. 0
    assert r.dtype == torch.float64 and r.shape == (13, 16)
    torch.testing.assert_close(r, _naive_positions_f64(range(12, -1, -1), 16), atol=1e-13, rtol=0)
    far = torch.arange(5000.0, 4990.0, -1.0, dtype=torch.float64)  # long distances: fp32 rounding is visible there
    torch.testing.assert_close(sinusoidal_positions(far, 16, torch.float64), _naive_positions_f64(far.tolist(), 16),
                               atol=1e-11, rtol=0)
    assert (sinusoidal_positions(far, 16) - _naive_positions_f64(far.tolist(), 16)).abs().max() > 1e-6
    assert sinusoidal_positions(far, 16).dtype == torch.float32


# ---- training ---------------------------------------------------------------------------
def test_overfit_one_batch():
    m = tiny(n_layers=2, d_model=32, n_heads=4, d_head=8, d_ff=64, tgt_len=16, mem_len=0,
             gate_kind="sdu_tanh")
    losses = overfit_one_batch(m, toks(4, 17, 9))
    assert losses[0] > 0.9 * math.log(V)
    assert losses[-1] < 0.25 * losses[0], losses[::10]


# ---- clamp_len, same_length ---------------------------------------------------------------
def test_clamp_len_changes_only_long_distances():
    x = toks(2, 8)

    def run(**kw):
        m = tiny(mem_len=0, **kw).eval()  # same seed: same weights
        for layer in m.layers:
            layer.attn.r_proj.weight.mul_(25.0)  # make the position term large
        return m(x)[0]

    with torch.no_grad():
        ref = run()
        same = run(clamp_len=7)  # max distance is 7: nothing clamped
        clamped = run(clamp_len=2)
    torch.testing.assert_close(same, ref, atol=0, rtol=0)
    torch.testing.assert_close(clamped[:, :3], ref[:, :3], atol=1e-6, rtol=1e-6)  # distances <= 2 only
    assert (clamped[:, 3:] - ref[:, 3:]).abs().max() > 1e-5


def test_same_length_hides_old_memory_from_later_positions():
    mem_len = 6
    m = tiny(n_layers=1, mem_len=mem_len, eval_same_length=True)  # train: off, eval: on; one layer
    # (with more layers, queries 0 and 1 carry slot 2 to later queries through the next layer)
    x0, x = toks(2, 8, 1), toks(2, 8, 2)
    with torch.no_grad():
        m.eval()
        _, mems = m(x0)
        assert mems[0].shape[1] == mem_len
        mask = m._attn_mask(8, mem_len, "cpu")
        assert (~mask).sum(1).tolist() == [mem_len] * 8  # every query sees exactly mem_len keys
        assert mask[0, 0] and not mask[0, 1]  # position 0 no longer sees the oldest slot
        poked = [t.clone() for t in mems]
        for t in poked:
            t[:, 2] += 1.0  # memory slot 2
        a, b = m(x, mems)[0], m(x, poked)[0]
        changed = (a - b).abs().amax(dim=(0, 2)) > 1e-6
        assert changed[:2].all() and not changed[2:].any()  # query i sees slots > i only
        m.train()  # dropout 0: only the setting differs
        assert not m._attn_mask(8, mem_len, "cpu")[:, :mem_len].any()
        a, b = m(x, mems)[0], m(x, poked)[0]
        assert ((a - b).abs().amax(dim=(0, 2)) > 1e-6).all()  # everyone sees all of memory


# ---- options ----------------------------------------------------------------------------
@pytest.mark.parametrize("kw,msg", [
    (dict(mem_len=-1), "mem_len=-1 is not allowed (valid: an integer >= 0)"),
    (dict(tgt_len=0), "tgt_len=0 is not allowed (valid: a positive integer)"),
    (dict(clamp_len=0), "clamp_len=0 is not allowed (valid: -1 (no clamping) or a positive integer)"),
    (dict(norm="mid"), "norm='mid' is not allowed (valid: post, pre)"),
    (dict(eval_mem_len=-2), "eval_mem_len=-2 is not allowed (valid: an integer >= 0, or null)"),
    (dict(mem_len=0, same_length=True), "same_length=True is not allowed with model.mem_len=0"),
    (dict(mem_len=3, eval_mem_len=0, eval_same_length=True), "eval_same_length=True is not allowed with"),
    (dict(d_model=15), "d_model=15 is not allowed (valid: an even positive integer"),
    (dict(dropout=1.0), "dropout=1.0 is not allowed (valid: a probability in [0, 1))"),
    (dict(tie_embeddings=False), "tie_embeddings=False is not allowed (valid: true"),
    (dict(d_ff=0), "d_ff=0 is not allowed (valid: a positive integer)"),
    (dict(gate_kind="sdu"), "gate_kind='sdu' is not known"), (dict(gate_layers=[7]), "gate_layers=[7] names layer 7"),
])
def test_invalid_options_raise(kw, msg):
    with pytest.raises(ConfigError, match="^model." + msg.replace("(", r"\(").replace("[", r"\[")
                       .replace(")", r"\)")):
        TransformerXL(V, **{**TINY, "tgt_len": 8, "mem_len": 8, **kw})
