"""Gate formulas with hand-set weights, placement, error messages, parameter cost (gates.py)."""

import math

import pytest
import torch

from conftest import n_params
from highway_repro.models import gates
from highway_repro.models.transformer_lm import TransformerLM

D = 3
# fused projection d -> 2d: rows 0..2 are W1 (gate pre-activation), rows 3..5 are W2 (transform)
W = [[0.5, -1.0, 0.25],
     [1.5, 0.0, -0.5],
     [-0.75, 0.5, 1.0],
     [0.2, 0.4, -0.6],
     [-1.0, 0.3, 0.1],
     [0.0, 2.0, -0.5]]
BIAS = [0.1, -0.2, 0.3, 0.5, 0.0, -0.4]
X = [0.3, -1.2, 0.8]
SUB = [1.0, -0.5, 0.25]


def _sigmoid(z):
    return 1.0 / (1.0 + math.exp(-z))


def _tanh(z):
    return (math.exp(z) - math.exp(-z)) / (math.exp(z) + math.exp(-z))


def _expected(kind):
    """The pre-LayerNorm sum of gates.py's table, element by element in plain Python."""
    out = []
    for i in range(D):
        z1 = sum(W[i][j] * X[j] for j in range(D)) + BIAS[i]
        f = sum(W[D + i][j] * X[j] for j in range(D)) + BIAS[D + i]
        t = _tanh(z1) if kind == "sdu_tanh" else _sigmoid(z1)
        if kind in ("sdu_sigmoid", "sdu_tanh"):
            out.append(X[i] + SUB[i] + t * f)
        elif kind == "highway":
            out.append((1 - t) * X[i] + SUB[i] + t * f)
        elif kind == "gated_attn":
            out.append(X[i] + (1 - t) * SUB[i] + t * f)
    return out


@pytest.mark.parametrize("kind", ["sdu_sigmoid", "sdu_tanh", "highway", "gated_attn"])
def test_gate_formula_with_hand_set_weights(kind):
    gate = gates.make_gate(kind, D)
    with torch.no_grad():
        gate.proj.weight.copy_(torch.tensor(W, dtype=torch.float64))
        gate.proj.bias.copy_(torch.tensor(BIAS, dtype=torch.float64))
    x = torch.tensor(X).view(1, 1, D)
    sub = torch.tensor(SUB).view(1, 1, D)
    got = gate(x, sub).view(-1).tolist()
    assert got == pytest.approx(_expected(kind), abs=1e-6)
    assert gates.combine(gate, x, sub).view(-1).tolist() == pytest.approx(_expected(kind), abs=1e-6)


def test_none_gate_is_plain_residual_and_has_no_module():
    assert gates.make_gate("none", D) is None
    x, sub = torch.randn(2, 5, D), torch.randn(2, 5, D)
    assert torch.equal(gates.combine(None, x, sub), x + sub)


def test_gate_init_and_bias():
    gate = gates.make_gate("sdu_sigmoid", 4, gate_bias=-2.0)
    assert torch.all(gate.proj.bias[:4] == -2.0) and torch.all(gate.proj.bias[4:] == 0.0)
    assert gate.proj.weight.shape == (8, 4)


def _tiny(**kw):
    return TransformerLM(vocab_size=11, n_layers=6, d_model=8, n_heads=2, d_ff=16, dropout=0.0, **kw)


def _gated_layers(model, sub):
    return [i + 1 for i, b in enumerate(model.blocks) if getattr(b, f"{sub}_gate") is not None]


def test_layers_3_to_6_of_6_gates_exactly_those():
    m = _tiny(gate_kind="sdu_tanh", gate_layers=[3, 4, 5, 6])
    assert _gated_layers(m, "attn") == [3, 4, 5, 6]
    assert _gated_layers(m, "ffn") == [3, 4, 5, 6]
    assert m.placement == _tiny(gate_kind="sdu_tanh", gate_layers="3-6").placement
    assert gates.resolve_placement(6, "sdu_tanh", [3, 4, 5, 6]) == gates.resolve_placement(6, "sdu_tanh", "3-6")
    # the official code's prefix defect would have gated nothing here
    assert m.blocks[5].attn_gate.kind == "sdu_tanh"


def test_attention_only_and_ffn_only():
    m = _tiny(gate_kind="sdu_sigmoid", gate_sublayers="attn")
    assert _gated_layers(m, "attn") == [1, 2, 3, 4, 5, 6] and _gated_layers(m, "ffn") == []
    m = _tiny(gate_kind="sdu_sigmoid", gate_layers="1,2", gate_sublayers="ffn")
    assert _gated_layers(m, "attn") == [] and _gated_layers(m, "ffn") == [1, 2]


def test_per_layer_kind_list():
    kinds = ["none", "sdu_tanh", "sdu_sigmoid", "highway", "gated_attn", "none"]
    m = _tiny(gate_kind=kinds)
    got = [None if b.attn_gate is None else b.attn_gate.kind for b in m.blocks]
    assert got == [None, "sdu_tanh", "sdu_sigmoid", "highway", "gated_attn", None]
    # a list combined with a layer selection: only selected layers keep their kind
    m = _tiny(gate_kind=kinds, gate_layers="2-3")
    assert [None if b.ffn_gate is None else b.ffn_gate.kind for b in m.blocks] == \
        [None, "sdu_tanh", "sdu_sigmoid", None, None, None]


def test_error_messages():
    with pytest.raises(ValueError, match=r"gate[._]layers=\[7\] but the model has 6 layers \(valid: 1-6"):
        _tiny(gate_kind="sdu_tanh", gate_layers=[7])
    with pytest.raises(ValueError, match=r"gate[._]layers.*valid: 1-6"):
        _tiny(gate_kind="sdu_tanh", gate_layers="5-7")
    with pytest.raises(ValueError, match=r"gate[._]kind='sdu_relu' is not known \(valid: none, sdu_sigmoid"):
        _tiny(gate_kind="sdu_relu")
    with pytest.raises(ValueError, match=r"gate[._]sublayers='mlp' contains 'mlp' \(valid: 'both', 'attn', 'ffn'"):
        _tiny(gate_kind="sdu_tanh", gate_sublayers="mlp")
    with pytest.raises(ValueError, match=r"gate[._]kind has 2 entries but the model has 6 layers"):
        _tiny(gate_kind=["sdu_tanh", "none"])


@pytest.mark.parametrize("kind,layers,sublayers,n_gated", [
    ("sdu_tanh", "all", "both", 12),
    ("sdu_sigmoid", "3-6", "both", 8),
    ("highway", [1], "attn", 1),
    ("gated_attn", "2,4", "ffn", 2),
])
def test_gate_parameter_cost(kind, layers, sublayers, n_gated):
    d = 8
    base = n_params(_tiny())
    gated = n_params(_tiny(gate_kind=kind, gate_layers=layers, gate_sublayers=sublayers))
    assert gated - base == n_gated * (2 * d * d + 2 * d)
