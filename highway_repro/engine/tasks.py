"""Tasks turn model outputs and targets into a loss and metric sums.

The trainer treats every model and data set alike: it calls
`task.forward(model, batch, state, score_len)` and gets the loss to back-propagate,
additive sums and the new state (a memory model's memory); `task.summarize(sums)`
turns accumulated sums into metrics; `task.items(batch)` counts what throughput is
measured in, `task.unit` ("tokens" or "samples": `perf/<unit>_per_s`).

Language-model metrics (REFERENCE.md C): loss = mean NLL in nats per scored
token, bpc = loss / ln 2, ppl = exp(loss). Always all three, per split.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _full(logits: torch.Tensor) -> torch.Tensor:
    """Logits at least in fp32 for the loss (bf16 / fp16 ones upcast; fp64 ones kept)."""
    return logits if logits.dtype == torch.float64 else logits.float()


class Classification:
    """Cross-entropy classification; metrics `loss` (nats) and `acc` (fraction)."""

    kind = "classification"
    unit = "samples"

    def forward(self, model, batch, state=None, score_len: int | None = None):
        x, y = batch[:2]
        logits = model(x)  # (B, K)
        loss = F.cross_entropy(_full(logits), y)
        n = y.numel()
        correct = (logits.argmax(-1) == y).sum()
        sums = {"nll": loss.detach() * n, "correct": correct, "n": torch.tensor(float(n))}
        return loss, sums, None

    @staticmethod
    def summarize(sums: dict) -> dict:
        n = float(sums["n"])
        return {"loss": float(sums["nll"]) / n, "acc": float(sums["correct"]) / n}

    @staticmethod
    def items(batch) -> int:
        return int(batch[1].shape[0])


class LanguageModel:
    """Next-token cross-entropy over the last `score_len` positions of each window.

    `score_len=None` scores every position. The R-Transformer protocol scores only
    the last 320 of 400 characters (char-PTB) or 40 of 80 words (word-PTB). A batch
    (x, y, n_scored) overrides it: the data decides how many last positions count.
    Models with memory (Transformer-XL) get their memory through `state` and
    return the new one.
    """

    kind = "lm"
    unit = "tokens"

    def forward(self, model, batch, state=None, score_len: int | None = None):
        if len(batch) == 3:
            x, y, score_len = batch
        else:
            x, y = batch  # (B, T) each
        if score_len is not None and score_len < y.shape[1]:
            y = y[:, -score_len:]  # (B, S)
        else:
            score_len = None
        logits, new_mems = model(x, mems=state, score_len=score_len)  # (B, S, V), the head on scored positions only
        nll = F.cross_entropy(_full(logits.reshape(-1, logits.shape[-1])), y.reshape(-1))
        n = y.numel()
        sums = {"nll": nll.detach() * n, "n": torch.tensor(float(n))}
        return nll, sums, new_mems

    @staticmethod
    def summarize(sums: dict) -> dict:
        loss = float(sums["nll"]) / float(sums["n"])
        return {"loss": loss, "bpc": loss / math.log(2), "ppl": math.exp(min(loss, 700.0))}

    @staticmethod
    def items(batch) -> int:
        return int(batch[1].numel())  # every target token of the window, scored or not


TASKS = {"classification": Classification, "lm": LanguageModel}


def build_task(kind: str):
    if kind not in TASKS:
        raise ValueError(f"task kind {kind!r} is not known (valid: {', '.join(TASKS)})")
    return TASKS[kind]()
