"""The training loop: one plain PyTorch loop for image classification and language modelling.

The trainer knows no specific model or data set. It asks the data for the batch
of a global step (`data.train_batch(step)`, a pure function of seed and step, so a
resumed run sees the same batches), asks the task for loss and metric sums, and
owns evaluation, schedules, clipping, autocast, checkpoints and logging.

Everything that depends on the task (what a batch holds, which positions are
scored, what throughput counts) is in the task object (`engine/tasks.py`); gate
statistics come from an injected recorder (`gate_recorder(model)`, a context
manager with `stats()`, e.g. `models.probe.GateRecorder`): the engine imports no model code.

Logged beside the training loss every `log_every` steps: `perf/tokens_per_s` or
`perf/samples_per_s`, `perf/flops_per_s` (forward + backward FLOPs of the steps,
counted by `engine/flops.py` as the benchmarks do, over the time of the training
steps: evaluation and checkpoints are left out), `perf/cpu_s_per_step` (this
process's CPU time per training step over the same steps: unlike the rates, not
inflated when other jobs share the cores) and, where the device's peak is
known (a GPU of `flops.PEAK_FLOPS`, or `trainer.peak_flops`), `perf/mfu`; on CPU
there is no MFU. metrics.json records `time/wall_s` and `time/cpu_s` (this
process's user + system CPU time; rank 0 under DDP) of the training, both carried
across resumes; run_info.json records `peak_rss_gb`, the largest resident memory of
the processes that trained the run.

Resume: `ckpt/last.pt` holds model, optimizer, scheduler, step, best_val, RNG
states, the memory of a memory model and the resolved config; a resumed run
continues with results identical to an uninterrupted one (CPU, deterministic
mode). SIGTERM / SIGINT / SIGHUP finish the current step, save `last` and exit cleanly; during the final evaluation
they stop it at the next batch (at the next split under DDP), save `last` as it was before the evaluation and
write metrics.json with `status: interrupted`: the handlers stay until metrics.json is written, and
`resume=auto` redoes the final evaluation.
"""

from __future__ import annotations

import logging
import math
import resource
import signal
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from highway_repro.engine import checkpoint as ckpt_lib
from highway_repro.engine import flops as flops_lib
from highway_repro.engine.evaluation import Evaluation, _add, _to  # noqa: F401  (_to: also the group's)
from highway_repro.engine.loggers import write_json_atomic
from highway_repro.engine.trainer_config import (Diverged, Interrupted, TrainerConfig, cpu_seconds,  # noqa: F401
                                                 memory_format, resolve_device, tf32)
from highway_repro.errors import HighwayError
from highway_repro.runtime import on_stop_signals

log = logging.getLogger(__name__)


def compiled(model, cfg: TrainerConfig):
    """`torch.compile(model)` with `trainer.compile`'s mode and backend, shapes static (a new shape compiles anew:
    Transformer-XL's first step without memory, an evaluation's last short window). Not `model.compile()` in place:
    in torch 2.13 its compiled call runs the forward uncompiled."""
    import torch._dynamo

    backends = torch._dynamo.list_backends(exclude_tags=())
    if cfg.compile_backend not in backends:
        raise HighwayError(f"trainer.compile_backend={cfg.compile_backend!r} is not known (valid: "
                           f"{', '.join(sorted(backends))})")
    return torch.compile(model, mode=None if cfg.compile == "default" else cfg.compile, backend=cfg.compile_backend,
                         dynamic=False)


def _detach_mems(mems):
    if mems is None:
        return None
    if torch.is_tensor(mems):
        return mems.detach()
    return [m.detach() for m in mems]


