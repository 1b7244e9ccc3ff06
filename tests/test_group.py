"""Runs trained together (`engine.group`, `grouped`): a member tracks its lone run, does not depend on its group or
place in it, draws its own dropout masks, diverges alone, resumes bit-exactly; the launcher's grouping rule."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from conftest import needs_mirror
from highway_repro.engine.checkpoint import load_latest
from highway_repro.engine.group import Group, Member
from highway_repro.engine.loggers import JsonlLogger
from highway_repro.engine.schedules import build
from highway_repro.engine.tasks import Classification, LanguageModel
from highway_repro.engine.trainer import Trainer, TrainerConfig
from highway_repro.models.convnets import CifarHighwayNet, MnistHighwayNet
from highway_repro.models.dropout import Dropout, keep_mask, member_generators
from highway_repro.models.mlp import MLP
from highway_repro.models.r_transformer import RTransformer
from highway_repro.models.transformer_lm import TransformerLM
from highway_repro.models.transformer_xl import TransformerXL

ROOT = Path(__file__).resolve().parents[1]


class _Data:
    """Random images of `shape`, 10 classes; the data order (which of 16 batches a step sees) from `seed`."""

    kind, splits = "classification", ("test",)
    steps_per_epoch = 16

    def __init__(self, seed: int, shape=(1, 28, 28), B: int = 4, dtype=torch.float32, stop_at=None):
        g = torch.Generator().manual_seed(1000)
        self.x, self.y = torch.randn(16, B, *shape, generator=g).to(dtype), torch.randint(0, 10, (16, B), generator=g)
        self.order = torch.randperm(16, generator=torch.Generator().manual_seed(seed))
        self.stop_at, self.on_stop = stop_at, None

    def train_batch(self, step):
        if step == self.stop_at and self.on_stop is not None:
            self.on_stop()
        i = int(self.order[step % 16])
        return self.x[i], self.y[i]

    def eval_batches(self, split):
        yield self.x[0], self.y[0]


class _Text:
    """A random token stream of 16 windows of (B, T) (`data.text.LMData`'s interface): windows in order, so that a
    memory model's memory carries from step to step; a new pass every 8 steps empties it."""

    kind, splits, steps_per_epoch, score_len = "lm", ("test",), 8, None

    def __init__(self, seed: int, shape=(2, 6), dtype=None):
        g = torch.Generator().manual_seed(1000 + seed)  # each member its own stream (as its own data order)
        self.x = torch.randint(0, 11, (8, *shape), generator=g)
        self.y = torch.randint(0, 11, (8, *shape), generator=g)
        self.stop_at, self.on_stop = None, None

    def train_batch(self, step):
        if step == self.stop_at and self.on_stop is not None:
            self.on_stop()
        return self.x[step % 8], self.y[step % 8]

    def eval_batches(self, split):
        yield self.x[0], self.y[0]


_LM = {"vocab_size": 11, "n_layers": 2, "d_model": 8, "n_heads": 2, "d_ff": 16, "dropout": 0.2, "fused": True}
FAMILIES = {  # small members of every groupable family: (model, input shape), dropout on wherever the model has it
    "mlp": (lambda: MLP(kind="highway", depth=4, width=6, gate_bias=-1.0, input_shape=(1, 4, 4)), (1, 4, 4)),
    "mnist_conv": (lambda: MnistHighwayNet(width=3), (1, 28, 28)),
    "cifar_conv": (lambda: CifarHighwayNet(widths=(2, 2, 2, 2)), (3, 32, 32)),
    "transformer_l3": (lambda: TransformerLM(**_LM, gate_kind="sdu_tanh", attn_dropout=0.1), None),
    "transformer_xl": (lambda: TransformerXL(**_LM, d_head=4, tgt_len=6, mem_len=6, gate_kind="sdu_sigmoid"), None),
    "r_transformer": (lambda: RTransformer(**_LM, rnn="lstm", window=3, emb_dropout=0.1, gate_kind="highway"), None),
    "r_transformer_gru": (lambda: RTransformer(**_LM, rnn="gru", window=3), None),
}


def _run(tmp: Path, family: str, seed: int, steps: int, dtype=torch.float32, cls=Trainer, lr=None,
         checkpoint_every=0):
    """A run of `family` as train.build_run makes one: seeded, built, then its trainer (lone or member)."""
    make, shape = FAMILIES[family]
    torch.manual_seed(seed)
    model = make().to(dtype)
    base = 0.02 if family == "mlp" else 0.002  # (training that stays sane: no exploding logits)
    lr = base * (1 + seed % 3) if lr is None else lr  # each member its own learning rate and momentum
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=(0.5, 0.9, 0.0)[seed % 3])
    cfg = TrainerConfig(max_steps=steps, log_every=1, eval_every=0, checkpoint_every=checkpoint_every,
                        progress=False, device="cpu", splits=["test"])
    out = tmp / f"{family}-{seed}"
    out.mkdir(parents=True, exist_ok=True)
    data, task = (_Data(seed, shape, dtype=dtype), Classification()) if shape else (_Text(seed), LanguageModel())
    return cls(model, data, task, opt, build(opt, max_steps=steps), out, JsonlLogger(out), cfg)


