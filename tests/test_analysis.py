"""Gate analyses (Highway Networks Figs. 2-4) on a tiny random highway MLP."""

import numpy as np
import pytest
import torch

from highway_repro.analysis.gates import (class_routing, gate_heatmaps, lesion_curve, plot_heatmaps,
                                          plot_lesion, plot_routing, summarize)
from highway_repro.models.mlp import MLP

DEPTH, WIDTH, N = 6, 12, 40  # 5 highway layers of 12 units


@pytest.fixture
def setup():
    torch.manual_seed(0)
    model = MLP(kind="highway", depth=DEPTH, width=WIDTH, activation="tanh", gate_bias=-2.0,
                input_shape=(1, 6, 6), num_classes=10)
    x = torch.randn(N, 1, 6, 6)
    y = torch.arange(N) % 10
    return model, x, y


def test_heatmaps_shapes(setup):
    model, x, y = setup
    maps = gate_heatmaps(model, x, y, example_index=3, batch_size=16)
    assert set(maps) == {"bias", "bias_init", "mean_T", "example_T", "example_output", "example_change"}
    for a in maps.values():
        assert a.shape == (DEPTH - 1, WIDTH)
    assert np.all(maps["bias_init"] == -2.0) and np.allclose(maps["bias"], -2.0)
    assert np.all((maps["mean_T"] > 0) & (maps["mean_T"] < 1))
    # the example's gates match a direct computation on the first highway layer
    with torch.no_grad():
        z = model.stem(x[3:4].flatten(1))
        t0 = torch.sigmoid(model.layers[0].t(z))[0]
    assert np.allclose(maps["example_T"][0], t0.numpy(), atol=1e-6)


def _by_hand(model, x, skip=None):
    """The highway MLP's gates T of every layer (L, N, U) and logits, written out: z = stem(x), then per layer
    T = sigmoid(t(z)), z = act(h(z)) * T + z * (1 - T); layer `skip` lesioned (the identity)."""
    with torch.no_grad():
        z, ts = model.stem(x.flatten(1)), []
        for i, layer in enumerate(model.layers):
            t = torch.sigmoid(layer.t(z))
            ts.append(t)
            if i != skip:
                z = torch.tanh(layer.h(z)) * t + z * (1 - t)
        return torch.stack(ts), model.classifier(z)


def test_class_routing_is_the_class_mean_of_t_minus_the_overall_mean(setup):
    """Fig. 3: for class c, mean T over its examples minus mean T over all, per layer and unit (by hand)."""
    model, x, y = setup
    routing = class_routing(model, x, y, classes=(0, 7))
    assert list(routing) == [0, 7]
    t, _ = _by_hand(model, x)  # (L, N, U)
    for c in (0, 7):  # classes 0 and 7: examples c, c + 10, c + 20, c + 30
        want = t[:, c::10].mean(1) - t.mean(1)
        assert routing[c].shape == (DEPTH - 1, WIDTH)
        np.testing.assert_allclose(routing[c], want.numpy(), atol=1e-6)
    with pytest.raises(ValueError, match="no example of class 11"):
        class_routing(model, x, y, classes=(11,))


def test_lesion_curve_restores_model(setup):
    model, x, y = setup
    model.train()
    model.layers[2].lesion = True  # a pre-existing switch must survive
    before = {k: v.clone() for k, v in model.state_dict().items()}
    curve = lesion_curve(model, x, y)
    assert curve["loss"].shape == (DEPTH - 1,) and curve["acc"].shape == (DEPTH - 1,)
    assert len(curve["layers"]) == DEPTH - 1
    assert np.isfinite(curve["base_loss"]) and 0 <= curve["base_acc"] <= 1
    assert model.training
    assert [layer.lesion for layer in model.layers] == [False, False, True, False, False]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # the unlesioned baseline equals a plain evaluation
    model.layers[2].lesion = False
    model.eval()
    with torch.no_grad():
        base = torch.nn.functional.cross_entropy(model(x), y).item()
    assert curve["base_loss"] == pytest.approx(base, rel=1e-5)
    for k in range(DEPTH - 1):  # lesioning layer k = the net without layer k, written out
        _, logits = _by_hand(model, x, skip=k)
        assert curve["loss"][k] == pytest.approx(torch.nn.functional.cross_entropy(logits, y).item(), rel=1e-5)
        assert curve["acc"][k] == pytest.approx((logits.argmax(1) == y).float().mean().item())


def test_plots_and_summary(setup, tmp_path):
    model, x, y = setup
    maps = gate_heatmaps(model, x, y)
    routing = class_routing(model, x, y)
    curve = lesion_curve(model, x, y)
    paths = [plot_heatmaps(maps, tmp_path / "fig2.png"), plot_routing(routing, tmp_path / "fig3.png"),
             plot_lesion(curve, tmp_path / "sub" / "fig4.png")]
    for p in paths:
        assert p.exists() and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = summarize(maps, curve)
    assert "lesionable" in text and "more negative" in text and "output change" in text
