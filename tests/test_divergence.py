"""NaN / Inf losses (nan_policy stop and skip), injected through `data._target_` (conftest.nan_data): a run
stops as diverged keeping its last good checkpoint, or skips bad steps up to its limit."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from conftest import compose, needs_mirror
from highway_repro.engine import checkpoint as ck
from highway_repro.train.job import summary
from highway_repro.train import run, run_job
from _faults import _final


@pytest.fixture(autouse=True)
def _faults_through_the_config(allow_nan_data):
    """The numerical faults come through `data._target_=conftest.nan_data`."""


NAN = ["experiment=demo", "scale=smoke", "model.depth=3", "trainer.max_steps=8", "trainer.checkpoint_every=2",
       "trainer.log_every=1", "trainer.eval_every=0", "logger=jsonl", "threads=1",
       "data._target_=conftest.nan_data"]


@needs_mirror
def test_nan_loss_stops_as_diverged_and_keeps_the_last_good_checkpoint(tmp_path, caplog):
    with caplog.at_level(logging.ERROR):
        final = run(compose(NAN + ["+data.nan_steps=[5]"]), tmp_path)
    assert final["status"] == "diverged" and final["step"] == 5
    assert final["error"] == "non-finite training loss (nan) at step 5"
    assert _final(tmp_path)["status"] == "diverged" and _final(tmp_path)["error"] == final["error"]
    assert "at step 5: stopping; the last good checkpoint is kept" in caplog.text
    assert summary(final).startswith("[diverged] step 5") and "at step 5" in summary(final)
    c = ck.load(tmp_path / "ckpt" / "last.pt")
    assert c["step"] == 4 and all(torch.isfinite(v).all() for v in c["model"].values())


@needs_mirror
def test_divergence_before_the_first_checkpoint_says_there_is_none(tmp_path, caplog):
    with caplog.at_level(logging.ERROR):
        final = run(compose(NAN + ["+data.nan_steps=[1]"]), tmp_path)
    assert final["status"] == "diverged" and final["step"] == 1 and not (tmp_path / "ckpt").exists()
    assert "at step 1: stopping; there is no checkpoint yet (none was written before this step)" in caplog.text
    assert "is kept" not in caplog.text


def test_the_summary_line_of_an_interrupted_run_ends_in_what_to_do():
    assert summary({"status": "interrupted", "step": 34, "signal": 15}) == \
        "[interrupted] step 34 (signal 15; resume=auto continues it)"
    assert summary({"status": "done", "step": 8, "test/acc": 0.5}) == "[done] step 8: test/acc=0.5000"


@needs_mirror
def test_resume_auto_does_not_repeat_a_diverged_run(tmp_path, caplog):
    """A sweep resumed with resume=auto skips a diverged job (a rerun would diverge again at the same step)."""
    cfg = compose(NAN + ["+data.nan_steps=[5]", "resume=auto"])
    assert run(cfg, tmp_path)["status"] == "diverged"
    before = (tmp_path / "metrics.jsonl").read_text()
    with caplog.at_level(logging.INFO):
        run_job(cfg, tmp_path, True, run)
    assert (tmp_path / "metrics.jsonl").read_text() == before and _final(tmp_path)["status"] == "diverged"
    assert f"diverged at step 5 (resume=auto): nothing to do; resume={tmp_path / 'ckpt' / 'last.pt'}" in caplog.text


@needs_mirror
def test_huge_learning_rate_diverges_cleanly(tmp_path):
    final = run(compose(NAN[:-1] + ["optim.optimizer.lr=1e3", "trainer.max_steps=30"]), tmp_path)
    assert final["status"] == "diverged" and "non-finite training loss" in final["error"]
    assert f"at step {final['step']}" in final["error"] and _final(tmp_path)["status"] == "diverged"
    c = ck.load(tmp_path / "ckpt" / "last.pt")
    assert c["step"] < final["step"] and all(torch.isfinite(v).all() for v in c["model"].values())


@needs_mirror
def test_non_finite_weights_are_never_checkpointed(tmp_path, monkeypatch):
    """A finite loss whose update poisons the weights (here: injected into the 6th optimizer step) stops the
    run at the next checkpoint instead of overwriting the last good one."""
    step = torch.optim.SGD.step

    def poisoning(self, *a, **kw):
        out = step(self, *a, **kw)
        if poisoning.calls == 5:  # the 6th step: the weights of step 6 are poisoned
            with torch.no_grad():
                self.param_groups[0]["params"][0].fill_(float("inf"))
        poisoning.calls += 1
        return out

    poisoning.calls = 0
    monkeypatch.setattr(torch.optim.SGD, "step", poisoning)
    final = run(compose(NAN[:-1]), tmp_path)
    assert final["status"] == "diverged" and final["error"] == "non-finite weights after step 6 (the loss was finite)"
    c = ck.load(tmp_path / "ckpt" / "last.pt")
    assert c["step"] == 4 and all(torch.isfinite(v).all() for v in c["model"].values())


@needs_mirror
def test_nan_policy_skip_skips_up_to_max_bad_steps(tmp_path):
    skip = NAN + ["trainer.nan_policy=skip", "trainer.max_bad_steps=2"]
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    ok = run(compose(skip + ["+data.nan_steps=[2,5]"]), tmp_path / "a")
    assert ok["status"] == "done" and math.isfinite(ok["train/loss"]) and math.isfinite(ok["test/loss"])
    assert ck.load(tmp_path / "a" / "ckpt" / "last.pt")["extra"]["bad_steps"] == 2
    bad = run(compose(skip + ["+data.nan_steps=[1,2,6]"]), tmp_path / "b")
    assert bad["status"] == "diverged" and bad["step"] == 6
    assert bad["error"] == ("non-finite training loss (nan) at step 6 "
                            "(more than trainer.max_bad_steps=2 skipped batches)")
    assert _final(tmp_path / "b")["status"] == "diverged"
