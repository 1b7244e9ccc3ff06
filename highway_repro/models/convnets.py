"""Convolutional highway nets of the official code ("Training Very Deep Networks", arXiv 1507.06228).

MnistHighwayNet: the 10-layer MNIST net of Table 1 (REFERENCE.md A2).
CifarHighwayNet: the 19-layer CIFAR net of Tables 2, 3 ("Highway B", REFERENCE.md A3).

kind='highway' uses `HighwayConv2d` (T transform gate, C = 1 - T carry gate,
`gate_bias` negative = carry by default); kind='plain' replaces each highway conv
by a plain conv + ReLU of the same width and kernel (half the parameters).
Max pooling uses Caffe's ceil mode. Inputs arrive already scaled/normalised by
the data layer (MNIST x 1/256 in the official code), the model does not rescale.
All convs / linears He-normal (std sqrt(2 / fan_in)), biases 0.
"""

from __future__ import annotations

import torch
from torch import nn

from highway_repro import options
from highway_repro.models.dropout import Dropout
from highway_repro.models.highway import HighwayConv2d, he_init_


def conv_relu(c_in: int, c_out: int, k: int, padding: int) -> nn.Sequential:
    return nn.Sequential(he_init_(nn.Conv2d(c_in, c_out, k, padding=padding)), nn.ReLU())


def stage(kind: str, channels: int, n: int, gate_bias: float) -> list[nn.Module]:
    """n highway convs 3x3 (or plain conv3x3 + ReLU) of `channels`, size-preserving."""
    if kind == "highway":
        return [HighwayConv2d(channels, 3, "relu", gate_bias) for _ in range(n)]
    return [conv_relu(channels, channels, 3, 1) for _ in range(n)]


class MnistHighwayNet(nn.Module):
    """10-layer MNIST net: conv5x5 + 8 highway conv3x3 + linear.

    dropout 0.2 -> conv5x5,w (no pad) + ReLU -> 2 x highway3x3 -> maxpool 3/2 ->
    dropout 0.3 -> 3 x highway3x3 -> maxpool 3/2 -> dropout 0.4 -> 3 x highway3x3
    -> maxpool 2/2 -> dropout 0.5 -> linear `classifier`. Spatial 28 -> 24 -> 12
    -> 6 -> 3 (ceil-mode pooling). Parameters, 10 classes:
    highway width 32: 151,690; width 16: 38,986. plain width 32: 77,706; width 16: 20,426.
    """

    def __init__(self, width: int = 32, kind: str = "highway", gate_bias: float = -1.0,
                 num_classes: int = 10, input_shape: tuple[int, int, int] = (1, 28, 28)):
        options.check_model("MnistHighwayNet", locals())
        super().__init__()
        c, h, w = input_shape
        self.features = nn.Sequential(
            Dropout(0.2),
            conv_relu(c, width, 5, 0),  # (B, w, H-4, W-4)
            *stage(kind, width, 2, gate_bias),
            nn.MaxPool2d(3, 2, ceil_mode=True),  # 24 -> 12
            Dropout(0.3),
            *stage(kind, width, 3, gate_bias),
            nn.MaxPool2d(3, 2, ceil_mode=True),  # 12 -> 6
            Dropout(0.4),
            *stage(kind, width, 3, gate_bias),
            nn.MaxPool2d(2, 2, ceil_mode=True),  # 6 -> 3
            Dropout(0.5),
        )
        with torch.no_grad():
            n_feat = self.features(torch.zeros(1, c, h, w)).numel()  # w * 3 * 3 for 28 x 28
        self.classifier = he_init_(nn.Linear(n_feat, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)  # (B, w, 3, 3)
        return self.classifier(x.flatten(1))  # (B, num_classes)


class CifarHighwayNet(nn.Module):
    """19-layer CIFAR net ("Highway B"): 4 plain convs + 14 highway convs + linear.

    dropout 0.2 -> conv3x3,32 + ReLU -> 4 x highway3x3,32 -> maxpool 2/2 -> dropout 0.2
    -> conv3x3,80 + ReLU -> 5 x highway3x3,80 -> maxpool 2/2 -> dropout 0.2 ->
    conv3x3,128 + ReLU -> 5 x highway3x3,128 -> conv1x1,100 + ReLU -> global avgpool
    -> dropout 0.2 -> linear `classifier`. Spatial 32 -> 16 -> 8.

    Parameters (paper widths): highway 2,256,838 (10 classes), 2,265,928 (100);
    plain 1,193,526 (10 classes), 1,202,616 (100).

    `widths` = (stage 1, stage 2, stage 3, 1x1 head) channels; `width_mult` scales
    all four (rounded, at least 1) for CPU-scale configs. Default = paper.
    """

    PAPER_WIDTHS = (32, 80, 128, 100)
    DEPTHS = (4, 5, 5)

    def __init__(self, kind: str = "highway", gate_bias: float = -2.0, num_classes: int = 10,
                 input_shape: tuple[int, int, int] = (3, 32, 32),
                 widths: tuple[int, int, int, int] | list[int] | None = None, width_mult: float = 1.0):
        options.check_model("CifarHighwayNet", locals())
        super().__init__()
        widths = tuple(self.PAPER_WIDTHS if widths is None else widths)
        w1, w2, w3, w4 = (max(1, round(w * width_mult)) for w in widths)
        self.widths = (w1, w2, w3, w4)
        n1, n2, n3 = self.DEPTHS
        c = input_shape[0]
        self.features = nn.Sequential(
            Dropout(0.2),
            conv_relu(c, w1, 3, 1),  # (B, w1, 32, 32)
            *stage(kind, w1, n1, gate_bias),
            nn.MaxPool2d(2, 2, ceil_mode=True),  # (B, w1, 16, 16)
            Dropout(0.2),
            conv_relu(w1, w2, 3, 1),  # (B, w2, 16, 16)
            *stage(kind, w2, n2, gate_bias),
            nn.MaxPool2d(2, 2, ceil_mode=True),  # (B, w2, 8, 8)
            Dropout(0.2),
            conv_relu(w2, w3, 3, 1),  # (B, w3, 8, 8)
            *stage(kind, w3, n3, gate_bias),
            conv_relu(w3, w4, 1, 0),  # (B, w4, 8, 8)
            nn.AdaptiveAvgPool2d(1),  # (B, w4, 1, 1)
            nn.Flatten(),  # (B, w4)
            Dropout(0.2),
        )
        self.classifier = he_init_(nn.Linear(w4, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))  # (B, num_classes)
