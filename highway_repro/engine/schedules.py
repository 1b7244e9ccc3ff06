"""Learning-rate schedules the papers use, all counted in optimizer steps.

- `constant`
- `step`: multiply by `gamma` at each of `milestones` (Highway Networks' Caffe solver:
  x0.1 at 60k/120k iterations on MNIST, 100k/150k/175k on CIFAR)
- `exponential`: multiply by `gamma` every `every` steps (Highway Networks' FC sweep)
- `cosine`: cosine from lr to `eta_min` over `horizon` steps (default: the run's max_steps) after
  `warmup` linear steps (Transformer-XL's enwik8 runs: no warmup, to 0 over 40k steps; a shorter run
  with `horizon: 40000` follows the paper's schedule for its first steps)
- `plateau`: divide by 1/`factor` when the validation loss has not improved for
  `patience` evaluations (R-Transformer's PTB runs: /10 char, /2 word)

Built from config with `_partial_: true`; the entry point (`highway_repro.train`) calls it with the optimizer
and `max_steps` (the run's length, which `horizon` replaces where it is set).
"""

from __future__ import annotations

import math

import torch

from highway_repro.errors import HighwayError

KINDS = ("constant", "step", "exponential", "cosine", "plateau")


class Schedule:
    """`step()` after every optimizer step; `on_eval(val_loss)` after every validation."""

    def __init__(self, optimizer: torch.optim.Optimizer, kind: str = "constant", max_steps: int = 1,
                 milestones=(), gamma: float = 0.1, every: int = 1, warmup: int = 0, eta_min: float = 0.0,
                 factor: float = 0.1, patience: int = 0, threshold: float = 0.0, horizon: int | None = None):
        if kind not in KINDS:
            raise HighwayError(f"optim.scheduler.kind={kind!r} is not known (valid: {', '.join(KINDS)})")
        if every < 1:
            raise HighwayError(f"optim.scheduler.every={every} must be >= 1")
        if horizon is not None and (not isinstance(horizon, int) or horizon < 1):
            raise HighwayError(f"optim.scheduler.horizon={horizon!r} is not allowed (valid: a positive integer, or "
                               "null for the run's trainer.max_steps)")
        max_steps = horizon or max_steps
        self.kind, self.optimizer = kind, optimizer
        self.plateau = None
        if kind == "plateau":
            self.plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
                optimizer, mode="min", factor=factor, patience=patience, threshold=threshold, threshold_mode="abs")
            self.lambda_lr = None
            return
        milestones = sorted(int(m) for m in milestones)

        def factor_at(step: int) -> float:
            f = 1.0
            if warmup > 0 and step < warmup:
                f = (step + 1) / warmup
            if kind == "step":
                f *= gamma ** sum(step >= m for m in milestones)
            elif kind == "exponential":
                f *= gamma ** (step // every)
            elif kind == "cosine":
                progress = min(max(step - warmup, 0) / max(max_steps - warmup, 1), 1.0)
                base = optimizer.defaults["lr"]
                floor = eta_min / base if base > 0 else 0.0
                f *= floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
            return f

        self.lambda_lr = torch.optim.lr_scheduler.LambdaLR(optimizer, factor_at)

    def step(self) -> None:
        if self.lambda_lr is not None:
            self.lambda_lr.step()

    def on_eval(self, val_loss: float) -> None:
        if self.plateau is not None:
            self.plateau.step(val_loss)

    def lr(self) -> float:
        """The learning rate of the largest parameter group (the base lr under Caffe-style groups)."""
        group = max(self.optimizer.param_groups, key=lambda g: sum(p.numel() for p in g["params"]))
        return group["lr"]

    def state_dict(self) -> dict:
        sched = self.plateau if self.plateau is not None else self.lambda_lr
        return {"kind": self.kind, "state": sched.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        sched = self.plateau if self.plateau is not None else self.lambda_lr
        sched.load_state_dict(state["state"])


def build(optimizer, max_steps: int, kind: str = "constant", **kwargs) -> Schedule:
    return Schedule(optimizer, kind=kind, max_steps=max_steps, **kwargs)