class Trainer(Evaluation):
    defer_nan_check: bool | None = None  # see _loss_finite; None = on CUDA only
    counting_step: bool = False  # this step's FLOPs are counted: it runs `eager_model` (see __init__)
    in_final_eval: bool = False  # a stop signal ends the evaluation (`evaluate`) only in the final one

    def __init__(self, model, data, task, optimizer, schedule, out_dir, logger, cfg: TrainerConfig,
                 run_config: dict | None = None, dist=None, gate_recorder=None):
        self.model, self.data, self.task = model, data, task
        self.raw_model = model.module if hasattr(model, "module") else model  # without the DDP wrapper
        if cfg.gate_stats_every and gate_recorder is None:
            raise ValueError("trainer.gate_stats_every > 0 needs a gate_recorder (e.g. models.probe.GateRecorder)")
        self.gate_recorder = gate_recorder  # gate_recorder(model): a context manager that records, with stats()
        self.optimizer, self.schedule, self.logger, self.cfg = optimizer, schedule, logger, cfg
        self.out_dir = Path(out_dir)
        self.ckpt_dir = self.out_dir / "ckpt"
        self.run_config = run_config or {}
        self.dist = dist  # highway_repro.engine.distributed.DistInfo or None
        self.is_main = dist is None or dist.rank == 0
        self.device = resolve_device(cfg.device) if dist is None else dist.device
        # on the device before a checkpoint is loaded: Optimizer.load_state_dict puts the state where the
        # parameters are
        model.to(self.device, memory_format=memory_format(cfg.memory_format))
        self.eager_model = model  # the model's own forward: FLOPs are counted on it (a compiled call under the
        if cfg.compile != "off":  # counter would stay uncompiled for good); raw_model stays the module
            self.model = compiled(model, cfg)
        self.step = 0
        self.best_val = math.inf
        self.mems = None
        self.bad_steps = 0
        self._first_bad = None  # CUDA, nan_policy=stop: first non-finite step, kept on the device
        self.stop_requested = 0  # the signal number that asked to stop
        self.status = "running"
        self.last_eval: dict = {}
        self.last_train: dict = {}  # the last log interval's running training metrics
        self.wall_time = 0.0
        self.cpu_time = 0.0
        self.peak_rss_before = 0.0  # GiB, the processes that trained the run before a resume
        self.step_flops = flops_lib.StepFlops()
        self.peak_flops = cfg.peak_flops or flops_lib.peak_flops(self.device, cfg.precision)
        # checkpointed too, so that a resumed run logs exactly what an uninterrupted one would:
        self.train_acc: dict = {}  # training-metric sums since the last log step
        self.log_position: int | None = None  # metrics.jsonl size at the last checkpoint (resume truncates to it)

    # ----------------------------------------------------------------- state
    def peak_rss_gb(self) -> float:
        """The largest resident memory of this process so far (Linux: ru_maxrss in KiB), and of the processes
        that trained the run before a resume, in GiB."""
        return max(self.peak_rss_before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)

    def state(self) -> dict:
        return {
            "model": self.raw_model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.schedule.state_dict(), "step": self.step, "best_val": self.best_val,
            "rng": ckpt_lib.rng_state(), "config": self.run_config, "mems": self.mems,
            "extra": {"bad_steps": self.bad_steps, "wall_time": self.wall_time, "cpu_time": self.cpu_time,
                      "peak_rss_gb": self.peak_rss_gb(),
                      "logger_run_id": getattr(self.logger, "run_id", None),
                      "train_acc": self.train_acc, "last_train": self.last_train, "log_position": self.log_position},
        }

    def load_state(self, ckpt: dict) -> None:
        ckpt_lib.load_model_state(self.raw_model, ckpt["model"], "checkpoint")
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.schedule.load_state_dict(ckpt["scheduler"])
        self.step, self.best_val = ckpt["step"], ckpt["best_val"]
        mems = ckpt.get("mems")
        if mems is not None and self.dist is not None:  # checkpoints hold the global batch's memory
            mems = self.dist.shard(list(mems))
        self.mems = None if mems is None else [m.to(self.device) for m in mems]
        extra = ckpt.get("extra", {})
        self.bad_steps, self.wall_time = extra.get("bad_steps", 0), extra.get("wall_time", 0.0)
        self.cpu_time = extra.get("cpu_time", 0.0)
        self.peak_rss_before = extra.get("peak_rss_gb", 0.0)
        self.train_acc = {k: v.to(self.device) if torch.is_tensor(v) else v
                          for k, v in extra.get("train_acc", {}).items()} if self.is_main else {}  # DDP: global sums
        self.last_train, self.log_position = extra.get("last_train", {}), extra.get("log_position")
        ckpt_lib.set_rng_state(ckpt["rng"])

    def save(self, name: str = "last") -> None:
        mems = self.mems if self.dist is None else self.dist.gather_rows(self.mems)  # DDP: a collective
        if self.is_main:
            ckpt_lib.save(self.ckpt_dir, name, {**self.state(), "mems": mems})

    def resume_from(self, ckpt: dict | None) -> bool:
        """Continue from `ckpt` (`checkpoint.load_latest` of this run's folder); None: the run starts over."""
        if ckpt is None:
            if self.is_main and hasattr(self.logger, "truncate_to"):
                self.logger.truncate_to(0)  # killed before its first checkpoint: the run starts over
            return False
        self.load_state(ckpt)
        if self.is_main:
            if self.log_position is not None and hasattr(self.logger, "truncate_to"):
                self.logger.truncate_to(self.log_position)  # drop what was logged after the checkpoint
            else:
                self.logger.truncate_after(self.step)
        log.info("resumed from %s at step %d", self.ckpt_dir, self.step)
        return True

    # ------------------------------------------------------------------ eval
    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.precision == "bf16")

    def _forward(self, batch, mems, score_len):
        model = self.eager_model if self.counting_step else self.model
        return self.task.forward(model, batch, mems, score_len=score_len)

    # ----------------------------------------------------------------- train
    def _request_stop(self, signum, frame):
        if not self.stop_requested:  # the first signal counts; repeats (a runner stopping its sweep) change nothing
            log.warning("signal %d received: finishing the current step, saving a checkpoint and stopping", signum)
            self.stop_requested = signum

    def _install_signals(self):
        return on_stop_signals(self._request_stop)

    def fit(self) -> dict:
        old_handlers = self._install_signals()
        try:
            with tf32(self.cfg.tf32):
                return self._fit()
        finally:  # kept to the last write: a signal before metrics.json is written is still a clean stop
            for s, h in old_handlers.items():
                signal.signal(s, h)

    def _cpu(self) -> float:
        """The CPU clock of this run: the process's (`cpu_seconds`); a member of a group (`engine.group`) counts its
        share of the group's."""
        return cpu_seconds()

    def _wall(self) -> float:
        return time.perf_counter()

    def _fit(self) -> dict:
        bar = None
        if self.cfg.progress and self.is_main:
            from tqdm import tqdm
            bar = tqdm(total=self.cfg.max_steps, initial=self.step, dynamic_ncols=True, mininterval=2.0)
        self._start_interval(dict(self.train_acc))
        self._start = (self._wall() - self.wall_time, self._cpu() - self.cpu_time)
        try:
            while self.step < self.cfg.max_steps and not self._stop_agreed():
                recorder = self._recorder()
                if self._train_step(recorder):
                    self._end_step(recorder, bar)
        except Diverged as e:
            return self._diverged(e)
        finally:
            if bar:
                bar.close()
        return self._end_training()

    def _start_interval(self, acc: dict) -> None:
        """Training-metric sums and counters since the last log step; t0 and c0 (CPU time) leave out evaluations
        and saves."""
        self._acc, self._items, self._flops, self._steps = acc, 0, 0, 0
        self._t0, self._c0 = self._wall(), self._cpu()

    def _recorder(self):
        """A gate recorder for this step's training forward where gate statistics are due, else None."""
        want = self.cfg.gate_stats_every > 0 and (self.step + 1) % self.cfg.gate_stats_every == 0
        return self.gate_recorder(self.raw_model) if want else None

    def _train_step(self, recorder) -> bool:
        """One training step of a lone run; False where its batch was skipped (a non-finite loss)."""
        step = self.step
        if step % self.data.steps_per_epoch == 0:
            self.mems = None  # a new pass over the stream: memory starts empty
        batch = self.data.train_batch(step)
        if self.dist is not None:  # this rank's slice of the global batch; dropout RNG from (seed, step, rank)
            batch = self.dist.shard(batch)
            self.dist.seed_step(step)
        batch = _to(batch, self.device, memory_format(self.cfg.memory_format))
        self.model.train()
        with self.step_flops.count(batch, self.mems) as counted:
            with self._autocast(), nullcontext() if recorder is None else recorder:
                self.counting_step = counted.counting
                try:
                    loss, sums, new_mems = self._forward(batch, self.mems, getattr(self.data, "score_len", None))
                finally:
                    self.counting_step = False
            finite = self._loss_finite(loss, step)
            if finite:
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
            else:
                counted.cancel()
        if not finite:
            self._bad_step(step, loss)
            self.step += 1
            return False
        self._update(sums, self.task.items(batch), counted.flops, _detach_mems(new_mems))
        return True

    def _update(self, sums: dict, items: int, flops: int, mems, stepped: bool = False) -> None:
        """Clip, the optimizer's and the schedule's step, and the step's sums into the log interval's; `stepped`:
        clipped and stepped already (a group's members, `engine.group`)."""
        if not stepped:
            self._clip()
            self.optimizer.step()
        self.schedule.step()
        self.mems = mems
        _add(self._acc, sums)
        self._items += items
        self._flops += flops
        self._steps += 1
        self.step += 1

    def _clip(self) -> None:
        if self.cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)

    def _end_step(self, recorder, bar=None) -> None:
        """After a step: the deferred finite check, the log line, gate statistics, evaluation and checkpoint."""
        cfg = self.cfg
        if self._first_bad is not None and (self.step == cfg.max_steps or any(
                e and self.step % e == 0 for e in (cfg.log_every, cfg.eval_every, cfg.checkpoint_every,
                                                   cfg.gate_stats_every))):
            self._check_finite()  # the deferred check, before anything is logged, evaluated or saved
        if bar:
            bar.update(1)
        if self.step % cfg.log_every == 0 or self.step == cfg.max_steps:
            world = 1 if self.dist is None else self.dist.world_size
            if self.dist is not None:
                self._acc = self.dist.all_reduce_sums(self._acc)
            metrics = {f"train/{k}": v for k, v in self.task.summarize(self._acc).items()}
            dt = max(self._wall() - self._t0, 1e-9)
            metrics[f"perf/{self.task.unit}_per_s"] = self._items * world / dt
            metrics["perf/flops_per_s"] = self._flops * world / dt
            metrics["perf/cpu_s_per_step"] = (self._cpu() - self._c0) / max(self._steps, 1)
            if self.peak_flops:
                metrics["perf/mfu"] = self._flops / dt / self.peak_flops  # per device: every rank does the same
            metrics["train/lr"] = self.schedule.lr()
            if recorder is not None:
                for name, st in recorder.stats().items():
                    for k, v in st.items():
                        metrics[f"gates/{name}/{k}"] = v
            self.record(metrics)
            self.last_train = {k: v for k, v in metrics.items() if k.startswith("train/")}
            if bar:
                bar.set_postfix(loss=f"{metrics['train/loss']:.4f}")
            self._start_interval({})
        elif recorder is not None:
            self.record({f"gates/{n}/{k}": v for n, st in recorder.stats().items() for k, v in st.items()})
        paused, paused_cpu = self._wall(), self._cpu()
        if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < cfg.max_steps:
            self._validate(cfg.eval_max_batches)
        if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
            self._clock_times()
            self.train_acc, self.log_position = self._acc_to_save(self._acc), self._log_size()
            if not all(bool(torch.isfinite(p).all()) for p in self.model.parameters()):
                msg = f"non-finite weights after step {self.step} (the loss was finite)"
                log.error("%s: stopping; %s", msg, self._kept())
                raise Diverged(msg)  # never overwrite the last good checkpoint with them
            self.save("last")
        self._t0 += self._wall() - paused
        self._c0 += self._cpu() - paused_cpu

    def _clock_times(self) -> None:
        self.wall_time, self.cpu_time = self._wall() - self._start[0], self._cpu() - self._start[1]

    def _diverged(self, e: Diverged) -> dict:
        self.status = "diverged"
        self._clock_times()
        return self._finish({"error": str(e)})

    def _end_training(self) -> dict:
        """The end of the training steps: interrupted (a stop signal), or the final evaluation and `done`."""
        self._clock_times()
        # the final save keeps this position: a run killed during the final evaluation redoes it, logging it once
        self.train_acc, self.log_position = self._acc_to_save(self._acc), self._log_size()
        if self.stop_requested and self.step < self.cfg.max_steps:
            return self._interrupted()
        eval_start = self._wall()
        before = self._eval_state()
        try:
            final = self._final_eval()
        except Interrupted:  # the state before the evaluation is saved: resume=auto redoes the whole of it
            self._eval_state(before)
            return self._interrupted()
        # the run's times include its final passes (the last val/test of a small net can be 10 % of its run)
        final["time/final_eval_s"] = round(self._wall() - eval_start, 2)
        self._clock_times()
        self.save("last")
        self.status = "done"
        return self._finish(final)

    def _interrupted(self) -> dict:
        self.save("last")
        self.status = "interrupted"
        return self._finish({"signal": int(self.stop_requested)})

    def _acc_to_save(self, acc: dict) -> dict:
        """The training sums since the last log step, for the checkpoint: under DDP summed over the ranks
        (a collective), so that the rank 0 that resumes them plus every rank's new sums give the global ones."""
        return acc if self.dist is None else self.dist.all_reduce_sums(acc)

    def _stop_agreed(self) -> int:
        """The stop signal; under DDP the ranks agree on it (else one would wait for the others forever)."""
        if self.dist is not None:
            self.stop_requested = self.dist.any_flag(self.stop_requested)
        if self.stop_requested:
            self._check_finite()
        return self.stop_requested

    def _loss_finite(self, loss, step: int) -> bool:
        """Whether the loss of `step` is finite (on every rank under DDP).

        On CUDA with nan_policy=stop this does not make the host wait for the device each step:
        the first non-finite step is kept on the device and `_check_finite` (one sync) runs before
        anything is logged, evaluated or saved; the run then stops at that step exactly as the
        per-step check would (status diverged, step = the bad step, the last good checkpoint kept).
        nan_policy=skip needs the decision at once and checks every step. `defer_nan_check` (None: on
        CUDA) forces either way."""
        defer = self.device.type == "cuda" if self.defer_nan_check is None else self.defer_nan_check
        if defer and self.cfg.nan_policy == "stop":
            bad_at = torch.where(torch.isfinite(loss.detach()), self.cfg.max_steps, step)
            self._first_bad = bad_at if self._first_bad is None else torch.minimum(self._first_bad, bad_at)
            return True
        bad = not bool(torch.isfinite(loss))
        if self.dist is not None:
            bad = bool(self.dist.any_flag(bad))
        return not bad

    def _check_finite(self) -> None:
        if self._first_bad is None:
            return
        first = int(self._first_bad)
        if self.dist is not None:
            first = -self.dist.any_flag(-first)  # the earliest bad step of any rank
        self._first_bad = None
        if first < self.cfg.max_steps:
            self.step = first
            self._bad_step(first, float("nan"))  # raises Diverged (nan_policy=stop)

    def _bad_step(self, step: int, loss) -> None:
        self.bad_steps += 1
        msg = f"non-finite training loss ({float(loss.detach() if torch.is_tensor(loss) else loss)}) at step {step}"
        if self.cfg.nan_policy == "skip" and self.bad_steps <= self.cfg.max_bad_steps:
            log.warning("%s: batch skipped (%d of at most %d)", msg, self.bad_steps, self.cfg.max_bad_steps)
            self.optimizer.zero_grad(set_to_none=True)
            self.mems = None
            return
        if self.cfg.nan_policy == "skip":
            msg += f" (more than trainer.max_bad_steps={self.cfg.max_bad_steps} skipped batches)"
        log.error("%s: stopping; %s", msg, self._kept())
        raise Diverged(msg)

    def _kept(self) -> str:
        if (self.ckpt_dir / "last.pt").exists():
            return f"the last good checkpoint is kept in {self.ckpt_dir}"
        return "there is no checkpoint yet (none was written before this step)"

    def _log_size(self) -> int | None:
        return self.logger.position() if self.is_main and hasattr(self.logger, "position") else None

    def record(self, metrics: dict) -> None:
        """Log `metrics` at the current step (rank 0 only): metrics.jsonl and the run's logger."""
        if self.is_main and metrics:
            self.logger.log(metrics, self.step)

    def _finish(self, final: dict) -> dict:
        best = {"val/best_loss": self.best_val} if math.isfinite(self.best_val) else {}  # (also if it stopped early)
        out = {"status": self.status, "step": self.step, **best,
               "model/params": sum(p.numel() for p in self.raw_model.parameters()),
               "time/wall_s": round(self.wall_time, 2), "time/cpu_s": round(self.cpu_time, 2), **final}
        if self.is_main:
            write_json_atomic(self.out_dir / "metrics.json", out)
            self.logger.finish(out)
        return out
