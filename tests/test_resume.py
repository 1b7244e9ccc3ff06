"""Kill and resume (docs/failures.md): SIGKILL during a step and during a checkpoint write,
SIGTERM / SIGINT, through real `python -m highway_repro.train` subprocesses killed at points found by polling the
run folder (metrics.jsonl, ckpt/.last.pt.tmp<pid>): no test hook in the production code (these subprocess kills are
slow tests); the same interruptions in-process (fast), SIGTERM / SIGINT during the final evaluation too.
Every resumed run ends with the metrics and metrics.jsonl of a run never stopped."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from conftest import REPO, compose, needs_mirror
from highway_repro.engine import checkpoint as ck
from highway_repro.engine.trainer import Trainer
from highway_repro.train import run, run_job
from _faults import IMAGE, LM, SMALL, Crash, _stable, _history, _final, _cli, _env, _reference


def _logged_step(out: Path) -> int:
    """The last step with training metrics in metrics.jsonl (-1 before the first)."""
    try:
        lines = (out / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return -1
    steps = [-1]
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "train/loss" in rec:
            steps.append(rec["step"])
    return max(steps)


class Driver:
    """Starts `python -m highway_repro.train <overrides> resume=auto` in one run folder, again and again, and
    signals each process when a condition on the folder holds (polled; nothing in the code under test)."""

    def __init__(self, overrides: list[str], out: Path):
        self.overrides, self.out = overrides, out
        self.log: list[tuple] = []

    def start(self) -> subprocess.Popen:
        args = self.overrides + ["resume=auto", "threads=1", f"hydra.run.dir={self.out}"]
        self.stderr = open(self.out.parent / f"{self.out.name}-{len(self.log)}.log", "w")
        return subprocess.Popen(_cli(args), cwd=REPO, env=_env(), stdout=self.stderr, stderr=subprocess.STDOUT)

    def signal_when(self, cond, sig, poll: float, timeout: float = 300) -> tuple[int, bool]:
        """Start a process, send `sig` as soon as cond(pid) holds; returns (exit code, whether it was signalled).

        Polls slowly until the process logs its model (torch, data and model are loaded, training starts),
        then every `poll` seconds: a fast-polling parent would take CPU from the child on a 2-core machine."""
        p = self.start()
        self.pid, log = p.pid, Path(self.stderr.name)
        deadline, sent, ready = time.monotonic() + timeout, False, False
        while p.poll() is None:
            ready = ready or "- model: " in log.read_text()
            if ready and cond(p.pid):
                p.send_signal(sig)
                sent = True
                break
            if time.monotonic() > deadline:
                p.kill()
                raise AssertionError(f"condition not reached in {timeout} s")
            time.sleep(poll if ready else 0.05)
        rc = p.wait(timeout)
        self.stderr.close()
        self.log.append((sig, rc, sent))
        return rc, sent

    def output(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.out.parent.glob(f"{self.out.name}-*.log")))

    # -- the three interruptions
    def terminate_after_step(self, step: int, sig=signal.SIGTERM) -> None:
        """SIGTERM / SIGINT once `step` is logged: the process finishes its step, saves, exits 128 + sig."""
        step = max(step, _logged_step(self.out) + 1)
        rc, sent = self.signal_when(lambda pid: _logged_step(self.out) >= step, sig, poll=0.005)
        assert sent and rc == 128 + sig, (rc, self.output()[-3000:])
        final = _final(self.out)
        assert final["status"] == "interrupted" and final["signal"] == sig
        assert ck.load(self.out / "ckpt" / "last.pt")["step"] == final["step"] >= step

    def kill_during_step(self, step: int) -> None:
        """SIGKILL once a step >= `step` is logged by this process (lines left by earlier processes do not
        count: they are cut on resume) and no checkpoint is being written: the process is inside a step."""
        ckpt, step = self.out / "ckpt", max(step, _logged_step(self.out) + 1)
        rc, sent = self.signal_when(lambda pid: _logged_step(self.out) >= step
                                    and not (ckpt / f".last.pt.tmp{pid}").exists(), signal.SIGKILL, poll=0.002)
        assert sent and rc == -signal.SIGKILL, (rc, self.output()[-3000:])
        assert not (self.out / "metrics.json").exists() or _final(self.out)["status"] != "done"

    def kill_during_checkpoint_write(self, tries: int = 4) -> None:
        """SIGKILL while ckpt/.last.pt.tmp<pid> exists and an earlier checkpoint was kept as prev.pt; retried
        until the leftover temp file proves it hit."""
        ckpt = self.out / "ckpt"
        for _ in range(tries):
            rc, sent = self.signal_when(lambda pid: (ckpt / f".last.pt.tmp{pid}").exists()
                                        and (ckpt / "prev.pt").exists(), signal.SIGKILL, poll=0.0005)
            assert sent and rc == -signal.SIGKILL, (rc, self.output()[-3000:])
            if (ckpt / f".last.pt.tmp{self.pid}").exists() and not (ckpt / "last.pt").exists():
                # killed mid-write: last.pt was rotated to prev.pt, the new one is a partial temp file
                assert (ckpt / "prev.pt").exists()
                return
        raise AssertionError(f"no kill landed inside a checkpoint write in {tries} tries")

    def finish(self) -> dict:
        rc, sent = self.signal_when(lambda pid: False, signal.SIGKILL, poll=0.05)
        assert rc == 0 and not sent, self.output()[-3000:]
        assert not list((self.out / "ckpt").glob(".*.pt.tmp*")), "a stale temp file was not cleaned up"
        return _final(self.out)


def _ends_as_uninterrupted(d, ref: dict, tmp_path: Path) -> None:
    """The interrupted run, resumed to its end, has the uninterrupted run's final metrics and metrics.jsonl."""
    final = d.finish()
    assert _stable(final) == _stable(ref)
    assert _history(tmp_path / "run") == _history(tmp_path / "ref")


