"""Dropout that draws each run's masks from that run's own generator when runs train together.

A lone run calls `F.dropout`: on CPU its mask is `empty_like(x).bernoulli_(1 - p) / (1 - p)` from the default
generator. A group of runs (`engine.group`) evaluates one stacked model under `torch.func.vmap`, where `F.dropout`
would draw one mask for all members from one generator, so a member's masks would depend on its group. Inside
`member_generators(gens)`, `Dropout` multiplies by `keep_mask(x, p)` instead, a custom op whose vmap rule draws
member i's mask of x's unbatched shape from `gens[i]`: the bits `F.dropout` draws for a lone run whose default
generator is in the state of `gens[i]` (tests/test_group.py checks it), whatever the group's size and order.
The rule's draws leave vmap's random-op guard (a dispatch-key guard, the one private torch API used here): they
take an explicit generator per member, which that guard cannot see.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

_GENERATORS: list[torch.Generator] | None = None  # set while a group's members run (`member_generators`)
_ANCHOR: list = [None]  # a batched zero of the running vmap: makes a tensor that no member owns a member's own


@contextlib.contextmanager
def member_generators(gens: list[torch.Generator]):
    """Within: `dropout` under vmap draws member i's mask from `gens[i]`. Yields `anchor(zero)`, which the stacked
    forward calls with a batched zero (one per member) before the model runs: a tensor the same in every member
    (Transformer-XL's relative position embedding) is dropped out with each member's own mask too."""
    global _GENERATORS
    before, _GENERATORS = (_GENERATORS, _ANCHOR[0]), list(gens)
    try:
        yield lambda zero: _ANCHOR.__setitem__(0, zero)
    finally:
        _GENERATORS, _ANCHOR[0] = before


def _draw(shape, like: torch.Tensor, p: float, gen: torch.Generator | None) -> torch.Tensor:
    return torch.empty(shape, dtype=like.dtype, device=like.device).bernoulli_(1 - p, generator=gen).div_(1 - p)


@torch.library.custom_op("highway_repro::keep_mask", mutates_args=())
def keep_mask(like: torch.Tensor, p: float) -> torch.Tensor:
    """The scaled keep mask of dropout p for a tensor like `like` (unbatched: from the default generator)."""
    return _draw(like.shape, like, p, None)


@keep_mask.register_fake
def _(like, p):
    return torch.empty_like(like)


def _keep_mask_vmap(info, in_dims, like, p):
    if _GENERATORS is None or len(_GENERATORS) != info.batch_size:
        raise RuntimeError(f"keep_mask under vmap needs member_generators() with one generator per member "
                           f"({info.batch_size}), got {None if _GENERATORS is None else len(_GENERATORS)}")
    like = like.movedim(in_dims[0], 0)  # (members, *shape)
    vmap_mode = torch._C.DispatchKeySet(torch._C.DispatchKey.FuncTorchVmapMode)
    with torch._C._ExcludeDispatchKeyGuard(vmap_mode):
        return torch.stack([_draw(like.shape[1:], like, p, g) for g in _GENERATORS]), 0


torch.library.register_vmap("highway_repro::keep_mask", _keep_mask_vmap)


def grouped() -> bool:
    """Whether a group's stacked forward is running (models take their plain, per-member-drawing paths)."""
    return _GENERATORS is not None


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """`F.dropout(x, p, training)`; inside `member_generators` each member's mask comes from its own generator."""
    if _GENERATORS is None or not training or p == 0:
        return F.dropout(x, p, training)
    if _ANCHOR[0] is not None:
        x = x + _ANCHOR[0]  # (a tensor no member owns becomes each member's: + 0 changes no value)
    return x * keep_mask(x, float(p))


class Dropout(nn.Dropout):
    """`nn.Dropout` through `dropout` (each member's own masks in a group)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inplace:
            return F.dropout(x, self.p, self.training, True)
        return dropout(x, self.p, self.training)
