"""Section: runs trained together (`engine.group`) against the same runs one after another.

Fig. 1's nets (MNIST MLPs, batch 100, paper widths, SGD with momentum, each member its own learning rate and
momentum): 26 members, as a (depth, kind) row of the random search, one training step of each member per round,
grouped (one stacked step, `Group._step`) and alone (`Trainer._train_step` of each in turn), interleaved; the
trainers are the ones the runs use (bookkeeping of a step included, no log line, evaluation or checkpoint in a
round). CPU-s per member-step, and the ratio alone / grouped with its distribution-free 95 % interval over rounds.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from bench import timing
from bench.report import Budget, Report
from highway_repro.engine.group import Group, Member
from highway_repro.engine.loggers import JsonlLogger
from highway_repro.engine.schedules import build
from highway_repro.engine.tasks import Classification
from highway_repro.engine.trainer import Trainer, TrainerConfig
from highway_repro.models.dropout import member_generators
from highway_repro.models.mlp import MLP

MEMBERS = 26  # a Fig. 1 row's trials at the cpu scale
CELLS = ((10, "plain"), (10, "highway"), (50, "plain"), (50, "highway"), (100, "plain"), (100, "highway"))
LM_CASES = (("Transformer-L3, char-PTB", "ht_char_ptb"), ("Transformer-XL 6 layers, enwik8 prefix", "ht_enwik8_l6"),
            ("R-Transformer-L3, word-PTB", "ht_word_ptb"))
SEEDS = 5  # the language models: a row's seeds at the cpu scale


class _Mnist:
    """16 random batches of 100 MNIST-shaped images; the order from the member's seed."""

    kind, splits, steps_per_epoch = "classification", ("test",), 16

    def __init__(self, seed: int, x, y):
        self.x, self.y, self.order = x, y, torch.randperm(16, generator=torch.Generator().manual_seed(seed))

    def train_batch(self, step):
        i = int(self.order[step % 16])
        return self.x[i], self.y[i]


def _runs(cls, depth: int, kind: str, folder: Path, x, y, device: str = "cpu", members: int = MEMBERS) -> list:
    runs = []
    for seed in range(members):
        torch.manual_seed(seed)
        model = MLP(kind=kind, depth=depth, activation="relu", gate_bias=-2.0)
        opt = torch.optim.SGD(model.parameters(), lr=0.01 * (1 + seed % 5), momentum=(0.5, 0.9, 0.99)[seed % 3])
        cfg = TrainerConfig(max_steps=10**9, log_every=10**9, eval_every=0, checkpoint_every=0, progress=False,
                            device=device)
        out = folder / f"{cls.__name__}-{seed}"
        out.mkdir(parents=True)
        data = _Mnist(seed, x.to(device), y.to(device))
        t = cls(model, data, Classification(), opt, build(opt, max_steps=10**9), out, JsonlLogger(out), cfg)
        t._start_interval({})
        runs.append(t)
    return runs


def _lm_runs(cls, experiment: str, folder: Path, device: str = "cpu", seeds: int = SEEDS, scale: str = "cpu") -> list:
    """`seeds` runs of `experiment` at `scale`, built as `python -m highway_repro.train` builds them (real data from
    the mirror), with no log line, evaluation or checkpoint inside the timed steps."""
    from bench.sections.precision import compose
    from highway_repro.train import build_run

    runs = []
    for seed in range(seeds):
        cfg = compose(experiment, scale)
        cfg.seed = seed
        cfg.trainer.update(log_every=10**9, eval_every=0, checkpoint_every=0, gate_stats_every=0, progress=False,
                           device=device)
        out = folder / f"{cls.__name__}-{seed}"
        out.mkdir(parents=True)
        t = build_run(cfg, out, trainer_cls=cls)
        t._start_interval({})
        runs.append(t)
    return runs