@pytest.mark.slow
@needs_mirror
def test_killed_during_a_checkpoint_write_resumes_to_identical_metrics(tmp_path):
    """SIGKILL while a later checkpoint is written (last.pt rotated to prev.pt, the new one half written), then
    resume=auto: it resumes from prev.pt and ends with the uninterrupted run's metrics and metrics.jsonl. The one
    kill of a real process in the fast suite (the in-process tests below cover the other interruptions)."""
    ref = _reference(IMAGE, tmp_path / "ref")
    d = Driver(IMAGE, tmp_path / "run")
    d.kill_during_checkpoint_write()
    _ends_as_uninterrupted(d, ref, tmp_path)
    assert "falling back" not in d.output()  # a write killed midway leaves no corrupt last.pt, just none


@needs_mirror
@pytest.mark.slow
def test_image_killed_anywhere_resumes_to_identical_metrics(tmp_path):
    """SIGTERM, SIGKILL inside a checkpoint write, SIGKILL inside a step, then resume=auto to the end: the
    final metrics and the whole metrics.jsonl equal those of an uninterrupted run (CPU, deterministic)."""
    ref = _reference(IMAGE, tmp_path / "ref")
    d = Driver(IMAGE, tmp_path / "run")
    d.terminate_after_step(2)              # clean stop at step >= 3, saved there
    d.kill_during_checkpoint_write()       # the next write (step 6): the next start resumes from prev.pt
    d.kill_during_step(6)                  # once a step past the killed process's lines is logged
    _ends_as_uninterrupted(d, ref, tmp_path)
    assert "falling back" not in d.output()  # a write killed midway leaves no corrupt last.pt, just none


@needs_mirror
@pytest.mark.slow
def test_lm_with_memory_killed_anywhere_resumes_to_identical_metrics(tmp_path):
    """The same for Transformer-XL (memory and dropout RNG in the checkpoint), with SIGINT."""
    ref = _reference(LM, tmp_path / "ref")
    d = Driver(LM, tmp_path / "run")
    d.terminate_after_step(2, signal.SIGINT)
    d.kill_during_step(4)
    d.kill_during_checkpoint_write(tries=8)
    _ends_as_uninterrupted(d, ref, tmp_path)


def _in_process_interruptions(tmp_path, monkeypatch, when, extra=()):
    """Run SMALL in-process with `when(trainer, phase)` called at each training forward and evaluation; it may
    raise Crash (a kill) or raise SIGTERM; then resume=auto, which must give the uninterrupted run's metrics
    and metrics.jsonl. Returns the first run's final metrics (None when it crashed)."""
    ref, overrides = tmp_path / "ref", SMALL + list(extra)
    _reference(overrides, ref)
    forward, evaluate = Trainer._forward, Trainer.evaluate

    def fwd(self, batch, mems, score_len):
        if self.model.training:
            when(self, "step")
        return forward(self, batch, mems, score_len)

    def ev(self, split, max_batches=None):
        when(self, f"eval/{split}")
        return evaluate(self, split, max_batches)

    monkeypatch.setattr(Trainer, "_forward", fwd)
    monkeypatch.setattr(Trainer, "evaluate", ev)
    out = tmp_path / "run"
    out.mkdir()
    try:
        first = run(compose(overrides + ["threads=1"]), out)
    except Crash:
        first = None
    monkeypatch.setattr(Trainer, "_forward", forward)
    monkeypatch.setattr(Trainer, "evaluate", evaluate)
    final = run(compose(overrides + ["threads=1", "resume=auto"]), out)
    assert final["status"] == "done"
    assert _stable(final) == _stable(_final(ref))
    assert _history(out) == _history(ref)
    return first


