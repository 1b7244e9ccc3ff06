"""What the failure tests share (tests/test_resume.py, test_checkpoints.py, test_errors.py, test_divergence.py,
test_damaged_data.py): the run configs, the metric readers, the training command and a reference run."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


from conftest import REPO, compose
from highway_repro.train import run

VOLATILE = ("perf/", "time/")

# An MLP large enough (1.4 M parameters: an 11 MB checkpoint with the SGD momentum) that a step and a
# checkpoint write take long enough to be hit by a kill from a polling parent, small enough for CI.
IMAGE = ["experiment=demo", "scale=smoke", "model.depth=3", "model.width=512", "trainer.max_steps=12",
         "trainer.checkpoint_every=3", "trainer.log_every=2", "trainer.eval_every=0", "deterministic=true",
         "logger=jsonl"]
LM = ["model=transformer_xl", "data=enwik8_prefix", "optim=adam", "scale=smoke", "model.n_layers=2",
      "model.d_model=64", "model.n_heads=2", "model.d_head=32", "model.d_ff=256", "model.tgt_len=16",
      "model.mem_len=16", "model.eval_tgt_len=16", "model.eval_mem_len=16", "data.seq_len=16",
      "data.batch_size=4", "data.eval_batch_size=4", "+data.train_limit_tokens=4000", "trainer.max_steps=12",
      "trainer.checkpoint_every=3", "trainer.eval_every=4", "trainer.log_every=2", "trainer.grad_clip=0.25",
      "deterministic=true", "logger=jsonl"]


def _stable(d: dict) -> dict:
    return {k: v for k, v in d.items() if not k.startswith(VOLATILE)}


def _history(out: Path) -> list[dict]:
    return [_stable(json.loads(x)) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _final(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


def _cli(args, **kw):
    return [sys.executable, *kw.get("flags", ()), "-m", "highway_repro.train", *args]


def _env():
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), env.get("PYTHONPATH", "")])
    return env


def _reference(overrides: list[str], out: Path) -> dict:
    out.mkdir(parents=True)
    final = run(compose(overrides + ["threads=1"]), out)
    assert final["status"] == "done"
    return final


SMALL = ["experiment=demo", "scale=smoke", "model.depth=3", "trainer.max_steps=8", "trainer.checkpoint_every=3",
         "trainer.log_every=4", "trainer.eval_every=0", "deterministic=true", "logger=jsonl"]


class Crash(RuntimeError):
    pass


DEPTH_0 = "model.depth=0 is not allowed (valid: an integer >= 2 (1 plain input layer + depth - 1 layers))"
