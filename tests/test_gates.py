"""Gate formulas with hand-set weights, placement, error messages, parameter cost, the registry (gates.py)."""

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import n_params
from highway_repro.errors import ConfigError
from highway_repro.models import gates, placement
from highway_repro.models.probe import GateRecorder
from highway_repro.models.r_transformer import RTransformer
from highway_repro.models.transformer_lm import TransformerLM
from highway_repro.models.transformer_xl import TransformerXL

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
    return [i + 1 for i, b in enumerate(model.layers) if getattr(b, f"{sub}_gate") is not None]


def test_layers_3_to_6_of_6_gates_exactly_those():
    m = _tiny(gate_kind="sdu_tanh", gate_layers=[3, 4, 5, 6])
    assert _gated_layers(m, "attn") == [3, 4, 5, 6]
    assert _gated_layers(m, "ffn") == [3, 4, 5, 6]
    assert m.placement == _tiny(gate_kind="sdu_tanh", gate_layers="3-6").placement
    assert gates.resolve_placement(6, "sdu_tanh", [3, 4, 5, 6]) == gates.resolve_placement(6, "sdu_tanh", "3-6")
    # the official code's prefix defect would have gated nothing here
    assert m.layers[5].attn_gate.kind == "sdu_tanh"


def test_attention_only_and_ffn_only():
    m = _tiny(gate_kind="sdu_sigmoid", gate_sublayers="attn")
    assert _gated_layers(m, "attn") == [1, 2, 3, 4, 5, 6] and _gated_layers(m, "ffn") == []
    m = _tiny(gate_kind="sdu_sigmoid", gate_layers="1,2", gate_sublayers="ffn")
    assert _gated_layers(m, "attn") == [] and _gated_layers(m, "ffn") == [1, 2]


def test_per_layer_kind_list():
    kinds = ["none", "sdu_tanh", "sdu_sigmoid", "highway", "gated_attn", "none"]
    m = _tiny(gate_kind=kinds)
    got = [None if b.attn_gate is None else b.attn_gate.kind for b in m.layers]
    assert got == [None, "sdu_tanh", "sdu_sigmoid", "highway", "gated_attn", None]
    # a list combined with a layer selection: only selected layers keep their kind
    m = _tiny(gate_kind=kinds, gate_layers="2-3")
    assert [None if b.ffn_gate is None else b.ffn_gate.kind for b in m.layers] == \
        [None, "sdu_tanh", "sdu_sigmoid", None, None, None]


def test_error_messages():
    with pytest.raises(ConfigError, match=r"^model.gate_layers=\[7\] names layer 7, but the model's layers are "
                                          r"1-6 \(numbered from 1; valid: 1-6"):
        _tiny(gate_kind="sdu_tanh", gate_layers=[7])
    with pytest.raises(ConfigError, match=r"^model.gate_layers='0-2' names layer 0, but the model's layers are 1-6"):
        _tiny(gate_kind="sdu_tanh", gate_layers="0-2")
    with pytest.raises(ConfigError, match=r"^model.gate_layers.*valid: 1-6"):
        _tiny(gate_kind="sdu_tanh", gate_layers="5-7")
    with pytest.raises(ConfigError, match=r"^model.gate_kind='sdu_relu' is not known \(valid: none, sdu_sigmoid"):
        _tiny(gate_kind="sdu_relu")
    with pytest.raises(ConfigError, match=r"^model.gate_sublayers='mlp' contains 'mlp' \(valid: 'both', 'attn', 'ffn'"):
        _tiny(gate_kind="sdu_tanh", gate_sublayers="mlp")
    with pytest.raises(ConfigError, match=r"^model.gate_kind has 2 entries but the model has 6 layers"):
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


# ----------------------------------------------------------------------------- the registry


