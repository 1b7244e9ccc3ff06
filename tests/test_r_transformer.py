"""RTransformer: local RNN vs a step-by-step loop, shapes, parameter counts, causality, overfitting, gates."""

import pytest
import torch
import torch.nn.functional as F

from conftest import n_params, overfit_one_batch
from highway_repro.errors import ConfigError
from highway_repro.models.probe import GateRecorder
from highway_repro.models.r_transformer import LocalRNN, OfficialLayerNorm, RTransformer

V, L, D, H, FF, K = 13, 2, 16, 4, 32, 3


def tiny(**kw):
    args = dict(vocab_size=V, n_layers=L, d_model=D, n_heads=H, d_ff=FF, window=K, dropout=0.0,
                emb_dropout=0.0)
    args.update(kw)
    return RTransformer(**args)


def expected_params(v, layers, d, f, rnn="gru", rnn_layers=1, final_norm=False, gated_sublayers=0):
    emb = v * d + v  # tied embedding (V, d) + output bias (V)
    g = {"gru": 3, "lstm": 4}[rnn]  # gates of the RNN cell
    local_rnn = g * (d * d + d * d + d + d) + 2 * d  # W_ih, W_hh, b_ih, b_hh per gate; its LayerNorm
    attn = 4 * d * d + 4 * d  # fused qkv d->3d plus output d->d, with biases
    ffn = 2 * d * f + f + d
    lns = 2 * 2 * d  # LayerNorms before attention and FFN
    gates = gated_sublayers * (2 * d * d + 2 * d)
    return emb + layers * (rnn_layers * local_rnn + attn + ffn + lns) + (2 * d if final_norm else 0) + gates


def naive_local_rnn(local: LocalRNN, x: torch.Tensor) -> torch.Tensor:
    """Position by position, step by step through each window with an explicit hidden state."""
    B, T, C = x.shape
    k = local.window
    outs = []
    for t in range(T):
        state = None
        h = torch.zeros(B, C)
        for s in range(t - k + 1, t + 1):
            inp = x[:, s:s + 1] if s >= 0 else torch.zeros(B, 1, C)  # zero padding before the start
            out, state = local.rnn(inp, state)
            h = out[:, 0]
        outs.append(h)
    return torch.stack(outs, dim=1)  # (B, T, C)


@pytest.mark.parametrize("rnn", ["gru", "lstm"])
@pytest.mark.parametrize("window,T", [(3, 7), (9, 5), (1, 4), (4, 4)])
def test_batched_local_rnn_equals_loop(rnn, window, T):
    torch.manual_seed(0)
    local = LocalRNN(D, rnn, window)
    x = torch.randn(2, T, D)
    with torch.no_grad():
        assert torch.allclose(local(x), naive_local_rnn(local, x), atol=1e-5)


@pytest.mark.parametrize("rnn", ["gru", "lstm"])
def test_shapes(rnn):
    logits, mems = tiny(rnn=rnn, rnn_layers_per_block=2)(torch.randint(0, V, (3, 9)))
    assert logits.shape == (3, 9, V) and mems is None


@pytest.mark.parametrize("norm_impl", ["official", "torch"])
def test_ungated_parameter_count_has_no_gate_parameters(norm_impl):
    assert n_params(tiny(norm_impl=norm_impl)) == expected_params(V, L, D, FF)
    assert n_params(tiny(norm_impl=norm_impl, rnn="lstm", rnn_layers_per_block=2)) == \
        expected_params(V, L, D, FF, "lstm", 2)
    assert n_params(tiny(norm_impl=norm_impl, final_norm=True)) == expected_params(V, L, D, FF, final_norm=True)
    assert not any("gate" in name for name, _ in tiny().named_parameters())
    assert n_params(tiny(gate_kind="sdu_tanh")) == expected_params(V, L, D, FF, gated_sublayers=2 * L)


@pytest.mark.parametrize("norm_impl", ["official", "torch"])
def test_paper_size_word_ptb_counts(norm_impl):
    # word-PTB R-Transformer-L3: V=10,000, d=128, 8 heads, d_ff=512, LSTM window 9, 3 layers
    d, f = 128, 512
    layer = (4 * (2 * d * d + 2 * d) + 2 * d) + (4 * d * d + 4 * d) + (2 * d * f + f + d) + 4 * d
    base = 10_000 * d + 10_000 + 3 * layer  # the official model: no final LayerNorm
    assert base == 2_281_872
    assert n_params(RTransformer(10_000, rnn="lstm", norm_impl=norm_impl)) == base
    assert n_params(RTransformer(10_000, rnn="lstm", norm_impl=norm_impl, final_norm=True)) == base + 2 * d
    assert n_params(RTransformer(10_000, rnn="lstm", norm_impl=norm_impl, gate_kind="sdu_tanh")) == \
        base + 6 * (2 * d * d + 2 * d)


