"""Runs trained together: the members of a group share one stacked model and step together.

Random-search trials and seeds of one row are the same net with other numbers. Trained one after another, a small
net's step is a few hundred tiny kernels; trained as one, each kernel does the work of all members. Here each
member is a whole run, a `Member` (a `Trainer`: its own model, data order, optimizer, schedule, logger, run folder
and checkpoints, built by `train.build_run` exactly as it would be alone); only the training step is shared:

- its parameters are views into one stacked tensor per parameter (members, *shape), and one forward of the
  stacked model (`torch.func.vmap` over `torch.func.functional_call`) gives every member's loss; one backward gives
  every member's gradient (each member's loss depends on its own slice only);
- then each member steps its optimizer with its own learning rate, momentum and schedule: where every member uses
  SGD, one stacked update of all (`_sgd_step`, their momentum buffers views too), else each its own optimizer in
  place on its views; each clips, logs, evaluates (alone) and saves its own checkpoint, exactly as `Trainer` does;
- dropout draws each member's masks from the member's own generator (`models.dropout`, injected as `draws`),
  seeded and advanced as a lone run's default generator, so its masks do not depend on its group or its place;
- a member whose loss is not finite is handled by its own `trainer.nan_policy` (stopped and recorded as diverged,
  or its batch skipped); the group goes on without it, untouched by its NaNs;
- a member's CPU and wall time are its share of the group's shared work plus its own work (`perf/cpu_s_per_step`,
  metrics.json `time/cpu_s`), so the estimator and the reports' CPU-hours stay right;
- resume: each member resumes from its own checkpoints; a member ahead of the others (a kill between two members'
  saves) takes its previous checkpoint (`ckpt/prev.pt`) when that is at the group's step, else it waits until the
  others reach it. Aligned so, the group steps exactly as an uninterrupted one (a member that waits sits in a smaller
  group for a while, whose kernels may round differently).

Why vmap and not hand-stacked layers: one mechanism for every model, whose model files stay as they are; measured
against the same runs one after another in `make bench-grouped` (results/bench_grouped.md).
"""

from __future__ import annotations

import copy
import logging
import signal
import time
from contextlib import contextmanager, nullcontext

import torch
from torch.func import functional_call, vmap

from highway_repro.engine import checkpoint as ckpt_lib
from highway_repro.engine import flops as flops_lib
from highway_repro.engine.trainer import Diverged, Trainer, _to, cpu_seconds, tf32
from highway_repro.runtime import on_stop_signals

log = logging.getLogger(__name__)


class Member(Trainer):
    """A run in a group: a `Trainer` whose random draws come from its own generator (`gen`) and whose clocks count
    its share of the group's time (`clock`: [wall s, CPU s] so far)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # the generator a lone run's dropout would draw from (the device's default one), in its state after the
        # run's own seeding and building
        self.gen = torch.Generator(device=self.device).set_state(self._device_rng())
        self.clock = [0.0, 0.0]
        self.defer_nan_check = False  # the group reads every member's loss each step anyway

    def _cuda_index(self) -> int:
        return self.device.index if self.device.index is not None else torch.cuda.current_device()

    def _device_rng(self) -> torch.Tensor:
        """The default generator's state of this member's device (CPU, or its CUDA device)."""
        return torch.cuda.get_rng_state(self._cuda_index()) if self.device.type == "cuda" else torch.get_rng_state()

    @contextmanager
    def own_draws(self):
        """Within: the device's default generator in the state of `gen` (a lone forward draws what the group's
        stacked forward would), the process's generators restored after."""
        cuda = self.device.type == "cuda"
        with torch.random.fork_rng(devices=[self._cuda_index()] if cuda else []):
            if cuda:
                torch.cuda.set_rng_state(self.gen.get_state(), self._cuda_index())
            else:
                torch.set_rng_state(self.gen.get_state())
            yield

    def _wall(self) -> float:
        return self.clock[0]

    def _cpu(self) -> float:
        return self.clock[1]

    def state(self) -> dict:
        state = super().state()  # model and momentum tensors are views into the group's: saved as copies of their own
        state["model"] = {k: v.clone() for k, v in state["model"].items()}
        state["optimizer"]["state"] = {k: {n: v.clone() if torch.is_tensor(v) else v for n, v in st.items()}
                                       for k, st in state["optimizer"]["state"].items()}
        if self.device.type == "cuda":  # where a lone run keeps its device's generator
            cuda = list(state["rng"].get("cuda", []))
            cuda[self._cuda_index()] = self.gen.get_state()
            state["rng"] = {**state["rng"], "cuda": cuda}
        else:
            state["rng"] = {**state["rng"], "torch": self.gen.get_state()}
        return state

    def load_state(self, ckpt: dict) -> None:
        super().load_state(ckpt)
        rng = ckpt["rng"]
        self.gen.set_state(rng["cuda"][self._cuda_index()] if self.device.type == "cuda" else rng["torch"])

    def save(self, name: str = "last") -> None:
        mems, self.mems = self.mems, None if self.mems is None else [m.clone() for m in self.mems]  # own copies
        try:
            super().save(name)
        finally:
            self.mems = mems