def _losses(t) -> list[float]:
    lines = [json.loads(x) for x in (t.out_dir / "metrics.jsonl").read_text().splitlines()]
    return [x["train/loss"] for x in lines if "train/loss" in x]


def _rel(a: list[float], b: list[float]) -> float:
    """The largest relative difference of two loss curves; a loss below 0.1 (a small net memorising its 16
    batches) counts as 0.1, where a relative difference of a vanishing number says nothing."""
    return max(abs(x - y) / max(abs(y), 0.1) for x, y in zip(a, b))


def _lone(tmp, family, seed, steps, dtype):
    t = _run(tmp / "lone", family, seed, steps, dtype)
    t.fit()
    return _losses(t)


def _group(tmp, family, seeds, steps, dtype, **kw):
    members = [_run(tmp, family, s, steps, dtype, cls=Member, **kw) for s in seeds]
    finals = Group(members, draws=member_generators).fit()
    return members, finals


@pytest.mark.parametrize("family,dtype,steps,tol", [
    ("mlp", torch.float64, 200, 1e-9), ("mlp", torch.float32, 20, 1e-5), ("cifar_conv", torch.float32, 20, 1e-5),
    ("transformer_xl", torch.float64, 30, 1e-9), ("r_transformer", torch.float32, 20, 1e-5),
    # every family over 200 fp64 steps (5-40 s each here), Transformer-L3 and the GRU R-Transformer only here
    *(pytest.param(f, torch.float64, 200, 1e-9, marks=pytest.mark.slow)
      for f in ("mnist_conv", "cifar_conv", "transformer_l3", "transformer_xl", "r_transformer", "r_transformer_gru"))])
def test_a_member_tracks_its_lone_run_in_groups_of_1_3_8_at_any_place(tmp_path, family, dtype, steps, tol):
    checked = (0, 2, 5)  # at places 0 of 1; 1 and 0 of 3; 7, 5 and 2 of 8
    lone = {s: _lone(tmp_path, family, s, steps, dtype) for s in checked}
    seen = {}
    for seeds in ([0], [2, 0, 1], [7, 6, 5, 4, 3, 2, 1, 0]):
        members, finals = _group(tmp_path / f"g{len(seeds)}", family, seeds, steps, dtype)
        assert [f["status"] for f in finals] == ["done"] * len(seeds)
        for s, m in zip(seeds, members):
            got = _losses(m)
            assert len(got) == steps
            if s in checked:
                rel = _rel(got, lone[s])
                assert rel <= tol, (family, s, len(seeds), rel)
                seen.setdefault(s, []).append(got)
    # member 0 at place 0 of 1, 1 of 3 and 7 of 8: the same numbers wherever it sat, up to the rounding of kernels
    # that differ with the group's size and a slice's memory alignment (bitwise in most places, not in all)
    for a, b in ((seen[0][0], seen[0][1]), (seen[0][1], seen[0][2]), (seen[2][0], seen[2][1])):
        assert _rel(a, b) <= tol


def test_each_member_draws_the_dropout_masks_of_its_lone_run():
    x = torch.randn(3, 4, 5)
    gens = [torch.Generator().manual_seed(s) for s in (4, 9, 1)]
    with member_generators(gens):
        y = torch.func.vmap(lambda t: t * keep_mask(t, 0.3), randomness="error")(x)
    for i, s in enumerate((4, 9, 1)):
        torch.manual_seed(s)
        assert torch.equal(y[i], F.dropout(x[i], 0.3, True))
    d = Dropout(0.3)
    torch.manual_seed(5)
    a = d(x)
    torch.manual_seed(5)
    assert torch.equal(a, F.dropout(x, 0.3, True))  # outside a group: torch's dropout itself


def test_a_diverging_member_stops_alone_and_the_others_do_not_notice(tmp_path):
    steps = 12
    members = [_run(tmp_path / "g", "mlp", s, steps, cls=Member, lr=lr) for s, lr in ((0, 0.02), (1, 1e30), (2, 0.06))]
    finals = Group(members, draws=member_generators).fit()
    assert [f["status"] for f in finals] == ["done", "diverged", "done"]
    assert "non-finite" in finals[1]["error"]
    alone = [_run(tmp_path / "g2", "mlp", s, steps, cls=Member, lr=lr) for s, lr in ((0, 0.02), (2, 0.06))]
    Group(alone, draws=member_generators).fit()
    for m, a in ((members[0], alone[0]), (members[2], alone[1])):  # (a group of 2 rounds as one of 3 may not)
        assert _rel(_losses(m), _losses(a)) <= 1e-5
    assert json.loads((members[1].out_dir / "metrics.json").read_text())["status"] == "diverged"


