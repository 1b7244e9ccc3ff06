"""Highway layers, MLP / conv nets, and the Caffe parameter groups."""

import math

import pytest
import torch
from torch import nn

from highway_repro.engine.param_groups import caffe_param_groups
from highway_repro.models.convnets import CifarHighwayNet, MnistHighwayNet
from highway_repro.models.highway import HighwayConv2d, HighwayLinear, highway_layers
from highway_repro.models.mlp import MLP, mlp_param_count
from highway_repro.models.probe import GateRecorder


def n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


# ---- parameter counts against hand arithmetic --------------------------------------------

def hw_conv(c, k=3):  # H and T convs
    return 2 * (c * c * k * k + c)


def conv(c_in, c_out, k):
    return c_in * c_out * k * k + c_out


@pytest.mark.parametrize("width, expected", [(32, 151_690), (16, 38_986)])
def test_mnist_param_counts(width, expected):
    # conv5x5 1->w, 8 highway 3x3, linear w*3*3 -> 10 (ceil-mode pooling 24 -> 12 -> 6 -> 3)
    assert conv(1, width, 5) + 8 * hw_conv(width) + (width * 9 * 10 + 10) == expected
    assert n_params(MnistHighwayNet(width=width, num_classes=10, input_shape=(1, 28, 28))) == expected


def test_mnist_plain_param_count():
    assert n_params(MnistHighwayNet(width=32, kind="plain")) == 832 + 8 * 9_248 + 2_890 == 77_706


# CIFAR 19-layer net, by hand:
#   conv3x3 3->32            3*32*9 + 32     =       896
#   4 x highway 32           4 * 2*(9*32*32 + 32)   =  73,984
#   conv3x3 32->80           32*80*9 + 80    =    23,120
#   5 x highway 80           5 * 2*(9*80*80 + 80)   = 576,800
#   conv3x3 80->128          80*128*9 + 128  =    92,288
#   5 x highway 128          5 * 2*(9*128*128 + 128) = 1,475,840
#   conv1x1 128->100         128*100 + 100   =    12,900
#   linear 100->10           100*10 + 10     =     1,010
#   total                                       2,256,838
CIFAR_HIGHWAY_10 = 896 + 73_984 + 23_120 + 576_800 + 92_288 + 1_475_840 + 12_900 + 1_010
# plain: each highway layer -> one conv of the same width
CIFAR_PLAIN_10 = 896 + 4 * 9_248 + 23_120 + 5 * 57_680 + 92_288 + 5 * 147_584 + 12_900 + 1_010


def test_cifar_param_counts():
    assert CIFAR_HIGHWAY_10 == 2_256_838 and CIFAR_PLAIN_10 == 1_193_526
    assert n_params(CifarHighwayNet(num_classes=10)) == CIFAR_HIGHWAY_10
    assert n_params(CifarHighwayNet(num_classes=100)) == CIFAR_HIGHWAY_10 - 1_010 + 10_100
    assert n_params(CifarHighwayNet(kind="plain", num_classes=10)) == CIFAR_PLAIN_10
    assert len(highway_layers(CifarHighwayNet())) == 14


def test_fc_per_layer_param_counts():
    assert n_params(HighwayLinear(50)) == 2 * (50 * 50 + 50) == 5_100
    for kind, per_layer in [("highway", 5_100), ("plain", 5_112), ("residual", 5_112)]:
        m = MLP(kind=kind, depth=10, num_classes=10, input_shape=(1, 28, 28))
        assert n_params(m.layers[0]) == per_layer
        assert n_params(m) == mlp_param_count(kind, 10, m.width, 784, 10)
    assert MLP(kind="plain").width == 71 and MLP(kind="highway").width == 50


@pytest.mark.parametrize("kind, match_to", [("plain", "highway"), ("residual", "highway"),
                                            ("highway", "plain")])
@pytest.mark.parametrize("depth", [10, 50])
def test_width_match_within_2pct(kind, match_to, depth):
    target = n_params(MLP(kind=match_to, depth=depth, input_shape=(3, 32, 32), num_classes=100))
    m = MLP(kind=kind, depth=depth, width="match", match_to=match_to, input_shape=(3, 32, 32),
            num_classes=100)
    assert abs(n_params(m) - target) <= 0.02 * target


# ---- the layer itself --------------------------------------------------------------------

