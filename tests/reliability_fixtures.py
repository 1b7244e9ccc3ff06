"""Fault injection for tests/test_reliability.py, used through the config (`data._target_=...`), not via hooks
in production code: a real data set whose training batches are NaN at chosen steps."""

from __future__ import annotations

import torch

from highway_repro import data as data_lib


def nan_data(nan_steps=(), **kwargs):
    """`highway_repro.data.build(**kwargs)`, with x = NaN in the training batches of the steps in `nan_steps`."""
    d = data_lib.build(**kwargs)
    clean = d.train_batch
    bad = {int(s) for s in nan_steps}

    def train_batch(step):
        x, y = clean(step)
        return (torch.full_like(x, float("nan")), y) if int(step) in bad else (x, y)

    d.train_batch = train_batch
    return d