@pytest.mark.parametrize("family", ["mlp", "transformer_xl"])  # (Transformer-XL: its memories are saved too)
def test_a_stopped_group_resumes_bit_exactly_even_with_members_saved_one_step_apart(tmp_path, family):
    steps, seeds = 20, (0, 1, 2)
    whole, _ = _group(tmp_path / "whole", family, seeds, steps, torch.float32, checkpoint_every=5)
    cut = [_run(tmp_path / "cut", family, s, steps, cls=Member, checkpoint_every=5) for s in seeds]
    group = Group(cut, draws=member_generators)  # at step 8 member 0's data asks every member to stop (SIGTERM):
    # each ends its step, saves `last` and stops
    cut[0].data.stop_at, cut[0].data.on_stop = 8, lambda: [m._request_stop(signal.SIGTERM, None) for m in cut]
    finals = group.fit()
    assert [f["status"] for f in finals] == ["interrupted"] * 3 and {m.step for m in cut} == {9}
    # a kill between two members' saves: member 0's newest checkpoint is a save behind (its prev.pt)
    ck = cut[0].ckpt_dir
    (ck / "prev.pt").replace(ck / "last.pt")
    again = []
    for s in seeds:
        m = _run(tmp_path / "cut", family, s, steps, cls=Member, checkpoint_every=5)
        m.resume_from(load_latest(m.ckpt_dir))
        again.append(m)
    assert [m.step for m in again] == [5, 9, 9]
    finals = Group(again, draws=member_generators).fit()
    assert [f["status"] for f in finals] == ["done"] * 3
    for a, b in zip(again, whole):
        assert _losses(a) == _losses(b)
        assert all(torch.equal(p, q) for p, q in zip(a.raw_model.parameters(), b.raw_model.parameters()))


def test_a_members_time_is_its_share_of_the_group(tmp_path):
    members, finals = _group(tmp_path, "mlp", (0, 1, 2, 3), 30, torch.float32)
    cpu = [f["time/cpu_s"] for f in finals]
    assert all(c > 0 for c in cpu) and max(cpu) < 2 * min(cpu)
    run = json.loads((members[0].out_dir / "metrics.jsonl").read_text().splitlines()[-2])
    assert run["perf/flops_per_s"] > 0 and run["perf/cpu_s_per_step"] > 0


def test_groups_are_formed_by_shape_and_size():
    from highway_repro.train.grouped import group_size, plan_groups
    from highway_repro.errors import ConfigError

    def job(depth, seed, lr, act="relu"):
        cfg = OmegaConf.create({"seed": seed, "model": {"depth": depth, "activation": act, "gate_bias": -seed},
                                "optim": {"optimizer": {"_target_": "torch.optim.SGD", "lr": lr}},
                                "trainer": {"max_steps": 10}})
        return cfg, Path(f"d{depth}-{seed}-{act}"), True, None

    jobs = [job(10, 0, 0.1), job(20, 1, 0.1), job(10, 2, 0.3), job(10, 3, 0.1, "tanh"), job(10, 4, 0.2)]
    names = [[j[1].name for j in g] for g in plan_groups(jobs, 2)]
    assert names == [["d10-0-relu", "d10-2-relu"], ["d10-4-relu"], ["d20-1-relu"], ["d10-3-tanh"]]
    assert len(plan_groups(jobs, "auto")) == 3
    with pytest.raises(ConfigError, match="hydra.launcher.size=0 is not valid"):
        group_size(0)