def test_gate_is_sigmoid_of_bias_with_zero_weights():
    layer = HighwayLinear(6, gate_bias=-1.5)
    with torch.no_grad():
        layer.t.weight.zero_()
    with GateRecorder(layer, mode="values") as rec:
        layer(torch.randn(4, 6))
    t = rec.values["gate"][0]
    assert torch.allclose(t, torch.full((4, 6), 1 / (1 + math.exp(1.5))))


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_highway_formula_hand_set(activation):
    layer = HighwayLinear(2, activation=activation)
    with torch.no_grad():
        layer.h.weight.copy_(torch.tensor([[1.0, -2.0], [0.5, 0.0]]))
        layer.h.bias.copy_(torch.tensor([0.1, -0.3]))
        layer.t.weight.copy_(torch.tensor([[0.0, 1.0], [-1.0, 0.0]]))
        layer.t.bias.copy_(torch.tensor([-1.0, 2.0]))
    x = [0.7, -0.4]
    act = (lambda v: max(v, 0.0)) if activation == "relu" else math.tanh
    h = [act(1.0 * x[0] - 2.0 * x[1] + 0.1), act(0.5 * x[0] - 0.3)]
    t = [1 / (1 + math.exp(-(x[1] - 1.0))), 1 / (1 + math.exp(-(-x[0] + 2.0)))]
    expected = [h[i] * t[i] + x[i] * (1 - t[i]) for i in range(2)]
    y = layer(torch.tensor([x]))
    assert torch.allclose(y, torch.tensor([expected]), atol=1e-6)


@pytest.mark.parametrize("layer, shape", [(HighwayLinear(8), (3, 8)),
                                          (HighwayConv2d(4), (2, 4, 5, 5))])
def test_lesion_is_identity(layer, shape):
    x = torch.randn(shape)
    assert not torch.equal(layer(x), x)
    layer.lesion = True
    with GateRecorder(layer, mode="values") as rec:
        y = layer(x)
    assert torch.equal(y, x)
    assert torch.equal(rec.values["gate"][0], torch.zeros(shape))  # the recorder sees T = 0


def test_conv_formula_and_shape():
    layer = HighwayConv2d(3, kernel_size=3, gate_bias=-1.0)
    x = torch.randn(2, 3, 7, 9)
    h = torch.relu(nn.functional.conv2d(x, layer.h.weight, layer.h.bias, padding=1))
    t = torch.sigmoid(nn.functional.conv2d(x, layer.t.weight, layer.t.bias, padding=1))
    assert torch.allclose(layer(x), h * t + x * (1 - t), atol=1e-6)
    assert torch.all(layer.t.bias == -1.0) and torch.all(layer.h.bias == 0)


def test_he_init_std():
    torch.manual_seed(0)
    lin = HighwayLinear(400)
    cnv = HighwayConv2d(64)
    for w, fan_in in [(lin.h.weight, 400), (lin.t.weight, 400), (cnv.h.weight, 64 * 9),
                      (cnv.t.weight, 64 * 9)]:
        assert w.std().item() == pytest.approx(math.sqrt(2 / fan_in), rel=0.03)
    plain = MLP(kind="plain", width=300, input_shape=(1, 20, 20))
    assert plain.layers[0][0].weight.std().item() == pytest.approx(math.sqrt(2 / 300), rel=0.03)
    assert plain.stem[0].weight.std().item() == pytest.approx(math.sqrt(2 / 400), rel=0.03)


def test_gate_recorder_sees_every_layer():
    m = MLP(kind="highway", depth=6, width=10, gate_bias=-3.0, input_shape=(1, 4, 4))
    for layer in m.layers:  # zero T weights: every gate = sigmoid(-3)
        nn.init.zeros_(layer.t.weight)
    with GateRecorder(m) as rec:
        m(torch.randn(5, 1, 4, 4))
    stats = rec.stats()
    assert list(stats) == [f"layers.{i}.gate" for i in range(5)]
    for s in stats.values():
        assert s["mean"] == pytest.approx(1 / (1 + math.exp(3.0)), rel=1e-5)
        assert s["lt_0.1"] == 1.0 and s["gt_0.9"] == 0.0


# ---- whole models ------------------------------------------------------------------------