def test_registry_resolves_every_kind_to_its_class():
    """placement.GATE_KINDS (torch-free, what validation reads) names each kind's class; `none` has none."""
    assert list(placement.GATE_KINDS) == ["none", "sdu_sigmoid", "sdu_tanh", "highway", "gated_attn"]
    assert gates.gate_class("none") is None and gates.make_gate("none", D) is None
    expected = {"sdu_sigmoid": gates.SDUSigmoid, "sdu_tanh": gates.SDUTanh, "highway": gates.HighwayGate,
                "gated_attn": gates.GatedAttn}
    for kind, cls in expected.items():
        assert gates.gate_class(kind) is cls and issubclass(cls, gates.SublayerGate)
        gate = gates.make_gate(kind, D)
        assert type(gate) is cls and gate.kind == kind and gate.act.fn_name == cls.psi
    with pytest.raises(ConfigError, match=r"^model.gate_kind='toy' is not known \(valid: none, sdu_sigmoid"):
        gates.gate_class("toy")


class ToyGate(gates.SublayerGate):
    """A kind that exists only in this test: x + sub + T*f/2 with a tanh gate; no kernel (fused_term None)."""

    psi = "tanh"

    def blend(self, x, sub, t, f):
        return x + sub + 0.5 * t * f


@pytest.fixture
def toy_kind(monkeypatch):
    """Register ToyGate as gate kind 'toy': the one registry line a new kind needs."""
    monkeypatch.setitem(placement.GATE_KINDS, "toy", f"{__name__}:ToyGate")


TOY_MODELS = {
    "transformer_lm": lambda **kw: TransformerLM(11, n_layers=2, d_model=8, n_heads=2, d_ff=16, dropout=0.0, **kw),
    "r_transformer": lambda **kw: RTransformer(11, n_layers=2, d_model=8, n_heads=2, d_ff=16, window=3,
                                               dropout=0.0, emb_dropout=0.0, **kw),
    "transformer_xl": lambda **kw: TransformerXL(11, n_layers=2, d_model=8, n_heads=2, d_head=4, d_ff=16,
                                                 dropout=0.0, tgt_len=6, mem_len=6, **kw),
}


def test_toy_kind_hand_set_weights(toy_kind):
    gate = gates.make_gate("toy", D)
    with torch.no_grad():
        gate.proj.weight.copy_(torch.tensor(W))
        gate.proj.bias.copy_(torch.tensor(BIAS))
    got = gate(torch.tensor(X).view(1, 1, D), torch.tensor(SUB).view(1, 1, D)).view(-1).tolist()
    expected = []
    for i in range(D):
        z1 = sum(W[i][j] * X[j] for j in range(D)) + BIAS[i]
        f = sum(W[D + i][j] * X[j] for j in range(D)) + BIAS[D + i]
        expected.append(X[i] + SUB[i] + 0.5 * _tanh(z1) * f)
    assert got == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("model", sorted(TOY_MODELS))
def test_a_new_kind_is_one_class_and_one_registry_line(toy_kind, model, fused):
    """Each transformer builds the toy kind in the chosen sublayers and trains one optimizer step with it."""
    torch.manual_seed(0)
    m = TOY_MODELS[model](gate_kind="toy", gate_layers="2", fused=fused)
    assert [type(layer.attn_gate).__name__ for layer in m.layers] == ["NoneType", "ToyGate"]
    assert [type(layer.ffn_gate).__name__ for layer in m.layers] == ["NoneType", "ToyGate"]
    x = torch.randint(0, 11, (2, 6))
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    before = m.layers[1].attn_gate.proj.weight.detach().clone()
    with GateRecorder(m) as rec:
        logits, _ = m(x)
    assert sorted(rec.stats()) == ["layers.1.attn_gate.act", "layers.1.ffn_gate.act"]
    loss = F.cross_entropy(logits.reshape(-1, 11), x.reshape(-1))
    opt.zero_grad()
    loss.backward()
    assert m.layers[1].attn_gate.proj.weight.grad.abs().sum() > 0
    opt.step()
    assert not torch.equal(before, m.layers[1].attn_gate.proj.weight)
    assert torch.isfinite(m(x)[0]).all()


def test_toy_kind_is_valid_in_configs(toy_kind):
    """The early validator learns the new name from the same registry (no second list)."""
    from conftest import compose
    from highway_repro.train.config import validate

    placement.check_placement(3, "toy", "2-3", "attn")
    validate(compose(["model=transformer_lm", "data=ptb_char", "scale=smoke", "model.gate_kind=toy"]))