@pytest.mark.slow
@needs_mirror  # real MNIST
def test_grouped_launcher_writes_the_lone_runs_folders_and_survives_kill_9(tmp_path):
    """hn_fig1 at the smoke scale, 4 trials: grouped and killed with -9 once (while checkpoints are written), then
    resume=auto, ends bit-identical to the uninterrupted grouped multirun, and writes the lone runs' files and keys,
    with their numbers up to the group's rounding."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = [sys.executable, "-m", "highway_repro.train", "-m", "experiment=hn_fig1", "scale=smoke",
            "trial=range(0,4)", "trainer.max_steps=400", "trainer.checkpoint_every=50", "resume=auto",
            "trainer.progress=false"]
    subprocess.run(base + [f"hydra.sweep.dir={tmp_path / 'lone'}"], cwd=ROOT, env=env, check=True,
                   capture_output=True)
    grouped = base + ["hydra/launcher=grouped"]
    subprocess.run(grouped + [f"hydra.sweep.dir={tmp_path / 'whole'}"], cwd=ROOT, env=env, check=True,
                   capture_output=True)
    cut = grouped + [f"hydra.sweep.dir={tmp_path / 'group'}"]
    proc = subprocess.Popen(cut, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and len(list((tmp_path / "group").glob("*/ckpt/prev.pt"))) < 2:
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    assert len(list((tmp_path / "group").glob("*/metrics.json"))) < 4  # the kill landed while the group trained
    subprocess.run(cut, cwd=ROOT, env=env, check=True, capture_output=True)
    for run in sorted((tmp_path / "lone").glob("trial=*")):
        other, whole = tmp_path / "group" / run.name, tmp_path / "whole" / run.name
        assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in other.iterdir())
        a, b, c = (json.loads((r / "metrics.json").read_text()) for r in (run, other, whole))
        assert a.keys() == b.keys() == c.keys()
        for k in a:
            if not k.startswith(("time/", "perf/")):
                assert b[k] == c[k], (run.name, k, b[k], c[k])  # killed and resumed = uninterrupted
                assert a[k] == b[k] or math.isclose(a[k], b[k], rel_tol=1e-5), (run.name, k, a[k], b[k])
        assert json.loads((other / "run_info.json").read_text())["group"]["size"] in (1, 2, 3, 4)


@pytest.mark.slow
def test_each_member_logs_into_its_own_wandb_run(tmp_path):
    """W&B (offline) gets one run per member, all open at once while the group trains."""
    from highway_repro.engine.loggers import WandbLogger

    members = []
    for seed in (0, 1, 2):
        m = _run(tmp_path, "mlp", seed, 6, cls=Member)
        m.logger = WandbLogger(m.out_dir, name=f"member-{seed}", mode="offline", config={"seed": seed})
        members.append(m)
    Group(members, draws=member_generators).fit()
    ids = {m.logger.run_id for m in members}
    assert len(ids) == 3
    for m in members:
        runs = list((m.out_dir / "wandb").glob("offline-run-*"))
        assert len(runs) == 1 and m.logger.run_id in runs[0].name


def test_the_runner_trains_a_table_in_one_grouped_command_per_row_and_size():
    from highway_repro.errors import ConfigError
    from highway_repro.train.grouped import check_groupable
    from highway_repro.grids import named_jobs
    from highway_repro.runner.plan import excluded, plan_grids
    from highway_repro.runner.table import group_commands, group_of

    cfg, fgs = plan_grids("hn_fig1", "cpu", [])
    jobs = named_jobs(fgs, excluded(cfg))
    names = list(jobs)
    commands, members = zip(*group_commands(jobs, names, 32))
    assert sorted(n for m in members for n in m) == sorted(names)
    assert all("hydra/launcher=grouped" in c and "hydra.launcher.size=32" in c for c in commands)
    trials = [c[-1].split("=", 1)[1].split(",") for c in commands]
    assert sum(map(len, trials)) == len(names) == 460 and max(map(len, trials)) == 32
    assert len(commands) == 12 + 2 * 3  # 12 rows of 26 trials; depth 50's second look: 74 trials a row, 32 + 32 + 10
    assert group_of(cfg, "1") == 1 and group_of(cfg, "auto") == 32 and group_of(cfg, "8") == 8
    bad = OmegaConf.create({"model": {"_target_": "x.Other"}, "trainer": {"precision": "fp32", "nan_policy": "stop"}})
    with pytest.raises(ConfigError, match="model._target_=x.Other cannot train in a group"):
        check_groupable([bad])


def test_a_launcher_given_by_hand_trains_a_grouped_table_ungrouped(tmp_path, capsys, monkeypatch):
    """Fig. 1 groups its trials by default (hydra/launcher=grouped); a launcher given by hand runs each job itself
    (its commands carry no grouped launcher, whose keys it would refuse); with --group it is one line, exit code 2."""
    from highway_repro.runner import cli

    queued = []
    monkeypatch.setattr(cli, "run_queue", lambda plans, *a, **kw: queued.extend(plans) or 0)  # nothing trains
    common = ["hn_fig1", "--scale", "smoke", "--runs", str(tmp_path / "runs"), "--results", str(tmp_path / "r"),
              "hydra/launcher=joblib"]
    cli.main(common)
    commands = [c for p in queued for c in p.commands]
    assert commands and all("hydra/launcher=joblib" in c and "hydra/launcher=grouped" not in c for c in commands)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        cli.main([*common, "--group", "4"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: hydra/launcher=joblib with --group=4: runs trained together go by "
                          "hydra/launcher=grouped (valid: --group 1, or no hydra/launcher)"), err
