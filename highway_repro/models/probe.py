"""Observation of gate activations through forward hooks.

Every gate of the project (the highway transform gate T of Srivastava et al. 2015,
the SDU gate psi(X W1 + b1) of Chai et al. 2020) is produced by a `GateAct`
module. A `GateRecorder` attaches forward hooks to all of them while it is
active; when nobody records, nothing is stored and the hooks cost nothing.

Convention: T is the transform gate, C = 1 - T the carry gate.
"""

from __future__ import annotations

import torch
from torch import nn

GATE_FUNCTIONS = {"sigmoid": torch.sigmoid, "tanh": torch.tanh}


class GateAct(nn.Module):
    """The gate nonlinearity psi (sigmoid or tanh); its output is the gate value."""

    def __init__(self, fn: str = "sigmoid"):
        super().__init__()
        if fn not in GATE_FUNCTIONS:
            raise ValueError(f"gate function {fn!r} is not known (valid: {sorted(GATE_FUNCTIONS)})")
        self.fn_name = fn
        self.fn = GATE_FUNCTIONS[fn]

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.fn(z)

    def extra_repr(self) -> str:
        return self.fn_name


def gate_modules(model: nn.Module) -> dict[str, GateAct]:
    """All GateAct modules of `model` by qualified name, in forward-definition order."""
    return {name: m for name, m in model.named_modules() if isinstance(m, GateAct)}


class GateRecorder:
    """Records gate activations of every `GateAct` in `model` while active.

    mode="stats": per gate, running sums for the mean and the saturation
    fractions (T < 0.1, T > 0.9); cheap, for training logs.
    mode="values": keeps every activation tensor (detached, on CPU), for analyses.

        with GateRecorder(model) as rec:
            model(x)
        rec.stats()  # {"layers.0.gate": {"mean": .., "lt_0.1": .., "gt_0.9": ..}}
    """

    def __init__(self, model: nn.Module, mode: str = "stats"):
        if mode not in ("stats", "values"):
            raise ValueError(f"GateRecorder mode={mode!r} is not known (valid: 'stats', 'values')")
        self.model, self.mode = model, mode
        self.handles: list = []
        self.sums: dict[str, torch.Tensor] = {}
        self.values: dict[str, list[torch.Tensor]] = {}

    def _hook(self, name: str):
        def hook(module, inputs, output):
            t = output.detach()
            if self.mode == "values":
                self.values.setdefault(name, []).append(t.float().cpu())
                return
            s = torch.stack([t.float().sum(), (t < 0.1).sum().float(), (t > 0.9).sum().float(),
                             torch.tensor(float(t.numel()), device=t.device)])
            self.sums[name] = self.sums[name] + s if name in self.sums else s

        return hook

    def __enter__(self) -> "GateRecorder":
        for name, m in gate_modules(self.model).items():
            self.handles.append(m.register_forward_hook(self._hook(name)))
        return self

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def stats(self) -> dict[str, dict[str, float]]:
        """{gate name: {"mean", "lt_0.1", "gt_0.9"}} over everything recorded so far."""
        out = {}
        for name, s in self.sums.items():
            total, lo, hi, n = s.tolist()
            out[name] = {"mean": total / n, "lt_0.1": lo / n, "gt_0.9": hi / n}
        return out
