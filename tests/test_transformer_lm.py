"""TransformerLM (Transformer-L3): shapes, parameter counts, causality, overfitting, gates."""

import pytest
import torch
import torch.nn.functional as F

from conftest import n_params, overfit_one_batch
from highway_repro.errors import ConfigError
from highway_repro.models.layers import CausalSelfAttention, causal_mask
from highway_repro.models.probe import GateRecorder
from highway_repro.models.transformer_lm import TransformerLM

V, L, D, H, FF = 13, 2, 16, 4, 32


def tiny(**kw):
    args = dict(vocab_size=V, n_layers=L, d_model=D, n_heads=H, d_ff=FF, dropout=0.0)
    args.update(kw)
    return TransformerLM(**args)


def expected_params(v, layers, d, f, norm_position="post", gated_sublayers=0):
    emb = v * d + v  # tied embedding (V, d) + output bias (V)
    attn = 4 * d * d + 4 * d  # fused qkv d->3d plus output d->d, with biases
    ffn = 2 * d * f + f + d  # d->f and f->d, with biases
    lns = 2 * 2 * d  # two LayerNorms per block
    final_ln = 2 * d if norm_position == "pre" else 0
    gates = gated_sublayers * (2 * d * d + 2 * d)
    return emb + layers * (attn + ffn + lns) + final_ln + gates


@pytest.mark.parametrize("norm_position", ["post", "pre"])
@pytest.mark.parametrize("pos", ["sinusoidal", "learned", "none"])
def test_shapes(norm_position, pos):
    m = tiny(norm_position=norm_position, pos=pos, max_len=20)
    logits, mems = m(torch.randint(0, V, (3, 9)))
    assert logits.shape == (3, 9, V) and mems is None


def test_ungated_parameter_count_has_no_gate_parameters():
    assert n_params(tiny()) == expected_params(V, L, D, FF)
    assert n_params(tiny(norm_position="pre")) == expected_params(V, L, D, FF, norm_position="pre")
    assert n_params(tiny(pos="learned", max_len=20)) == expected_params(V, L, D, FF) + 20 * D
    assert n_params(tiny(tie_embeddings=False)) == expected_params(V, L, D, FF) + V * D
    assert not any("gate" in name for name, _ in tiny().named_parameters())
    assert n_params(tiny(gate_kind="sdu_tanh")) == expected_params(V, L, D, FF, gated_sublayers=2 * L)


def test_paper_size_char_ptb_counts():
    # char-PTB Transformer-L3: V=50, d=512, 8 heads, d_ff=2048, 3 blocks
    base = 50 * 512 + 50 + 3 * ((4 * 512 * 512 + 4 * 512) + (2 * 512 * 2048 + 2048 + 512) + 4 * 512)
    assert base == 9_482_802
    assert n_params(TransformerLM(50)) == base
    assert n_params(TransformerLM(50, gate_kind="sdu_sigmoid")) == base + 6 * (2 * 512 * 512 + 2 * 512)


@pytest.mark.parametrize("kind", ["sdu_sigmoid", "sdu_tanh", "highway", "gated_attn"])
def test_attention_only_gating_forward_backward(kind):
    m = tiny(gate_kind=kind, gate_sublayers="attn", dropout=0.1)
    x = torch.randint(0, V, (2, 7))
    logits, _ = m(x)
    F.cross_entropy(logits.reshape(-1, V), x.reshape(-1)).backward()
    for b in m.layers:
        assert b.ffn_gate is None
        assert b.attn_gate.proj.weight.grad is not None and b.attn_gate.proj.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_causal_no_leak_from_future(norm_position):
    torch.manual_seed(0)
    m = tiny(norm_position=norm_position, gate_kind="sdu_tanh").eval()
    x = torch.randint(0, V, (2, 12))
    x2 = x.clone()
    x2[:, 7] = (x[:, 7] + 1) % V
    with torch.no_grad():
        a, b = m(x)[0], m(x2)[0]
    assert torch.allclose(a[:, :7], b[:, :7], atol=1e-6)
    assert not torch.allclose(a[:, 7:], b[:, 7:], atol=1e-4)


def test_explicit_mask_equals_is_causal():
    torch.manual_seed(0)
    att = CausalSelfAttention(D, H).eval()
    x = torch.randn(2, 6, D)
    assert torch.allclose(att(x), att(x, attn_mask=causal_mask(6)), atol=1e-6)
    mask = causal_mask(3, 5)  # 2 memory positions, all visible to every query
    assert mask.tolist() == [[True, True, True, False, False], [True, True, True, True, False],
                             [True, True, True, True, True]]


@pytest.mark.parametrize("kind,norm_position", [("none", "post"), ("sdu_tanh", "post"), ("sdu_sigmoid", "pre")])
def test_overfits_one_batch(kind, norm_position):
    torch.manual_seed(0)
    m = tiny(gate_kind=kind, norm_position=norm_position, d_model=32, d_ff=64)
    losses = overfit_one_batch(m, torch.randint(0, V, (4, 17)))
    assert losses[-1] < 0.25 * losses[0], losses[::10]


def test_gate_recorder_sees_exactly_gated_sublayers():
    m = tiny(n_layers=4, gate_kind="sdu_tanh", gate_layers="2-3", gate_sublayers="attn")
    with GateRecorder(m) as rec:
        m(torch.randint(0, V, (2, 5)))
    assert set(rec.stats()) == {"layers.1.attn_gate.act", "layers.2.attn_gate.act"}
    m = tiny(gate_kind="highway")
    with GateRecorder(m) as rec:
        m(torch.randint(0, V, (2, 5)))
    assert set(rec.stats()) == {f"layers.{i}.{s}_gate.act" for i in range(L) for s in ("attn", "ffn")}
    assert all(0.0 < s["mean"] < 1.0 for s in rec.stats().values())


def test_any_sequence_length():
    m = tiny(gate_kind="sdu_tanh").eval()
    for t in (1, 5, 300):
        assert m(torch.randint(0, V, (1, t)))[0].shape == (1, t, V)


def test_learned_positions_reject_too_long():
    m = tiny(pos="learned", max_len=8)
    with pytest.raises(ValueError, match="T=9 exceeds max_len=8"):
        m(torch.randint(0, V, (1, 9)))


def test_option_errors():
    with pytest.raises(ConfigError, match=r"^model.n_heads=7 does not divide model.d_model=512 \(valid: a divisor"):
        TransformerLM(50, n_heads=7)
    with pytest.raises(ConfigError, match=r"^model.norm_position='mid' is not allowed \(valid: post, pre\)$"):
        tiny(norm_position="mid")
    with pytest.raises(ConfigError, match=r"^model.pos='rope' is not allowed \(valid: sinusoidal, learned, none\)$"):
        tiny(pos="rope")
    with pytest.raises(ConfigError, match=r"^model.max_len=None is not allowed with model.pos='learned'"):
        tiny(pos="learned")
    with pytest.raises(ConfigError, match=r"^model.d_model=15 is not allowed with model.pos='sinusoidal'"):
        tiny(d_model=15, n_heads=5)
    with pytest.raises(ConfigError, match=r"^model.dropout=1.5 is not allowed \(valid: a probability in \[0, 1\)\)$"):
        tiny(dropout=1.5)
    with pytest.raises(ConfigError, match=r"^model.d_ff=0 is not allowed \(valid: a positive integer\)$"):
        tiny(d_ff=0)
    with pytest.raises(ValueError, match="has no memory"):
        tiny()(torch.zeros(1, 3, dtype=torch.long), mems=[torch.zeros(1)])
