"""Highway layers (Srivastava, Greff, Schmidhuber 2015, arXiv 1505.00387 and 1507.06228).

    y = H(x) * T(x) + x * (1 - T(x)),    T(x) = sigmoid(W_T x + b_T)

Convention: T is the transform gate, C = 1 - T the carry gate (tied, as in the
paper). The gate bias field is `gate_bias`; negative = carry by default, i.e.
at init the layer mostly copies its input. H(x) = act(W_H x + b_H).

Init as the official Caffe code: W_H and W_T Gaussian with std sqrt(2 / fan_in)
(He / Kaiming-normal, fan_in = C_in * k * k), b_H = 0, b_T = gate_bias.

The gate value T is produced by a `probe.GateAct('sigmoid')` submodule named
`gate`, so `probe.GateRecorder` sees it under "<layer name>.gate".

Lesioning (paper Fig. 4): with `layer.lesion = True`, T is forced to 0 and the
layer returns its input unchanged (exactly the identity). The gate module still
runs, on a tensor of -inf, so a recorder sees T = 0 for a lesioned layer.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from highway_repro import options
from highway_repro.models.probe import GateAct

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh}  # the names: options.ACTIVATIONS


def make_activation(activation: str) -> nn.Module:
    options.one_of(*options.ACTIVATIONS).check("model.activation", activation)
    return ACTIVATIONS[activation]()


def he_init_(module: nn.Module) -> nn.Module:
    """Caffe 'msra' filler: weight ~ N(0, 2 / fan_in), bias = 0 (Linear or Conv2d)."""
    fan_in = module.weight[0].numel()  # in_features, or C_in * k * k
    nn.init.normal_(module.weight, 0.0, math.sqrt(2.0 / fan_in))
    if module.bias is not None:
        nn.init.zeros_(module.bias)
    return module


class _Highway(nn.Module):
    """Shared gating logic; subclasses set self.h (H affine map) and self.t (T affine map)."""

    h: nn.Module
    t: nn.Module

    def _init(self, activation: str, gate_bias: float) -> None:
        self.act = make_activation(activation)
        self.gate = GateAct("sigmoid")
        self.gate_bias = float(gate_bias)
        self.lesion = False  # True: T = 0, the layer is the identity
        he_init_(self.h)
        he_init_(self.t)
        nn.init.constant_(self.t.bias, self.gate_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.lesion:
            self.gate(torch.full_like(x, float("-inf")))  # T = 0, visible to recorders
            return x
        h = self.act(self.h(x))  # same shape as x
        t = self.gate(self.t(x))  # same shape as x, in (0, 1)
        return h * t + x * (1.0 - t)

    def extra_repr(self) -> str:
        return f"gate_bias={self.gate_bias}, lesion={self.lesion}"


class HighwayLinear(_Highway):
    """Fully connected highway layer: (B, dim) -> (B, dim); 2 * (dim^2 + dim) parameters."""

    def __init__(self, dim: int, activation: str = "relu", gate_bias: float = -1.0):
        super().__init__()
        self.h = nn.Linear(dim, dim)  # H: (B, dim) -> (B, dim)
        self.t = nn.Linear(dim, dim)  # T pre-activation: (B, dim) -> (B, dim)
        self._init(activation, gate_bias)


class HighwayConv2d(_Highway):
    """Convolutional highway layer: (B, C, H, W) -> (B, C, H, W).

    H and T are convolutions with the same odd kernel and zero padding k // 2,
    so the spatial size is kept; 2 * (C * C * k * k + C) parameters.
    """

    def __init__(self, channels: int, kernel_size: int = 3, activation: str = "relu",
                 gate_bias: float = -1.0):
        super().__init__()
        if kernel_size % 2 != 1:
            raise options.error("kernel_size", kernel_size, "an odd integer, to keep the size")
        pad = kernel_size // 2
        self.h = nn.Conv2d(channels, channels, kernel_size, padding=pad)  # (B, C, H, W)
        self.t = nn.Conv2d(channels, channels, kernel_size, padding=pad)  # (B, C, H, W)
        self._init(activation, gate_bias)


def highway_layers(model: nn.Module) -> dict[str, _Highway]:
    """All highway layers of `model` by qualified name, in definition order."""
    return {name: m for name, m in model.named_modules() if isinstance(m, _Highway)}