@needs_mirror
def test_sigterm_mid_log_interval_resumes_exactly(tmp_path, monkeypatch):
    """SIGTERM in step 3 of a 4-step log interval: the interval's running sums are checkpointed."""
    def when(trainer, phase):
        if phase == "step" and trainer.step == 2 and not trainer.stop_requested:
            signal.raise_signal(signal.SIGTERM)

    first = _in_process_interruptions(tmp_path, monkeypatch, when)
    assert first["status"] == "interrupted" and first["step"] == 3 and first["signal"] == signal.SIGTERM


@needs_mirror
def test_a_run_started_under_nohup_trains_on_through_sighup(tmp_path, monkeypatch):
    """SIGHUP ignored from the start (`nohup`): a SIGHUP in step 3 changes nothing, the run ends `done` as the
    uninterrupted one."""
    ref = _reference(SMALL, tmp_path / "ref")
    forward = Trainer._forward

    def fwd(self, batch, mems, score_len):
        if self.model.training and self.step == 2:
            signal.raise_signal(signal.SIGHUP)
        return forward(self, batch, mems, score_len)

    monkeypatch.setattr(Trainer, "_forward", fwd)
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        (tmp_path / "run").mkdir()
        final = run(compose(SMALL + ["threads=1"]), tmp_path / "run")
    finally:
        signal.signal(signal.SIGHUP, old)
    assert _stable(final) == _stable(ref) and final["status"] == "done"
    assert _history(tmp_path / "run") == _history(tmp_path / "ref")


@needs_mirror
def test_killed_before_the_first_checkpoint_starts_over(tmp_path, monkeypatch):
    def when(trainer, phase):
        if phase == "step" and trainer.step == 2:
            raise Crash("killed")

    assert _in_process_interruptions(tmp_path, monkeypatch, when) is None  # the kill happened


@needs_mirror
def test_killed_during_the_final_evaluation_logs_it_once(tmp_path, monkeypatch):
    """Killed after the final val line was logged, before the test metrics: the checkpoint at max_steps
    resumes straight into the final evaluation (train metrics and log position are in the checkpoint)."""
    def when(trainer, phase):
        if phase == "eval/test":
            raise Crash("killed")

    assert _in_process_interruptions(tmp_path, monkeypatch, when, ["trainer.checkpoint_every=4", "data.val_size=100",
                                                                   "trainer.splits=[val,test]"]) is None  # killed


FINAL = ["trainer.checkpoint_every=3", "data.val_size=100", "trainer.splits=[val,test]"]  # no checkpoint at step 8


@needs_mirror
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("final_eval", ["last", "best"])
def test_a_signal_during_the_final_evaluation_stops_cleanly_and_resumes_exactly(sig, final_eval, tmp_path, capsys,
                                                                                  monkeypatch):
    """SIGTERM / SIGINT after the final val pass, during the test pass: the command exits 128 + signal, no traceback,
    metrics.json says interrupted, last.pt holds step 8 (the last step's weights, also with final_eval=best); then
    resume=auto redoes the final evaluation and ends with the uninterrupted run's metrics and metrics.jsonl."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    overrides = SMALL + FINAL + [f"trainer.final_eval={final_eval}", "trainer.eval_every=4", "threads=1"]
    ref = _reference(overrides, tmp_path / "ref")
    assert ref["status"] == "done" and "test/acc" in ref
    evaluate = Trainer.evaluate

    def ev(self, split, max_batches=None):
        if split == "test" and not self.stop_requested:
            signal.raise_signal(sig)  # the handler notes it; the test pass stops at its next batch
        return evaluate(self, split, max_batches)

    monkeypatch.setattr(Trainer, "evaluate", ev)
    out = tmp_path / "run"
    out.mkdir()
    with pytest.raises(SystemExit) as e:
        run_job(compose(overrides), out, False, run)
    assert e.value.code == 128 + sig
    first = _final(out)  # (the best validation loss of the evaluations before the stop: its last line says it)
    assert capsys.readouterr().out.strip() == \
        f"[interrupted] step 8: val/best_loss={first['val/best_loss']:.4f} (signal {sig}; resume=auto continues it)"
    assert first["status"] == "interrupted" and first["signal"] == sig and first["step"] == 8
    assert "test/acc" not in first and not list((out / "ckpt").glob(".*.tmp*"))
    last = ck.load(out / "ckpt" / "last.pt")
    assert last["step"] == 8
    monkeypatch.setattr(Trainer, "evaluate", evaluate)
    final = run(compose(overrides + ["resume=auto"]), out)
    assert final["status"] == "done"
    assert _stable(final) == _stable(ref)
    assert _history(out) == _history(tmp_path / "ref")
    done = ck.load(out / "ckpt" / "last.pt")  # the last step's weights, as the uninterrupted run keeps them
    assert all(torch.equal(v, last["model"][k]) for k, v in done["model"].items())
