"""The project's OmegaConf resolvers, registered by `register()` (the training entry point, the runner's plan and the
scripts that compose configs call it before composing).

`${hp:${trial},lr,loguniform,0.001,0.3}`: a seeded random search written in config files.
"""

from __future__ import annotations

import math
import random

from omegaconf import OmegaConf

DISTRIBUTIONS = ("loguniform", "uniform", "choice")


def hp(trial, name, dist, *args):
    """The value of hyperparameter `name` in trial `trial`: a pure function of (trial, name), so a sweep over
    `trial=range(0,N)` is a reproducible random search whose grid is versioned with the code. `dist` is
    loguniform or uniform (args: low, high) or choice (args: the values)."""
    rng = random.Random(f"{trial}:{name}")
    if dist == "loguniform":
        lo, hi = float(args[0]), float(args[1])
        return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    if dist == "uniform":
        return float(rng.uniform(float(args[0]), float(args[1])))
    if dist == "choice":
        return rng.choice(list(args))
    raise ValueError(f"hp distribution {dist!r} is not known (valid: {', '.join(DISTRIBUTIONS)})")


def register() -> None:
    """Register `${hp:...}` with OmegaConf (again: a no-op)."""
    if not OmegaConf.has_resolver("hp"):
        OmegaConf.register_new_resolver("hp", hp)
