"""The speed paths equal the plain formulas: the kernels of models/kernels.py (built with fused=True) against
the plain code of the model files (fused=False), in values and gradients; the byte tokenizer's fast paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from conftest import needs_mirror
from highway_repro.data.tokenizers import ByteTokenizer, _byte_counts
from highway_repro.engine import checkpoint as ckpt_lib
from highway_repro.models import gates, kernels
from highway_repro.models.r_transformer import LocalRNN, OfficialLayerNorm, RTransformer
from highway_repro.models.transformer_lm import TransformerLM
from highway_repro.models.transformer_xl import TransformerXL

KINDS = [k for k in gates.GATE_KINDS if gates.is_gated(k)]


def _run(module, inputs):
    """Output and the gradients of every parameter and input of sum(out^2)."""
    module.zero_grad()
    for x in inputs:
        x.grad = None
    out = module(*inputs)
    out = out[0] if isinstance(out, tuple) else out
    out.pow(2).sum().backward()
    return out.detach(), [p.grad.clone() for p in module.parameters()] + [x.grad.clone() for x in inputs
                                                                          if x.grad is not None]


def _assert_same(fast, plain, atol):
    torch.testing.assert_close(fast[0], plain[0], atol=atol, rtol=0)
    assert len(fast[1]) == len(plain[1])
    for a, b in zip(fast[1], plain[1]):
        torch.testing.assert_close(a, b, atol=atol, rtol=0)


def _pair(build):
    """The same model (same seed, same weights) with the kernels and with the plain formulas, in float64."""
    torch.manual_seed(0)
    fast = build(fused=True).double()
    torch.manual_seed(0)
    plain = build(fused=False).double()
    for a, b in zip(fast.parameters(), plain.parameters()):
        assert torch.equal(a, b)
    return fast, plain


@pytest.mark.parametrize("kind", KINDS)
def test_gate_kernel_gradcheck_and_equals_plain(kind):
    fast, plain = _pair(lambda fused: gates.make_gate(kind, 5, gate_bias=0.3, fused=fused))
    assert fast.fused_term is not None  # every built-in kind has a kernel
    x = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    sub = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: fast(a, b), (x, sub))
    _assert_same(_run(fast, [x, sub]), _run(plain, [x, sub]), atol=1e-12)


def test_gate_kernel_rejects_an_unknown_term():
    with pytest.raises(ValueError, match=r"term='T\*g' is not known"):
        kernels.gate_sum(torch.zeros(1, 1, 4), torch.zeros(1, 1, 2), torch.zeros(1, 1, 2), None, "T*g")


def test_fused_gate_in_a_model_under_bf16_autocast():
    """Under bf16 autocast the fused gate gives the plain formula's logits and fp32 gradients, to bf16 rounding."""
    torch.manual_seed(0)
    fast, plain = (TransformerLM(11, n_layers=2, d_model=8, n_heads=2, d_ff=16, dropout=0.0, gate_kind="highway",
                                 fused=f) for f in (True, False))
    plain.load_state_dict(fast.state_dict())
    x = torch.randint(0, 11, (2, 6))
    out = []
    for m in (fast, plain):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, _ = m(x)
        logits.float().sum().backward()
        assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in m.parameters())
        out.append((logits.float(), [p.grad for p in m.parameters()]))
    torch.testing.assert_close(out[0][0], out[1][0], atol=1e-2, rtol=0)
    for a, b in zip(out[0][1], out[1][1]):
        torch.testing.assert_close(a, b, atol=5e-2, rtol=2e-2)  # bf16 rounding: 0.016 of up to 13 measured


@pytest.mark.parametrize("kind", ["none", *KINDS])
def test_transformer_lm_and_r_transformer_fused_equal_plain(kind):
    x = torch.randint(0, 11, (2, 6))
    per_layer = [kind, "none", "sdu_tanh"]  # a list of kinds, so the kernels meet an ungated layer too
    for build in (lambda fused: TransformerLM(11, n_layers=3, d_model=8, n_heads=2, d_ff=16, dropout=0.0,
                                              gate_kind=per_layer, fused=fused),
                  lambda fused: RTransformer(11, n_layers=3, d_model=8, n_heads=2, d_ff=16, window=3, dropout=0.0,
                                             emb_dropout=0.0, gate_kind=per_layer, fused=fused)):
        fast, plain = _pair(build)
        _assert_same(_run(fast, [x]), _run(plain, [x]), atol=1e-12)


def _local_rnn_reference(x, rnn, window):
    """The local RNN step by step: for each t, the window x[t-window+1..t] (zeros before the start) fed one
    position at a time to an nn.GRUCell / nn.LSTMCell holding `rnn`'s own parameter tensors; the last h."""
    B, T, d = x.shape
    cell = (nn.LSTMCell if isinstance(rnn, nn.LSTM) else nn.GRUCell)(d, d).to(x.dtype)
    for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        setattr(cell, name, getattr(rnn, name + "_l0"))  # the same Parameters: gradients land on rnn
    outs = []
    for t in range(T):
        h = c = x.new_zeros(B, d)
        for s in range(t - window + 1, t + 1):
            xs = x[:, s] if s >= 0 else x.new_zeros(B, d)
            if isinstance(cell, nn.LSTMCell):
                h, c = cell(xs, (h, c))
            else:
                h = cell(xs, h)
        outs.append(h)
    return torch.stack(outs, 1)  # (B, T, d)