class Group:
    """Members of one model shape and one trainer config, trained together (see the module docstring)."""

    def __init__(self, members: list[Member], name: str = "group", draws=None):
        """`draws(generators)`: a context manager within which the stacked forward draws member i's random numbers
        from generators[i] (`models.dropout.member_generators`; injected: the engine imports no model code); None
        for models that draw nothing while training."""
        self.members, self.name, self.draws = list(members), name, draws
        first = members[0]
        self.task, self.cfg, self.device = first.task, first.cfg, first.device
        self.base = copy.deepcopy(first.raw_model)  # the module whose forward vmap runs, on stacked tensors
        for module in self.base.modules():  # the plain formulas: kernels.py's hand-written backwards have no
            if hasattr(module, "fused"):     # per-member rule (same numbers: tests/test_fast_paths.py)
                module.fused = False
        self.cohort: list[Member] = []
        self.params: dict = {}
        self.buffers: dict = {}
        self.sgd: dict | None = None  # stacked momentum buffers (`_stack_sgd`)
        self.mems: list | None = None  # a memory model's stacked memories (members, ...) per layer
        self.anchor = None  # while the stacked forward runs: what `draws` yields
        self._step_fn = vmap(self._one, randomness="error")
        self.step_flops = flops_lib.StepFlops()

    # ------------------------------------------------------------- stacking
    def _bind(self, cohort: list[Member]) -> None:
        """Stack the cohort's parameters and buffers; each member's become views into the stacked ones."""
        self.cohort = cohort
        models = [m.raw_model for m in cohort]
        self.params, self.buffers = {}, {}
        for name, _ in self.base.named_parameters():
            stacked = torch.stack([m.get_parameter(name).detach() for m in models]).requires_grad_()
            for i, m in enumerate(models):
                m.get_parameter(name).data = stacked.data[i]
            self.params[name] = stacked
        self.sgd = self._stack_sgd(cohort)
        own = [m.mems for m in cohort]  # a memory model's memories: all None (a new pass) or all lists
        self.mems = None if any(x is None for x in own) else [torch.stack(parts) for parts in zip(*own)]
        for name, _ in self.base.named_buffers():
            stacked = torch.stack([m.get_buffer(name) for m in models])
            for i, m in enumerate(models):
                owner, _, leaf = name.rpartition(".")
                m.get_submodule(owner)._buffers[leaf] = stacked[i]
            self.buffers[name] = stacked

    def _stack_sgd(self, cohort: list[Member]) -> dict | None:
        """Stacked momentum buffers, each member's optimizer state a view into them, where every member's optimizer
        is torch.optim.SGD with one parameter group of all parameters, dampening 0, not maximize: then one stacked
        update steps them all (`_sgd_step`); else None, and each member steps its own optimizer. (A zero buffer and
        torch's absent one give the same first step when dampening is 0.)"""
        n = len(self.params)
        if not all(type(m.optimizer) is torch.optim.SGD and len(m.optimizer.param_groups) == 1
                   and len(m.optimizer.param_groups[0]["params"]) == n and m.optimizer.param_groups[0]["dampening"] == 0
                   and not m.optimizer.param_groups[0]["maximize"] for m in cohort):
            return None
        bufs = {}
        for name in self.params:
            own = [m.raw_model.get_parameter(name) for m in cohort]
            saved = [m.optimizer.state.get(p, {}).get("momentum_buffer") for m, p in zip(cohort, own)]
            bufs[name] = torch.stack([torch.zeros_like(p) if b is None else b.detach() for b, p in zip(saved, own)])
            for i, (m, p) in enumerate(zip(cohort, own)):
                if m.optimizer.param_groups[0]["momentum"]:
                    m.optimizer.state[p]["momentum_buffer"] = bufs[name][i]
        return bufs

    @torch.no_grad()
    def _sgd_step(self, cohort: list[Member]) -> None:
        """torch.optim.SGD's update (weight decay, momentum, Nesterov) of every member at once, each with its own
        learning rate, momentum and weight decay, on the stacked parameters."""
        groups = [m.optimizer.param_groups[0] for m in cohort]
        dtype = next(iter(self.params.values())).dtype

        def column(key):
            return torch.tensor([float(g[key]) for g in groups], dtype=dtype, device=self.device)

        lr, momentum, decay = column("lr"), column("momentum"), column("weight_decay")
        nesterov = torch.tensor([bool(g["nesterov"]) for g in groups], device=self.device)
        for name, p in self.params.items():
            shape = (-1,) + (1,) * (p.dim() - 1)
            d_p = p.grad if not bool(decay.any()) else p.grad.add(p * decay.view(shape))
            buf = self.sgd[name]
            buf.mul_(momentum.view(shape)).add_(d_p)  # momentum 0: buf = d_p, torch's update without momentum
            step = torch.where(nesterov.view(shape), d_p + buf * momentum.view(shape), buf) if nesterov.any() else buf
            p.sub_(step * lr.view(shape))

    def _one(self, params, buffers, zero, mems, *batch):
        """One member's loss, sums and new memory ([] without one) from its memory ([]: none); vmap maps it over
        the members. `zero`: the member's 0, for the random draws' anchor (`draws`)."""
        if self.anchor is not None:
            self.anchor(zero)

        def model(*args, **kwargs):
            return functional_call(self.base, (params, buffers), args, kwargs)

        loss, sums, new = self.task.forward(model, batch, mems or None, score_len=self.score_len)
        return loss, sums, list(new or [])

    # ------------------------------------------------------------- resume
    def _align(self) -> None:
        """Members resumed at different steps (a kill between two members' saves): one ahead of the slowest takes
        its previous checkpoint where that one is at the slowest's step; else it waits for the others."""
        low = min(m.step for m in self.members)
        for m in self.members:
            if m.step > low and (m.ckpt_dir / "prev.pt").exists():
                prev = ckpt_lib.load(m.ckpt_dir / "prev.pt", map_location=m.device)
                if prev["step"] == low:
                    m.resume_from(prev)

    # ------------------------------------------------------------- training
    def fit(self) -> list[dict]:
        """Train every member to its end; each member's final metrics (as `Trainer.fit` returns them), in order."""
        finals: dict[int, dict] = {}
        handlers = self._install_signals()
        self._align()
        self.score_len = getattr(self.members[0].data, "score_len", None)
        active = list(self.members)
        for m in active:
            m._start_interval(dict(m.train_acc))
            m.clock = [m.wall_time, m.cpu_time]
            m._start = (0.0, 0.0)
        try:
            with tf32(self.cfg.tf32):
                self._loop(active, finals)
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)
        return [finals[id(m)] for m in self.members]

    def _loop(self, active: list[Member], finals: dict) -> None:
        """Steps of the members at the lowest step until every member has ended."""
        while active:
            ended = [m for m in active if m.step >= m.cfg.max_steps or m.stop_requested]
            for m in ended:
                finals[id(m)] = self._timed(m, m._end_training)
            active[:] = [m for m in active if m not in ended]
            if not active:
                break
            low = min(m.step for m in active)
            cohort = [m for m in active if m.step == low]
            if cohort != self.cohort:
                self._bind(cohort)
            for m, out in self._step(cohort).items():
                finals[id(m)] = out
                active.remove(m)

    def _install_signals(self) -> dict:
        """SIGTERM / SIGINT / SIGHUP: every member finishes the step, saves `last` and stops, as a lone run does."""
        def stop(signum, frame):
            for m in self.members:
                m._request_stop(signum, frame)

        return on_stop_signals(stop)

    def _timed(self, m: Member, fn, *args):
        """fn(*args) counted in member m's clocks alone."""
        w, c = time.perf_counter(), cpu_seconds()
        try:
            return fn(*args)
        finally:
            m.clock[0] += time.perf_counter() - w
            m.clock[1] += cpu_seconds() - c

    def _each(self, cohort: list[Member], ended: dict, fn) -> None:
        """fn(i, member) for each member of the cohort not ended, counted in its own clocks; one that diverges is
        ended (`ended[member]`: its final metrics)."""
        for i, m in enumerate(cohort):
            if m in ended:
                continue
            try:
                self._timed(m, fn, i, m)
            except Diverged as e:
                ended[m] = m._diverged(e)

    def _share(self, cohort: list[Member], w: float, c: float) -> None:
        n = len(cohort)
        dw, dc = (time.perf_counter() - w) / n, (cpu_seconds() - c) / n
        for m in cohort:
            m.clock[0] += dw
            m.clock[1] += dc

    def _step(self, cohort: list[Member]) -> dict:
        """One step of every member of the cohort; {member: its final metrics} for those that ended (diverged)."""
        w, c = time.perf_counter(), cpu_seconds()
        step = cohort[0].step
        batches = [_to(m.data.train_batch(step), self.device) for m in cohort]
        recorders = {}
        for i, m in enumerate(cohort):
            rec = m._recorder()
            if rec is not None:  # gate statistics: the member's own forward, with the draws the group's makes
                with torch.no_grad(), m.own_draws(), rec:
                    m.raw_model.train()
                    m._forward(batches[i], None, self.score_len)
                recorders[m] = rec
        if step % cohort[0].data.steps_per_epoch == 0:
            self.mems = None  # a new pass over the stream: memory starts empty
        stacked = [torch.stack(parts) for parts in zip(*batches)]
        self.base.train()
        for p in self.params.values():
            p.grad = None
        with self.step_flops.count(stacked) as counted:
            with nullcontext() if self.draws is None else self.draws([m.gen for m in cohort]) as self.anchor:
                zero = torch.zeros(len(cohort), device=self.device, dtype=next(iter(self.params.values())).dtype)
                losses, sums, new_mems = self._step_fn(self.params, self.buffers, zero, self.mems or [], *stacked)
            finite = torch.isfinite(losses.detach())
            torch.where(finite, losses, torch.zeros_like(losses)).sum().backward()
        ok, flops = finite.tolist(), counted.flops // len(cohort)
        self.mems = [x.detach() for x in new_mems] or None
        for i, m in enumerate(cohort):
            m.mems = None if self.mems is None else [x[i] for x in self.mems]
        stacked_sgd = all(ok) and self.sgd is not None
        self._share(cohort, w, c)
        ended: dict = {}

        def gradients(i: int, m: Member) -> None:
            if not ok[i]:
                m._bad_step(step, losses[i].detach())  # raises Diverged, or skips the batch
                m.step += 1
                return
            if not stacked_sgd or m.cfg.grad_clip:  # (the stacked step needs no member's own gradients)
                for name, p in m.raw_model.named_parameters():
                    p.grad = self.params[name].grad[i]
                m._clip()
            if not stacked_sgd:
                m.optimizer.step()  # in place on its views, momentum buffers included

        def bookkeeping(i: int, m: Member) -> None:
            if ok[i]:
                m._update({k: v[i] for k, v in sums.items()}, self.task.items(batches[i]), flops, m.mems, stepped=True)
                m._end_step(recorders.get(m))

        self._each(cohort, ended, gradients)
        if stacked_sgd:
            w, c = time.perf_counter(), cpu_seconds()
            self._sgd_step(cohort)
            for m in cohort:
                m.optimizer._opt_called = True  # what torch's LR scheduler asks of a stepped optimizer
            self._share(cohort, w, c)
        self._each(cohort, ended, bookkeeping)
        if ended:
            self.cohort = []  # rebind without them
        return ended
