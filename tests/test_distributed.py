"""Data-parallel training on CPU (gloo): two torchrun processes equal one process on the global batch.

Every run here is tiny (a few steps, 1 thread per process); each torchrun start costs a
few seconds of imports, so only the image case runs in the default suite (the fast cover of
DDP training: sharding, all-reduced sums, rank 0 writing); the memory model and resume under
DDP are slow tests. Dropout is 0 where runs are compared across world sizes (the
dropout masks of a rank differ from those of the same rows in one process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, compose, needs_mirror
from highway_repro.engine import checkpoint as ckpt_lib
from highway_repro.engine.distributed import DistInfo
from highway_repro.train import run

TOL = 1e-5
VOLATILE = ("perf/", "time/")

CASES = {
    "image": ["experiment=demo", "scale=smoke", "model.depth=3", "trainer.max_steps=4", "trainer.log_every=1"],
    # Transformer-XL: memory per shard, eval sharded; dropout 0 so that 1 and 2 processes agree
    "lm_memory": ["model=transformer_xl", "data=enwik8_prefix", "optim=adam", "scale=smoke", "model.n_layers=2",
                  "model.d_model=16", "model.n_heads=2", "model.d_head=8", "model.d_ff=32", "model.tgt_len=8",
                  "model.mem_len=8", "model.eval_tgt_len=8", "model.eval_mem_len=8", "model.dropout=0.0",
                  "data.seq_len=8", "data.batch_size=4", "data.eval_batch_size=4", "+data.train_limit_tokens=2000",
                  "trainer.max_steps=8", "trainer.checkpoint_every=3", "trainer.eval_every=4", "trainer.log_every=4",
                  "trainer.eval_max_batches=3", "trainer.final_max_batches=3", "trainer.grad_clip=0.25"],
    # log_every=4, checkpoint_every=3: the checkpoint of step 6 holds the training sums of steps 5-6
}
COMMON = ["deterministic=true", "logger=jsonl", "threads=1", "trainer.progress=false"]


def _torchrun(overrides: list[str], out: Path, crash_at: int | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}
    if crash_at is not None:
        env["HIGHWAY_TEST_CRASH_AT"] = str(crash_at)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(REPO / "tests" / "_ddp_entry.py"), *overrides, f"hydra.run.dir={out}"]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def _history(out: Path) -> list[dict]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def _close(a: dict, b: dict) -> None:
    a = {k: v for k, v in a.items() if not k.startswith(VOLATILE)}
    b = {k: v for k, v in b.items() if not k.startswith(VOLATILE)}
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], float) and isinstance(b[k], float):
            assert abs(a[k] - b[k]) <= TOL * max(1.0, abs(a[k])), (k, a[k], b[k])
        else:
            assert a[k] == b[k], (k, a[k], b[k])


def _same_histories(a: Path, b: Path) -> None:
    ha, hb = _history(a), _history(b)
    assert len(ha) == len(hb) and any("train/loss" in h for h in ha)
    for x, y in zip(ha, hb):
        _close(x, y)


def _single(overrides: list[str], out: Path) -> dict:
    out.mkdir(parents=True)
    return run(compose(overrides), out)


@pytest.fixture(scope="module")
def lm_runs(tmp_path_factory):
    """The Transformer-XL case on 1 process (in this process) and on 2 (torchrun), uninterrupted."""
    root = tmp_path_factory.mktemp("ddp_lm")
    overrides = CASES["lm_memory"] + COMMON
    single = _single(overrides, root / "single")
    r = _torchrun(overrides, root / "ddp")
    assert r.returncode == 0, r.stderr[-3000:]
    return overrides, root, single


@pytest.mark.slow
@needs_mirror
def test_two_processes_equal_one_process_image(tmp_path):
    overrides = CASES["image"] + COMMON
    single = _single(overrides, tmp_path / "single")
    r = _torchrun(overrides, tmp_path / "ddp")
    assert r.returncode == 0, r.stderr[-3000:]
    assert single["status"] == "done"
    _close(json.loads((tmp_path / "ddp" / "metrics.json").read_text()), single)
    _same_histories(tmp_path / "ddp", tmp_path / "single")
    assert not (tmp_path / "ddp" / "metrics.json.tmp").exists()


@needs_mirror
@pytest.mark.slow
def test_two_processes_equal_one_process_memory_lm(lm_runs):
    _, root, single = lm_runs
    assert single["status"] == "done" and "val/loss" in single and "test/loss" in single
    _close(json.loads((root / "ddp" / "metrics.json").read_text()), single)
    _same_histories(root / "ddp", root / "single")
    ckpt = ckpt_lib.load(root / "ddp" / "ckpt" / "last.pt")
    assert all(m.shape[0] == 4 for m in ckpt["mems"])  # the memory of the global batch, not of one shard


@needs_mirror
@pytest.mark.slow
def test_resume_under_ddp_after_crash(lm_runs):
    overrides, root, single = lm_runs
    out = root / "crashed"
    r = _torchrun(overrides, out, crash_at=7)  # the last checkpoint is the one of step 6
    assert r.returncode != 0 and "simulated crash at step 7" in r.stderr
    assert json.loads((out / "metrics.json").read_text())["status"] == "failed"
    assert ckpt_lib.load(out / "ckpt" / "last.pt")["step"] == 6
    r = _torchrun(overrides + ["resume=auto"], out)
    assert r.returncode == 0, r.stderr[-3000:]
    resumed = json.loads((out / "metrics.json").read_text())
    _close(resumed, json.loads((root / "ddp" / "metrics.json").read_text()))
    _close(resumed, single)
    _same_histories(out, root / "ddp")


def test_shard_bounds_and_step_seeds():
    infos = [DistInfo(rank=r, world_size=3, local_rank=r, device=torch.device("cpu"), seed=5) for r in range(3)]
    x = torch.arange(7)
    assert torch.equal(torch.cat([d.shard((x,), strict=False)[0] for d in infos]), x)  # uneven: 2, 2, 3
    with pytest.raises(ValueError, match="multiple of the world size"):
        infos[0].shard((x,))
    assert infos[1].shard((torch.arange(6), 3))[1] == 3  # non-tensors pass through

    def draw(d, step):
        d.seed_step(step)
        return torch.rand(3)

    assert torch.equal(draw(infos[0], 4), draw(infos[0], 4))  # a pure function of (seed, step, rank)
    assert not torch.equal(draw(infos[0], 4), draw(infos[1], 4))
    assert not torch.equal(draw(infos[0], 4), draw(infos[0], 5))