@pytest.mark.parametrize("rnn", ["gru", "lstm"])
@pytest.mark.parametrize("window", [1, 2, 3, 4])
@pytest.mark.parametrize("T", [1, 3, 6])
def test_local_rnn_kernel_and_plain_equal_step_by_step_reference(rnn, window, T):
    torch.manual_seed(window * 10 + T)
    fast, plain = _pair(lambda fused: LocalRNN(5, rnn, window, fused=fused))
    assert fast.fused and not plain.fused
    x = torch.randn(3, T, 5, dtype=torch.float64, requires_grad=True)
    out = _local_rnn_reference(x, plain.rnn, window)  # the gradients land on plain's parameters
    out.pow(2).sum().backward()
    ref = out.detach(), [p.grad.clone() for p in plain.parameters()] + [x.grad.clone()]
    _assert_same(_run(fast, [x]), ref, atol=1e-12)
    _assert_same(_run(plain, [x]), ref, atol=1e-12)


@pytest.mark.parametrize("window", [1, 3])
@pytest.mark.parametrize("fn,gates", [(kernels._LocalGRU, 3), (kernels._LocalLSTM, 4)])
def test_local_rnn_recurrence_gradcheck(fn, gates, window):
    torch.manual_seed(window)
    d, T = 3, 4
    args = [torch.randn(2, T + window - 1, gates * d), torch.randn(gates * d, d), torch.randn(gates * d)]
    args = [a.double().requires_grad_() for a in args]
    assert torch.autograd.gradcheck(lambda *a: fn.apply(*a, window), args)


def test_official_layer_norm_kernel_gradcheck_and_equals_plain():
    torch.manual_seed(0)
    fast, plain = _pair(lambda fused: OfficialLayerNorm(6, fused=fused))
    with torch.no_grad():  # weights and bias away from 1 / 0, so that their gradients are checked too
        for m in (fast, plain):
            m.weight.copy_(torch.linspace(-1.5, 2.0, 6, dtype=torch.float64))
            m.bias.copy_(torch.linspace(0.3, -0.4, 6, dtype=torch.float64))
    x = torch.randn(2, 5, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, w, b: kernels.official_layer_norm(a, w, b, 1e-6),
                                    (x, fast.weight.detach().requires_grad_(), fast.bias.detach().requires_grad_()))
    _assert_same(_run(fast, [x]), _run(plain, [x]), atol=1e-12)


@pytest.mark.parametrize("rnn", ["gru", "lstm"])
def test_local_rnn_kernel_runs_under_bf16_autocast(rnn):
    torch.manual_seed(0)
    fast, plain = LocalRNN(8, rnn, 3, fused=True), LocalRNN(8, rnn, 3)
    plain.load_state_dict(fast.state_dict())
    x = torch.randn(2, 5, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fast(x)
    out.float().pow(2).sum().backward()  # the gradients come back in the parameters' dtype
    ref = plain(x)
    ref.pow(2).sum().backward()
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=0)
    for a, b in zip(fast.parameters(), plain.parameters()):
        assert a.grad.dtype == torch.float32
        torch.testing.assert_close(a.grad, b.grad, atol=0.1, rtol=0.1)


def _mask(q, k, window=None):
    pq, pk = torch.arange(q)[:, None] + (k - q), torch.arange(k)[None, :]
    mask = pk > pq
    return mask | (pk <= pq - window) if window else mask


@pytest.mark.parametrize("q,k,window", [(4, 7, None), (3, 3, None), (5, 9, 3), (1, 4, None)])
def test_rel_attn_core_gradcheck(q, k, window):
    torch.manual_seed(0)
    H, dh = 3, 4
    args = [torch.randn(2, q, H * dh), torch.randn(2, k, 2 * H * dh), torch.randn(k, H * dh),
            torch.randn(H, dh), torch.randn(H, dh)]
    args = [a.double().requires_grad_() for a in args]
    assert torch.autograd.gradcheck(lambda *a: kernels._RelAttnCore.apply(*a, _mask(q, k, window), 0.5), args)


@pytest.mark.parametrize("kw", [{}, {"clamp_len": 3}, {"same_length": True},
                                {"norm_position": "pre", "gate_kind": "sdu_tanh"},
                                {"gate_kind": ["highway", "gated_attn"]}])
