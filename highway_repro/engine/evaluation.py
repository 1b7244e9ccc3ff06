"""Evaluation of a run (a `Trainer`'s): passes over a split, the intermediate validations with best.pt, and the
final evaluation (of the last or the best weights) that a stop signal may end between passes.

The methods are the trainer's (`Trainer` subclasses `Evaluation`): they use its model, data, task, logger and
checkpoint folder."""

from __future__ import annotations

import copy

import torch

from highway_repro.engine import checkpoint as ckpt_lib
from highway_repro.engine.trainer_config import Interrupted, memory_format
from highway_repro.errors import HighwayError


def _add(acc: dict, sums: dict) -> dict:
    for k, v in sums.items():
        acc[k] = acc[k] + v if k in acc else v
    return acc


def _to(batch, device, memory_format=torch.contiguous_format):
    """The batch's tensors on `device`; 4-D ones (images, N C H W) in `memory_format`."""
    return tuple((b.to(device, non_blocking=True, memory_format=memory_format) if b.dim() == 4
                  else b.to(device, non_blocking=True)) if torch.is_tensor(b) else b for b in batch)


def _stacked(batches: list) -> tuple:
    """Batches of one shape as one: their rows one after another."""
    return tuple(torch.cat(parts) for parts in zip(*batches))


class Evaluation:
    """The evaluation methods of `Trainer`."""

    @torch.no_grad()
    def evaluate(self, split: str, max_batches: int | None = None) -> dict:
        """Metrics of one pass over `split` (its first `max_batches` batches). With `trainer.eval_stack` N > 1 and a
        model without memory, up to N consecutive batches of one shape (char-PTB's batch-1 windows, say) go through
        the model as one: the same windows and scored tokens, so the same sums up to the order of the additions;
        a model with memory (Transformer-XL) sees its batches one by one, in order."""
        self.model.eval()
        sums: dict = {}
        score_len = getattr(self.data, "eval_score_len", None)
        stack = self.cfg.eval_stack if self.dist is None else 1
        pending: list = []
        state = {"mems": None, "memoryless": None}  # known after the first batch: does the model return a memory?

        def run(batch) -> None:
            batch = _to(batch, self.device, memory_format(self.cfg.memory_format))
            with self._autocast():
                _, s, state["mems"] = self._forward(batch, state["mems"], score_len)
            if state["memoryless"] is None:
                state["memoryless"] = state["mems"] is None
            _add(sums, s)

        for i, batch in enumerate(self.data.eval_batches(split)):
            if max_batches is not None and i >= max_batches:
                break
            if self.in_final_eval and self.stop_requested and self.dist is None:
                raise Interrupted
            if self.dist is not None:  # each rank evaluates its rows; the sums are all-reduced below
                batch = self.dist.shard(batch, strict=False)
                if batch[0].shape[0] == 0:
                    continue
            if stack > 1 and state["memoryless"] and all(torch.is_tensor(b) for b in batch):
                if pending and (len(pending) == stack or pending[0][0].shape != batch[0].shape):
                    run(_stacked(pending))
                    pending = []
                pending.append(batch)
            else:
                run(batch)
        if pending:
            run(_stacked(pending))
        if self.dist is not None:
            sums = self.dist.all_reduce_sums(sums)
        if not sums:
            raise HighwayError(f"split {split!r} gave no evaluation batches")
        return {f"{split}/{k}": v for k, v in self.task.summarize(sums).items()}

    def _eval_state(self, restore: tuple | None = None) -> tuple:
        """What an evaluation changes besides the log (the scheduler's plateau state and learning rates, best_val),
        or, given such a tuple, put it back."""
        if restore is not None:
            schedule, lrs, self.best_val = restore
            self.schedule.load_state_dict(schedule)
            for g, lr in zip(self.optimizer.param_groups, lrs):
                g["lr"] = lr
        return copy.deepcopy(self.schedule.state_dict()), [g["lr"] for g in self.optimizer.param_groups], self.best_val

    def _keep_if_best(self, val_loss: float) -> None:
        """Save `best.pt` when `val_loss` (always measured on the intermediate evaluations' subset,
        the first `eval_max_batches` batches, so that every step is judged on the same data) beats the best."""
        if val_loss < self.best_val:
            self.best_val = val_loss
            self.save("best")

    def _validate(self, max_batches=None, select: bool = True) -> dict:
        metrics = {}
        if "val" in self.data.splits:
            metrics.update(self.evaluate("val", max_batches))
            val_loss = metrics["val/loss"]
            self.schedule.on_eval(val_loss)
            if select:
                self._keep_if_best(val_loss)
            metrics["val/best_loss"] = self.best_val
        if self.cfg.eval_train:
            metrics.update(self.evaluate("train", max_batches))
        if metrics:
            self.record(metrics)
        self.last_eval = metrics
        return metrics

    def _final_eval(self) -> dict:
        self.in_final_eval, last_weights = True, {}
        try:
            return self._final_passes(last_weights)
        finally:
            self.in_final_eval = False
            if last_weights:  # last.pt keeps the last step's weights, beside its optimizer state
                self.raw_model.load_state_dict(last_weights)

    def _final_passes(self, last_weights: dict) -> dict:
        """The final evaluation; `last_weights` receives the last step's weights when those of best.pt are
        evaluated (final_eval=best), for `_final_eval` to put back."""
        self._stop_point()
        cap, sub = self.cfg.final_max_batches, self.cfg.eval_max_batches
        same_data = cap == sub  # the final val pass sees exactly what the intermediate ones saw
        if self.cfg.final_eval == "best" and not same_data and "val" in self.data.splits:
            self._keep_if_best(self.evaluate("val", sub)["val/loss"])  # the last step, judged like the others
        # (with final_eval=last and a capped subset, best.pt and val/best_loss cover the intermediate evaluations)
        final = {**self.last_train, **self._validate(cap, select=same_data)}
        if self.cfg.final_eval == "best" and (self.ckpt_dir / "best.pt").exists():
            best = ckpt_lib.load(self.ckpt_dir / "best.pt", map_location=self.device)
            last_weights.update({k: v.detach().clone() for k, v in self.raw_model.state_dict().items()})
            ckpt_lib.load_model_state(self.raw_model, best["model"], "best checkpoint")
            self._stop_point()
            final.update(self.evaluate("val", cap))
        for split in self.cfg.splits:  # "train": a full pass replaces the running mean of the last log interval
            if split != "val" and (split == "train" or split in self.data.splits):
                self._stop_point()
                final.update(self.evaluate(split, cap))
        self.record({k: v for k, v in final.items() if k.startswith("test/")})
        return final

    def _stop_point(self) -> None:
        """Between the final evaluation's passes: a stop signal (agreed by the ranks under DDP) ends it."""
        if self._stop_agreed():
            raise Interrupted
