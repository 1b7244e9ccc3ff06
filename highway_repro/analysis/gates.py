"""Gate analyses of a trained highway net (Highway Networks, arXiv 1505.00387, Figs. 2-4).

Meant for the deep FC highway MLP (paper: 50 layers, tanh, gate bias -2 MNIST /
-4 CIFAR-100); conv nets work too, with a channel playing the role of a unit
(values averaged over space). All arrays are numpy, shaped (highway layer, unit),
layer 0 = the first highway layer. T is the transform gate, C = 1 - T carry gate.

- `gate_heatmaps` (Fig. 2): transform-gate biases b_T, mean T over examples,
  T for one example, block outputs for that example.
- `class_routing` (Fig. 3): per class, mean T over the class minus mean T over all.
- `lesion_curve` (Fig. 4): training loss / accuracy with one layer lesioned (T = 0, y = x).
- `plot_*` write PNGs with the Agg canvas (no pyplot state); `summarize` gives text.

All functions run the model in eval mode without gradients and restore its
training mode and lesion switches afterwards.
"""

from __future__ import annotations

import io
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import nn

from highway_repro import files
from highway_repro.models.highway import highway_layers
from highway_repro.models.probe import GateRecorder


@contextmanager
def _evaluating(model: nn.Module):
    """Eval mode, no grad, lesion switches restored afterwards."""
    was_training = model.training
    lesions = {name: layer.lesion for name, layer in highway_layers(model).items()}
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)
        for name, layer in highway_layers(model).items():
            layer.lesion = lesions[name]


def _layers(model: nn.Module) -> dict:
    layers = highway_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no highway layers to analyse")
    return layers


def _units(t: torch.Tensor) -> torch.Tensor:
    """(N, U) or (N, C, H, W) -> (N, U): conv channels are units, averaged over space."""
    return t.flatten(2).mean(2) if t.dim() > 2 else t