def test_transformer_xl_fused_equals_plain_with_memory(kw):
    """Training (the hand-written core) and inference (scaled_dot_product_attention with BD as a bias) paths."""
    fast, plain = _pair(lambda fused: TransformerXL(13, n_layers=2, d_model=16, n_heads=2, d_head=8, d_ff=32,
                                                    dropout=0.0, tgt_len=6, mem_len=5, fused=fused, **kw))
    with torch.no_grad():
        for m in (fast, plain):
            m.r_w_bias.copy_(torch.linspace(-1, 1, 16).view(2, 8))  # make u, v matter
            m.r_r_bias.copy_(torch.linspace(1, -1, 16).view(2, 8))
    x = torch.randint(0, 13, (2, 6))
    mems = [torch.randn(2, 5, 16, dtype=torch.float64) for _ in range(2)]

    def run(m):
        m.zero_grad()
        logits, _ = m(x, mems=mems)
        logits.pow(2).sum().backward()
        return logits.detach(), [p.grad.clone() for p in m.parameters()]

    _assert_same(run(fast), run(plain), atol=1e-10)
    with torch.no_grad():
        for m in (fast, plain):
            m.eval()
        torch.testing.assert_close(fast(x, mems=mems)[0], plain(x, mems=mems)[0], atol=1e-12, rtol=0)


@pytest.mark.parametrize("n", [0, 1, 7, 4096])
def test_byte_counts_equal_bincount(n):
    a = np.random.default_rng(n).integers(0, 256, n).astype(np.uint8)
    assert np.array_equal(_byte_counts(a), np.bincount(a, minlength=256))


def test_byte_tokenizer_translate_path_equals_table_lookup():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 200, 50_001).astype(np.uint8)
    a[::97] = 10  # newlines
    drop = ByteTokenizer.fit([a], "drop")
    ref = drop._table[a[a != 10]]
    for data in (a, a.tobytes(), bytearray(a.tobytes())):
        ids = drop.encode(data)
        assert ids.dtype == np.uint8 and ids.flags.writeable and np.array_equal(ids, ref)
    keep = ByteTokenizer.fit([a], "keep")
    assert np.array_equal(keep.encode(a), a) and keep.vocab_size == 256
    with pytest.raises(ValueError, match=r"not in the vocabulary: \[250\]"):
        drop.encode(np.array([250, 10, 3], np.uint8))


@needs_mirror
def test_deferred_nan_check_stops_like_the_per_step_check(tmp_path, monkeypatch):
    """The no-sync check of CUDA (forced on here) ends a diverging run exactly as the per-step check."""
    import json

    from conftest import compose
    from highway_repro.engine.trainer import Trainer
    from highway_repro.train import run

    original = Trainer._forward

    def nan_from_step_5(self, batch, mems, score_len):
        loss, sums, new_mems = original(self, batch, mems, score_len)
        if self.model.training and self.step >= 5:
            loss = loss * float("nan")
        return loss, sums, new_mems

    monkeypatch.setattr(Trainer, "_forward", nan_from_step_5)
    cfg = compose(["experiment=demo", "scale=smoke", "model.depth=3", "trainer.max_steps=12", "trainer.log_every=4",
                   "trainer.checkpoint_every=4", "trainer.eval_every=0", "logger=jsonl"])
    outs = {}
    for defer in (False, True):
        monkeypatch.setattr(Trainer, "defer_nan_check", defer)
        out = tmp_path / str(defer)
        out.mkdir()
        final = run(cfg, out)
        outs[defer] = ({k: v for k, v in final.items() if not k.startswith("time/")},
                       [{k: v for k, v in json.loads(x).items() if not k.startswith("perf/")}
                        for x in (out / "metrics.jsonl").read_text().splitlines()],
                       ckpt_lib.load(out / "ckpt" / "last.pt")["step"])
    assert outs[True][0]["status"] == "diverged" and outs[True][0]["step"] == 5
    assert "at step 5" in outs[True][0]["error"] and outs[True][2] == 4
    assert outs[True] == outs[False]


@pytest.mark.parametrize("build", [
    lambda: TransformerLM(vocab_size=37, n_layers=2, d_model=16, n_heads=2, d_ff=32, dropout=0.0),
    lambda: RTransformer(vocab_size=37, n_layers=2, d_model=16, n_heads=2, d_ff=32, rnn="gru", window=3,
                         dropout=0.0, emb_dropout=0.0),
    lambda: TransformerXL(vocab_size=37, n_layers=2, d_model=16, n_heads=2, d_head=8, d_ff=32, dropout=0.0,
                          tgt_len=5, mem_len=5),
])
def test_head_on_scored_positions_equals_the_slice_of_all_logits(build):
    # score_len runs the head on the last positions only: the same logits as slicing the full output,
    # and the same gradients of a loss on them
    torch.manual_seed(0)
    model = build()
    tokens = torch.randint(0, 37, (3, 10))
    full, _ = model(tokens)
    part, _ = model(tokens, score_len=4)
    assert part.shape == (3, 4, 37)
    torch.testing.assert_close(part, full[:, -4:], atol=1e-6, rtol=0)
    g_full = torch.autograd.grad(full[:, -4:].logsumexp(-1).sum(), list(model.parameters()), allow_unused=True)
    g_part = torch.autograd.grad(part.logsumexp(-1).sum(), list(model.parameters()), allow_unused=True)
    for a, b in zip(g_part, g_full):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
