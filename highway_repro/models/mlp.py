"""Deep fully connected nets of the Highway Networks depth sweep (arXiv 1505.00387, Fig. 1).

Layout (REFERENCE.md A1): flatten -> one plain layer from the input into the
working width -> depth - 1 layers of the chosen kind -> linear `classifier`.
"Depth" counts the first plain layer plus the depth - 1 layers; the classifier
(softmax layer) is extra. Paper widths keep about 5,100 parameters per layer:

    highway  50 units: 2 * (50 * 50 + 50) = 5,100
    plain    71 units:      71 * 71 + 71  = 5,112
    residual 71 units:      71 * 71 + 71  = 5,112

kind:
    plain     y = act(W x + b)
    highway   y = H(x) * T(x) + x * (1 - T(x))   (see highway.py; T transform
              gate, C = 1 - T carry gate, `gate_bias` negative = carry by default)
    residual  y = x + act(W x + b); an identity-skip (ResNet-style) baseline with the
              parameter count of a plain layer. The paper had no residual nets;
              this kind is our addition for comparison.

width: 'paper' (table above), an int, or 'match': the integer width whose total
parameter count is closest to the same-depth model of kind `match_to` at its
paper width (must come within 2%).

All weights He-normal (std sqrt(2 / fan_in)), biases 0, gate biases `gate_bias`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from highway_repro import options
from highway_repro.models.highway import HighwayLinear, he_init_, make_activation

PAPER_WIDTH = {"highway": 50, "plain": 71, "residual": 71}
MATCH_TOLERANCE = 0.02


class ResidualLinear(nn.Module):
    """y = x + act(W x + b): (B, dim) -> (B, dim); dim^2 + dim parameters."""

    def __init__(self, dim: int, activation: str = "relu"):
        super().__init__()
        self.fc = he_init_(nn.Linear(dim, dim))
        self.act = make_activation(activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.fc(x))


def plain_layer(d_in: int, d_out: int, activation: str) -> nn.Sequential:
    """act(W x + b): (B, d_in) -> (B, d_out)."""
    return nn.Sequential(he_init_(nn.Linear(d_in, d_out)), make_activation(activation))


def mlp_param_count(kind: str, depth: int, width: int, in_dim: int, num_classes: int) -> int:
    """Closed-form parameter count of MLP(kind, depth, width) (used by width='match')."""
    per_layer = (2 if kind == "highway" else 1) * (width * width + width)
    return (in_dim * width + width) + (depth - 1) * per_layer + (width * num_classes + num_classes)


def match_width(kind: str, depth: int, match_to: str, in_dim: int, num_classes: int) -> int:
    """Integer width of `kind` whose parameter count is closest to `match_to` at its paper width."""
    target = mlp_param_count(match_to, depth, PAPER_WIDTH[match_to], in_dim, num_classes)
    best = min(range(1, 4 * PAPER_WIDTH[match_to] + 1),
               key=lambda w: abs(mlp_param_count(kind, depth, w, in_dim, num_classes) - target))
    got = mlp_param_count(kind, depth, best, in_dim, num_classes)
    if abs(got - target) > MATCH_TOLERANCE * target:
        raise options.error("model.width", "match", "an integer width, or paper",
                            f"finds no {kind} width within 2% of the {target:,} parameters of {match_to} "
                            f"(closest: width {best}, {got:,})")
    return best


class MLP(nn.Module):
    """Plain / highway / residual fully connected classifier: (B, *input_shape) -> (B, num_classes).

    Options and their valid values: `options.MODELS["MLP"]`."""

    def __init__(self, kind: str = "highway", depth: int = 10, width: str | int = "paper",
                 activation: str = "relu", gate_bias: float = -2.0, match_to: str = "highway",
                 num_classes: int = 10, input_shape: tuple[int, ...] = (1, 28, 28)):
        options.check_model("MLP", locals())
        super().__init__()
        in_dim = math.prod(input_shape)
        if width == "paper":
            width = PAPER_WIDTH[kind]
        elif width == "match":
            width = match_width(kind, depth, match_to, in_dim, num_classes)
        self.kind, self.depth, self.width = kind, depth, width

        self.stem = plain_layer(in_dim, width, activation)  # (B, in_dim) -> (B, width)
        if kind == "highway":
            layers = [HighwayLinear(width, activation, gate_bias) for _ in range(depth - 1)]
        elif kind == "residual":
            layers = [ResidualLinear(width, activation) for _ in range(depth - 1)]
        else:
            layers = [plain_layer(width, width, activation) for _ in range(depth - 1)]
        self.layers = nn.ModuleList(layers)
        self.classifier = he_init_(nn.Linear(width, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x.flatten(1))  # (B, width)
        for layer in self.layers:
            x = layer(x)  # (B, width)
        return self.classifier(x)  # (B, num_classes)
