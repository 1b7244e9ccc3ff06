"""Tasks turn model outputs and targets into a loss and metric sums.

The trainer treats every model alike: it calls `task.forward(model, batch, state)`
and gets the loss to back-propagate plus additive sums; `task.summarize(sums)`
turns accumulated sums into metrics.

Language-model metrics (REFERENCE.md C): loss = mean NLL in nats per scored
token, bpc = loss / ln 2, ppl = exp(loss). Always all three, per split.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


class Classification:
    """Cross-entropy classification; metrics `loss` (nats) and `acc` (fraction)."""

    kind = "classification"

    def forward(self, model, batch, state=None):
        x, y = batch
        logits = model(x)  # (B, K)
        loss = F.cross_entropy(logits.float(), y)
        n = y.numel()
        correct = (logits.argmax(-1) == y).sum()
        sums = {"nll": loss.detach() * n, "correct": correct, "n": torch.tensor(float(n))}
        return loss, sums, None

    @staticmethod
    def summarize(sums: dict) -> dict:
        n = float(sums["n"])
        return {"loss": float(sums["nll"]) / n, "acc": float(sums["correct"]) / n}


class LanguageModel:
    """Next-token cross-entropy over the last `score_len` positions of each window.

    `score_len=None` scores every position. The R-Transformer protocol scores only
    the last 320 of 400 characters (char-PTB) or 40 of 80 words (word-PTB).
    Models with memory (Transformer-XL) get their memory through `state` and
    return the new one.
    """

    kind = "lm"

    def forward(self, model, batch, state=None, score_len: int | None = None):
        x, y = batch  # (B, T) each
        logits, new_mems = model(x, mems=state)  # (B, T, V)
        if score_len is not None and score_len < y.shape[1]:
            logits, y = logits[:, -score_len:], y[:, -score_len:]
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
        n = y.numel()
        sums = {"nll": nll.detach() * n, "n": torch.tensor(float(n))}
        return nll, sums, new_mems

    @staticmethod
    def summarize(sums: dict) -> dict:
        loss = float(sums["nll"]) / float(sums["n"])
        return {"loss": loss, "bpc": loss / math.log(2), "ppl": math.exp(min(loss, 700.0))}


TASKS = {"classification": Classification, "lm": LanguageModel}


def build_task(kind: str):
    if kind not in TASKS:
        raise ValueError(f"task kind {kind!r} is not known (valid: {', '.join(TASKS)})")
    return TASKS[kind]()