@pytest.mark.parametrize("make, x_shape, classes", [
    (lambda: MLP(kind="highway", depth=4, input_shape=(1, 8, 8), num_classes=5), (3, 1, 8, 8), 5),
    (lambda: MLP(kind="plain", depth=4, activation="tanh", input_shape=(1, 8, 8), num_classes=5),
     (3, 1, 8, 8), 5),
    (lambda: MLP(kind="residual", depth=4, width=16, input_shape=(3, 4, 4), num_classes=5),
     (3, 3, 4, 4), 5),
    (lambda: MnistHighwayNet(width=8), (2, 1, 28, 28), 10),
    (lambda: MnistHighwayNet(width=8, kind="plain"), (2, 1, 28, 28), 10),
    (lambda: CifarHighwayNet(width_mult=0.125, num_classes=100), (2, 3, 32, 32), 100),
    (lambda: CifarHighwayNet(kind="plain", widths=(4, 6, 8, 5)), (2, 3, 32, 32), 10),
])
def test_forward_backward_shapes(make, x_shape, classes):
    m = make()
    x = torch.randn(x_shape)
    out = m(x)
    assert out.shape == (x_shape[0], classes)
    out.sum().backward()
    assert all(p.grad is not None for p in m.parameters())


def test_highway_mlp_overfits_one_batch():
    torch.manual_seed(0)
    m = MLP(kind="highway", depth=10, width=32, input_shape=(1, 8, 8), num_classes=10)
    x, y = torch.randn(32, 1, 8, 8), torch.randint(0, 10, (32,))
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    first = None
    for _ in range(60):
        loss = nn.functional.cross_entropy(m(x), y)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1 * first


def test_caffe_param_groups():
    m = MnistHighwayNet(width=4)
    groups = caffe_param_groups(m, lr=0.01, weight_decay=0.001)
    ids = [id(p) for g in groups for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in m.parameters()) and len(ids) == len(set(ids))
    by_name = {g["name"]: g for g in groups}
    assert by_name["bias"]["lr"] == pytest.approx(0.02) and by_name["bias"]["weight_decay"] == 0
    assert any(p is m.features[2].t.bias for p in by_name["bias"]["params"])  # gate bias
    assert [p for p in by_name["classifier_weight"]["params"]] == [m.classifier.weight]
    assert by_name["classifier_weight"]["weight_decay"] == pytest.approx(0.01)
    assert by_name["classifier_weight"]["lr"] == pytest.approx(0.01)
    assert by_name["weight"]["lr"] == 0.01 and by_name["weight"]["weight_decay"] == 0.001
    assert all(p.dim() > 1 for p in by_name["weight"]["params"])
    torch.optim.SGD(groups, lr=0.01, momentum=0.9, nesterov=True)  # accepted by torch
    with pytest.raises(ValueError, match="classifier='head'"):
        caffe_param_groups(m, 0.01, 0.001, classifier="head")
    assert len(caffe_param_groups(m, 0.01, 0.001, classifier=None)) == 2


@pytest.mark.parametrize("make, message", [
    (lambda: MLP(kind="foo"), r"^model.kind='foo' is not allowed \(valid: plain, highway, residual\)$"),
    (lambda: MLP(activation="gelu"), r"^model.activation='gelu' is not allowed \(valid: relu, tanh\)$"),
    (lambda: MLP(depth=1), r"^model.depth=1 is not allowed \(valid: an integer >= 2"),
    (lambda: MLP(width="wide"), r"^model.width='wide' is not allowed \(valid: a positive integer, paper or match\)$"),
    (lambda: MLP(match_to="x", width="match"), r"^model.match_to='x' is not allowed"),
    (lambda: HighwayLinear(4, activation="sigmoid"), r"^model.activation='sigmoid' is not allowed"),
    (lambda: HighwayConv2d(4, kernel_size=2), r"^kernel_size=2 is not allowed \(valid: an odd integer"),
    (lambda: MnistHighwayNet(kind="residual"), r"^model.kind='residual' is not allowed \(valid: highway, plain\)$"),
    (lambda: CifarHighwayNet(kind="x"), r"^model.kind='x' is not allowed \(valid: highway, plain\)$"),
    (lambda: CifarHighwayNet(widths=(1, 2)), r"^model.widths=\(1, 2\) is not allowed \(valid: 4 positive integers"),
    (lambda: CifarHighwayNet(width_mult=0), r"^model.width_mult=0 is not allowed \(valid: a number > 0\)$"),
])
def test_bad_options(make, message):
    with pytest.raises(ValueError, match=message):
        make()