@pytest.mark.parametrize("fused", [False, True])
def test_official_layer_norm_by_hand(fused):
    """a * (x - mean) / (std + 1e-6) + b with the UNBIASED std (the R-Transformer code), element by element;
    the plain formula and the kernel."""
    x = [1.0, -2.0, 0.5, 4.0]
    a, b = [0.5, 2.0, -1.0, 1.5], [0.1, 0.0, -0.3, 0.2]
    n = len(x)
    mean = sum(x) / n
    std = (sum((v - mean) ** 2 for v in x) / (n - 1)) ** 0.5  # unbiased: n - 1
    expected = [a[i] * (x[i] - mean) / (std + 1e-6) + b[i] for i in range(n)]
    ln = OfficialLayerNorm(n, fused=fused).double()
    with torch.no_grad():
        ln.weight.copy_(torch.tensor(a, dtype=torch.float64))
        ln.bias.copy_(torch.tensor(b, dtype=torch.float64))
    got = ln(torch.tensor(x, dtype=torch.float64).view(1, 1, n)).view(-1).tolist()
    assert got == pytest.approx(expected, abs=1e-12)
    # not nn.LayerNorm: that divides by sqrt(biased variance + eps)
    torch_ln = torch.nn.functional.layer_norm(torch.tensor(x, dtype=torch.float64), (n,))
    assert max(abs(torch_ln[i].item() - (x[i] - mean) / (std + 1e-6)) for i in range(n)) > 0.1


@pytest.mark.parametrize("norm_impl,cls", [("official", OfficialLayerNorm), ("torch", torch.nn.LayerNorm)])
def test_norm_impl_sets_every_layer_norm(norm_impl, cls):
    m = tiny(norm_impl=norm_impl, final_norm=True, rnn_layers_per_block=2)
    norms = [mod for mod in m.modules() if isinstance(mod, (OfficialLayerNorm, torch.nn.LayerNorm))]
    assert len(norms) == L * (2 + 2) + 1  # per layer: 2 before the RNNs, before attention and FFN; final
    assert all(type(n) is cls for n in norms)
    assert tiny(norm_impl=norm_impl).ln_final is None  # final_norm=False: the official model


def test_attention_only_gating_forward_backward():
    m = tiny(gate_kind="sdu_tanh", gate_sublayers="attn", dropout=0.2, emb_dropout=0.1)
    x = torch.randint(0, V, (2, 7))
    logits, _ = m(x)
    F.cross_entropy(logits.reshape(-1, V), x.reshape(-1)).backward()
    for b in m.layers:
        assert b.ffn_gate is None
        assert b.attn_gate.proj.weight.grad.abs().sum() > 0
    assert all(p.grad is not None for p in m.parameters())


def test_local_rnn_sublayer_is_never_gated():
    m = tiny(gate_kind="sdu_sigmoid")
    assert {n.split(".")[2] for n, _ in m.named_modules() if n.endswith("_gate")} == {"attn_gate", "ffn_gate"}
    assert not any("gate" in n for n, _ in m.layers[0].rnns.named_modules())


@pytest.mark.parametrize("rnn", ["gru", "lstm"])
def test_causal_no_leak_from_future(rnn):
    torch.manual_seed(0)
    m = tiny(rnn=rnn, gate_kind="sdu_tanh").eval()
    x = torch.randint(0, V, (2, 12))
    x2 = x.clone()
    x2[:, 7] = (x[:, 7] + 1) % V
    with torch.no_grad():
        a, b = m(x)[0], m(x2)[0]
    assert torch.allclose(a[:, :7], b[:, :7], atol=1e-6)
    assert not torch.allclose(a[:, 7:], b[:, 7:], atol=1e-4)


@pytest.mark.parametrize("kind,rnn", [("none", "gru"), ("sdu_tanh", "lstm")])
def test_overfits_one_batch(kind, rnn):
    torch.manual_seed(0)
    m = tiny(gate_kind=kind, rnn=rnn, d_model=32, d_ff=64)
    losses = overfit_one_batch(m, torch.randint(0, V, (4, 17)))
    assert losses[-1] < 0.25 * losses[0], losses[::10]


def test_gate_recorder_sees_exactly_gated_sublayers():
    m = tiny(n_layers=3, gate_kind=["sdu_tanh", "none", "sdu_sigmoid"], gate_sublayers="ffn")
    with GateRecorder(m) as rec:
        m(torch.randint(0, V, (2, 5)))
    assert set(rec.stats()) == {"layers.0.ffn_gate.act", "layers.2.ffn_gate.act"}


def test_any_sequence_length():
    m = tiny(gate_kind="sdu_sigmoid").eval()
    for t in (1, 2, 500):
        assert m(torch.randint(0, V, (1, t)))[0].shape == (1, t, V)


def test_option_errors():
    with pytest.raises(ConfigError, match=r"^model.n_heads=7 does not divide model.d_model=128 \(valid: a divisor"):
        RTransformer(100, n_heads=7)
    with pytest.raises(ConfigError, match=r"^model.rnn='rnn' is not allowed \(valid: gru, lstm\)$"):
        tiny(rnn="rnn")
    with pytest.raises(ConfigError, match=r"^model.window=0 is not allowed \(valid: a positive integer\)$"):
        tiny(window=0)
    with pytest.raises(ConfigError, match=r"^model.rnn_layers_per_block=0 is not allowed \(valid: a positive integer"):
        tiny(rnn_layers_per_block=0)
    with pytest.raises(ConfigError, match=r"^model.emb_dropout=-0.1 is not allowed \(valid: a probability in"):
        tiny(emb_dropout=-0.1)
    with pytest.raises(ConfigError, match=r"^model.norm_impl='nn' is not allowed \(valid: official, torch\)$"):
        tiny(norm_impl="nn")
    with pytest.raises(ConfigError, match=r"^model.final_norm='no' is not allowed \(valid: true or false\)$"):
        tiny(final_norm="no")