def _logits(model: nn.Module, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    return torch.cat([model(xb) for xb in x.split(batch_size)])  # (N, num_classes)


def _gate_values(model: nn.Module, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """T of every highway layer for every example: (L, N, U)."""
    names = list(_layers(model))
    with _evaluating(model), GateRecorder(model, mode="values") as rec:
        _logits(model, x, batch_size)
    return torch.stack([_units(torch.cat(rec.values[f"{n}.gate"])) for n in names])


def gate_heatmaps(model: nn.Module, x_train: torch.Tensor, y_train: torch.Tensor | None = None,
                  example_index: int = 0, batch_size: int = 1000) -> dict[str, np.ndarray]:
    """Fig. 2 maps, each (layer, unit).

    Keys: "bias" (b_T now), "bias_init" (the gate_bias the layer was built with),
    "mean_T" (over x_train), "example_T" and "example_output" (block outputs y) for
    x_train[example_index], "example_change" (y - x of each block for that example).
    y_train is accepted for a uniform signature; the maps do not depend on labels.
    """
    layers = _layers(model)
    gates = _gate_values(model, x_train, batch_size)  # (L, N, U)
    outputs, changes = [], []

    def hook(module, inputs, output):
        outputs.append(_units(output)[0])
        changes.append(_units(output - inputs[0])[0])

    handles = [layer.register_forward_hook(hook) for layer in layers.values()]
    try:
        with _evaluating(model):
            model(x_train[example_index:example_index + 1])
    finally:
        for h in handles:
            h.remove()
    bias = torch.stack([layer.t.bias.detach().cpu() for layer in layers.values()])  # (L, U)
    return {
        "bias": bias.numpy(),
        "bias_init": np.stack([np.full(bias.shape[1], layer.gate_bias) for layer in layers.values()]),
        "mean_T": gates.mean(1).numpy(),
        "example_T": gates[:, example_index].numpy(),
        "example_output": torch.stack(outputs).cpu().numpy(),
        "example_change": torch.stack(changes).cpu().numpy(),
    }


def class_routing(model: nn.Module, x: torch.Tensor, y: torch.Tensor, classes=(0, 7),
                  batch_size: int = 1000) -> dict[int, np.ndarray]:
    """Fig. 3: {class: mean T over examples of that class - mean T over all}, each (layer, unit)."""
    gates = _gate_values(model, x, batch_size)  # (L, N, U)
    overall = gates.mean(1)
    y = y.cpu()
    out = {}
    for c in classes:
        mask = y == c
        if not mask.any():
            raise ValueError(f"class_routing classes={tuple(classes)}: no example of class {c} in y")
        out[int(c)] = (gates[:, mask].mean(1) - overall).numpy()
    return out


def _loss_acc(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> tuple[float, float]:
    logits = _logits(model, x, batch_size)
    return F.cross_entropy(logits, y).item(), (logits.argmax(1) == y).float().mean().item()


def lesion_curve(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                 batch_size: int = 1000) -> dict:
    """Fig. 4: loss and accuracy on (x, y) with each highway layer lesioned in turn.

    Returns {"layers": names, "loss": (L,), "acc": (L,), "base_loss", "base_acc"}.
    The model's lesion switches and training mode are restored afterwards.
    """
    layers = _layers(model)
    losses, accs = [], []
    with _evaluating(model):
        for layer in layers.values():
            layer.lesion = False
        base_loss, base_acc = _loss_acc(model, x, y, batch_size)
        for layer in layers.values():
            layer.lesion = True
            loss, acc = _loss_acc(model, x, y, batch_size)
            layer.lesion = False
            losses.append(loss)
            accs.append(acc)
    return {"layers": list(layers), "loss": np.array(losses), "acc": np.array(accs),
            "base_loss": base_loss, "base_acc": base_acc}


def summarize(heatmaps: dict[str, np.ndarray], lesion: dict, tol: float = 0.1,
              change_share: float = 0.9) -> str:
    """A few lines of text on the three figures (layer numbers 1-based, highway layers only)."""
    lines = []
    rel = (lesion["loss"] - lesion["base_loss"]) / max(abs(lesion["base_loss"]), 1e-12)
    ok = [int(i) + 1 for i in np.flatnonzero(np.abs(rel) < tol)]
    lines.append(f"lesionable (train loss change < {tol:.0%}): {len(ok)} of {len(rel)} layers {ok}")
    worst = int(np.argmax(rel))
    lines.append(f"most harmful lesion: layer {worst + 1}, loss {lesion['base_loss']:.4g} -> "
                 f"{lesion['loss'][worst]:.4g}, acc {lesion['base_acc']:.4f} -> {lesion['acc'][worst]:.4f}")
    bias, init = heatmaps["bias"], heatmaps["bias_init"]
    more_neg = int((bias < init).sum())
    lines.append(f"gate biases more negative than at init: {more_neg} of {bias.size} "
                 f"({more_neg / bias.size:.0%}); mean b_T {bias.mean():.3f} vs init {init.mean():.3f}")
    t = heatmaps["example_T"]
    lines.append(f"example gate activity: {float((t > 0.5).mean()):.0%} of T > 0.5, "
                 f"{float((t < 0.1).mean()):.0%} of T < 0.1; mean T over data {heatmaps['mean_T'].mean():.3f}")
    change = np.abs(heatmaps["example_change"]).sum(1)  # (L,)
    if change.sum() > 0:
        k = int(np.searchsorted(np.cumsum(change) / change.sum(), change_share) + 1)
        lines.append(f"{change_share:.0%} of the example's output change happens in layers 1-{k} "
                     f"of {len(change)}")
    return "\n".join(lines)


def _save(fig: Figure, path) -> Path:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    return files.write_atomic(Path(path), buf.getvalue())


def _heat(fig: Figure, ax, a: np.ndarray, title: str, cmap: str = "viridis", **kw) -> None:
    im = ax.imshow(a, aspect="auto", interpolation="nearest", cmap=cmap, **kw)
    ax.set_title(title)
    ax.set_xlabel("unit")
    ax.set_ylabel("highway layer")
    fig.colorbar(im, ax=ax)


def plot_heatmaps(heatmaps: dict[str, np.ndarray], path) -> Path:
    """Fig. 2: biases, mean T, example T, example block outputs side by side."""
    fig = Figure(figsize=(16, 4))
    axes = fig.subplots(1, 4)
    _heat(fig, axes[0], heatmaps["bias"], "transform gate bias $b_T$")
    _heat(fig, axes[1], heatmaps["mean_T"], "mean T", vmin=0, vmax=1)
    _heat(fig, axes[2], heatmaps["example_T"], "T, one example", vmin=0, vmax=1)
    _heat(fig, axes[3], heatmaps["example_output"], "block outputs, one example")
    return _save(fig, path)


def plot_routing(routing: dict[int, np.ndarray], path) -> Path:
    """Fig. 3: mean T of a class minus mean T of all, per class."""
    fig = Figure(figsize=(4 * len(routing), 4))
    axes = np.atleast_1d(fig.subplots(1, len(routing)))
    lim = max(float(np.abs(a).max()) for a in routing.values()) or 1.0
    for ax, (c, a) in zip(axes, routing.items()):
        _heat(fig, ax, a, f"class {c}: mean T - mean T (all)", cmap="RdBu_r", vmin=-lim, vmax=lim)
    return _save(fig, path)


def plot_lesion(lesion: dict, path) -> Path:
    """Fig. 4: training loss and accuracy with each layer lesioned, baseline dashed."""
    fig = Figure(figsize=(10, 4))
    ax_loss, ax_acc = fig.subplots(1, 2)
    layers = np.arange(1, len(lesion["loss"]) + 1)
    for ax, key, label in ((ax_loss, "loss", "train cross-entropy"), (ax_acc, "acc", "train accuracy")):
        ax.plot(layers, lesion[key], "o-", label="layer lesioned")
        ax.axhline(lesion[f"base_{key}"], ls="--", color="k", label="no lesion")
        ax.set_xlabel("lesioned highway layer")
        ax.set_ylabel(label)
        ax.legend()
    ax_loss.set_yscale("log")
    return _save(fig, path)