def contenders(lone: list, members: list) -> dict:
    """{"alone": one step of each lone run in turn, "grouped": one stacked step of the members}."""
    group = Group(members, draws=member_generators)
    group.score_len = getattr(members[0].data, "score_len", None)
    group._bind(members)

    def alone():
        for t in lone:
            t._train_step(None)
            t._end_step(None)

    def grouped():
        group._step(members)

    return {"alone": alone, "grouped": grouped}


def _compare(lone: list, members: list, budget: Budget, args, share: float, min_rounds: int):
    """Interleaved rounds of one step of every run, alone and grouped: (CPU-ms per run-step each, ratio, interval,
    rounds)."""
    t = timing.interleaved(contenders(lone, members), warmup=2, min_rounds=min_rounds,
                           max_rounds=max(args.max_rounds, 9), budget_s=budget.alloc(share), floor_rounds=min_rounds)
    r = [a / b for a, b in zip(t["alone"], t["grouped"])]
    per = {k: timing.median(v) / len(lone) * 1e3 for k, v in t.items()}
    return per, timing.median(r), timing.median_ci(r), len(r)


def section_grouped(rep: Report, budget: Budget, args) -> dict:
    title = "Runs trained together: grouped vs one after another"
    lines = [__doc__.split("\n\n", 1)[1].strip(), "",
             "| depth | kind | alone CPU-ms / member-step | grouped CPU-ms / member-step | alone / grouped | 95 % "
             "interval | rounds |", "|---:|---|---:|---:|---:|---|---:|"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(16, 100, 1, 28, 28, generator=g), torch.randint(0, 10, (16, 100), generator=g)
    ratios = []
    try:
        for depth, kind in CELLS:
            with tempfile.TemporaryDirectory() as tmp:
                lone = _runs(Trainer, depth, kind, Path(tmp), x, y)
                members = _runs(Member, depth, kind, Path(tmp), x, y)
                per, ratio, ci, n = _compare(lone, members, budget, args, 0.04, 6)
            ratios.append(ratio)
            lines.append(f"| {depth} | {kind} | {per['alone']:.2f} | {per['grouped']:.2f} | {ratio:.2f} | "
                         + (f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "too few rounds") + f" | {n} |")
            rep.row("grouped", f"mlp{depth}-{kind}", "alone_over_grouped", ratio)
        lm_lines = []
        for label, experiment in LM_CASES:
            with tempfile.TemporaryDirectory() as tmp:
                lone = _lm_runs(Trainer, experiment, Path(tmp) / "alone")
                members = _lm_runs(Member, experiment, Path(tmp) / "grouped")
                per, ratio, ci, n = _compare(lone, members, budget, args, 0.1, 6)  # 6 rounds: an interval
            lm_lines.append(f"| {label} | {per['alone']:.0f} | {per['grouped']:.0f} | {ratio:.2f} | "
                            + (f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "too few rounds") + f" | {n} |")
            rep.row("grouped", experiment, "alone_over_grouped_lm", ratio)
    finally:
        torch.set_num_threads(threads)
    mean = sum(ratios) / len(ratios)
    lines += ["", f"Mean ratio over the six nets: {mean:.2f}x (goal on this CPU: >= 2x, aim 5x).", "",
              f"The language models at their cpu-scale size and recipe (`scale=cpu`: model, data from the mirror, "
              f"optimizer, clipping), {SEEDS} seeds, built as the trainer builds them; in a group they take their "
              "plain formulas (the fused kernels off, attention and the local RNN written out). CPU-ms per run-step:",
              "", "| model | alone | grouped | alone / grouped | 95 % interval | rounds |",
              "|---|---:|---:|---:|---|---:|", *lm_lines]
    rep.target("Fig. 1's nets grouped vs alone, CPU-s per member-step, mean over depths 10-100",
               f"{mean:.2f}x", ">= 2x (aim 5x)", mean >= 2.0)
    rep.section(title, lines)
    return {}
