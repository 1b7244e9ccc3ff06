"""Failure behaviour (docs/guide.md, "Failure behaviour"), one section per fault class:

1. kill and resume (SIGKILL during a step and during a checkpoint write, SIGTERM / SIGINT), through real
   `python -m highway_repro.train` subprocesses, killed at points found by polling the run folder
   (metrics.jsonl, ckpt/.last.pt.tmp<pid>): no test hook in the production code (one fast case, the full
   sequences are slow); the same interruptions in-process (fast), SIGTERM / SIGINT during the final evaluation too;
2. checkpoints: format version + resolved config, a corrupt last.pt falls back to prev.pt, a checkpoint of
   another architecture is a one-line error; a checkpoint that would run code (a crafted zip or bare pickle) is
   refused in one line wherever it is read (resume=auto, resume=<path>, best.pt), never fallen back from, and
   nothing in it runs; the RNG state is plain data, and checkpoints with numpy's RNG state as an array still load;
3. the error path: the project's own errors (config values, data, checkpoints) are one line with exit code 2,
   before torch is imported for a config error (its speed, under 2 s, is a slow test), and so are Hydra's
   composition errors, a full disk and a read-only run folder (no temp file left); anything else is a bug and
   keeps its traceback; in a multirun both mark the job failed;
4. NaN / Inf losses (nan_policy stop and skip), injected through `data._target_` (conftest.nan_data);
5. data faults not covered by tests/test_data.py: truncated or undecodable files, empty splits, corrupt,
   interrupted and killed caches;
6. a sweep with a failing job: the other jobs finish, the report marks the cell with the error (slow);
7. a kept run whose metrics.json cannot be parsed: `make tables` names it, counts it as damaged and fails.

Fuzzing of the gate placement parser and the config validator: tests/test_fuzz.py.
"""

from __future__ import annotations

import errno
import gzip
import json
import logging
import math
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf
import pytest
import torch
import yaml

from conftest import REPO, compose, mirror, needs_mirror, write_sums
from highway_repro import data, report
from highway_repro.config import ConfigError, validate
from highway_repro.data import sources, vision
from highway_repro.engine import checkpoint as ck
from highway_repro.engine.trainer import Trainer
from highway_repro.errors import HighwayError
from highway_repro.cli import MULTIRUN_ENV, USER_ERRORS, SweepEnd, run_job, summary, user_failure
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


# ============================================================================ 1. kill and resume

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


def _reference(overrides: list[str], out: Path) -> dict:
    out.mkdir(parents=True)
    final = run(compose(overrides + ["threads=1"]), out)
    assert final["status"] == "done"
    return final


@needs_mirror
def test_killed_during_a_checkpoint_write_resumes_to_identical_metrics(tmp_path):
    """SIGKILL while a later checkpoint is written (last.pt rotated to prev.pt, the new one half written), then
    resume=auto: it resumes from prev.pt and ends with the uninterrupted run's metrics and metrics.jsonl. The one
    kill of a real process in the fast suite (the in-process tests below cover the other interruptions)."""
    ref = _reference(IMAGE, tmp_path / "ref")
    d = Driver(IMAGE, tmp_path / "run")
    d.kill_during_checkpoint_write()
    final = d.finish()
    assert _stable(final) == _stable(ref)
    assert _history(tmp_path / "run") == _history(tmp_path / "ref")
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
    final = d.finish()
    assert _stable(final) == _stable(ref)
    assert _history(tmp_path / "run") == _history(tmp_path / "ref")
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
    final = d.finish()
    assert _stable(final) == _stable(ref)
    assert _history(tmp_path / "run") == _history(tmp_path / "ref")


SMALL = ["experiment=demo", "scale=smoke", "model.depth=3", "trainer.max_steps=8", "trainer.checkpoint_every=3",
         "trainer.log_every=4", "trainer.eval_every=0", "deterministic=true", "logger=jsonl"]


class Crash(RuntimeError):
    pass


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
    assert capsys.readouterr().out.strip() == f"[interrupted] step 8 (signal {sig}; resume=auto continues it)"
    first = _final(out)
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


# ============================================================================ 2. checkpoints

@pytest.fixture(scope="module")
def crashed_run(tmp_path_factory):
    """A reference run and a run that died at step 7 (last.pt = step 6, prev.pt = step 3), in-process."""
    if mirror() is None:
        pytest.skip("HIGHWAY_DATA_MIRROR is not set to the offline data mirror")
    root = tmp_path_factory.mktemp("crashed")
    overrides = SMALL + ["threads=1"]
    _reference(SMALL, root / "ref")
    out = root / "run"
    out.mkdir()
    forward = Trainer._forward

    def dying(self, batch, mems, score_len):
        if self.model.training and self.step == 7:
            raise Crash("killed")
        return forward(self, batch, mems, score_len)

    Trainer._forward = dying
    try:
        with pytest.raises(Crash):
            run(compose(overrides), out)
    finally:
        Trainer._forward = forward
    return root


@needs_mirror
def test_checkpoint_has_format_version_and_resolved_config(crashed_run):
    resolved = yaml.safe_load((crashed_run / "run" / "config_resolved.yaml").read_text())
    for name, step in (("last.pt", 6), ("prev.pt", 3)):
        c = ck.load(crashed_run / "run" / "ckpt" / name)
        assert c["format_version"] == ck.FORMAT_VERSION and c["step"] == step
        assert c["config"] == resolved and c["config"]["model"]["depth"] == 3


def test_checkpoint_of_another_format_version_or_missing_is_named(tmp_path):
    torch.save({"format_version": 99, "model": {}}, tmp_path / "last.pt")
    with pytest.raises(ck.CheckpointError, match=r"last.pt has format_version=99; this code reads 1"):
        ck.load(tmp_path / "last.pt")
    with pytest.raises(ck.CheckpointError, match=r"checkpoint .*nope.pt does not exist"):
        ck.load(tmp_path / "nope.pt")
    ck.save(tmp_path, "last", {"model": {}, "step": 1})
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f".last.pt.tmp{dead.pid}").write_bytes(b"partial")  # left by a writer killed mid-write
    ck.save(tmp_path, "last", {"model": {}, "step": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "prev.pt"]


def test_no_usable_checkpoint_starts_over_with_a_warning(tmp_path, caplog):
    ck.save(tmp_path, "last", {"model": {}, "step": 1})
    ck.save(tmp_path, "last", {"model": {}, "step": 2})
    for name in ("last.pt", "prev.pt"):
        (tmp_path / name).write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING):
        assert ck.load_latest(tmp_path) is None
    assert "last.pt is corrupt" in caplog.text and "prev.pt is corrupt" in caplog.text
    assert f"no usable checkpoint in {tmp_path}: starting from step 0" in caplog.text


@needs_mirror
def test_corrupt_last_checkpoint_falls_back_to_prev(crashed_run, tmp_path, caplog):
    """Truncate last.pt of a real run folder; `resume=auto` warns naming the file, resumes from prev.pt (step 3),
    finishes with the uninterrupted run's metrics and keeps the corrupt file aside as last.pt.corrupt."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(crashed_run / "run", out)
    last = out / "ckpt" / "last.pt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    with caplog.at_level(logging.INFO):
        final = run(compose(SMALL + ["resume=auto", "threads=1"]), out)
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "last.pt" in r.getMessage()]
    assert warning and f"checkpoint {last} is corrupt or truncated" in warning[0], caplog.text
    assert "falling back to the previous checkpoint" in warning[0]
    assert f"resuming from {out / 'ckpt' / 'prev.pt'} (step 3)" in caplog.text
    assert _stable(final) == _stable(_final(crashed_run / "ref"))
    assert _history(out) == _history(crashed_run / "ref")
    assert (out / "ckpt" / "last.pt.corrupt").exists() and ck.load(last)["step"] == 8


@needs_mirror
def test_checkpoint_of_another_architecture_is_a_one_line_error(crashed_run, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    ckpt = crashed_run / "run" / "ckpt" / "last.pt"
    with pytest.raises(SystemExit) as e:
        run_job(compose(SMALL + ["model.depth=4", f"resume={ckpt}", "threads=1"]), tmp_path, False, run)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith(f"error: resume={ckpt}: checkpoint does not fit this architecture; missing in checkpoint: ")
    assert "layers.2." in err[0]  # the third hidden layer exists only in the depth-4 model


class _RunsCode:
    """Unpickled, this calls os.system(`touch <marker>`): what a crafted checkpoint would hold."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


SYSTEM = f"{os.system.__module__}.system"  # how a pickle names os.system (posix.system here)


def _crafted(path: Path, kind: str, marker: Path) -> Path:
    """A file that runs `touch marker` when unpickled: a torch.save zip that looks like a checkpoint of this
    project (format_version, model, step), or the same dict as a bare pickle (pickle.dump)."""
    payload = {"format_version": ck.FORMAT_VERSION, "model": {}, "step": 99, "x": _RunsCode(marker)}
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "zip":
        torch.save(payload, path)
    else:
        with open(path, "wb") as f:
            pickle.dump(payload, f)
    return path


def _refusal(path: Path) -> str:
    return f"checkpoint {path} holds {SYSTEM}, which no checkpoint of this project holds"


@pytest.mark.parametrize("kind", ["zip", "pickle"])
def test_a_checkpoint_that_would_run_code_is_refused_not_run(kind, tmp_path):
    """checkpoint.load reads with weights_only: the crafted file is refused in one line naming it and what it holds
    (an UnsafeCheckpointError, not a CheckpointError), and nothing in it runs. Plain unpickling of the same bytes
    does run it (the file is a real threat)."""
    marker = tmp_path / "marker"
    path = _crafted(tmp_path / "last.pt", kind, marker)
    with pytest.raises(ck.UnsafeCheckpointError) as e:
        ck.load(path)
    assert str(e.value).startswith(_refusal(path)) and "\n" not in str(e.value), e.value
    assert not isinstance(e.value, ck.CheckpointError) and isinstance(e.value, USER_ERRORS)
    assert not marker.exists()
    if kind == "zip":
        import zipfile

        with zipfile.ZipFile(path) as z:
            data = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    else:
        data = path.read_bytes()
    pickle.loads(data)  # the control: unpickled without the check, it runs `touch`
    assert marker.exists()


def test_resume_auto_refuses_a_last_checkpoint_that_would_run_code(tmp_path):
    """load_latest does not take such a last.pt for a corrupt one: no fall-back to the good prev.pt, no restart
    from step 0, no renaming to last.pt.corrupt (the file stays for inspection); the same for such a prev.pt."""
    marker = tmp_path / "marker"
    ck.save(tmp_path, "last", {"model": {}, "step": 1})
    ck.save(tmp_path, "last", {"model": {}, "step": 2})
    prev = (tmp_path / "prev.pt").read_bytes()
    for kind in ("zip", "pickle"):
        _crafted(tmp_path / "last.pt", kind, marker)
        with pytest.raises(ck.UnsafeCheckpointError, match=_refusal(tmp_path / "last.pt")):
            ck.load_latest(tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "prev.pt"]
    assert (tmp_path / "prev.pt").read_bytes() == prev
    (tmp_path / "last.pt").write_bytes(b"garbage")  # a corrupt last.pt before such a prev.pt: refused too
    _crafted(tmp_path / "prev.pt", "zip", marker)
    with pytest.raises(ck.UnsafeCheckpointError, match=_refusal(tmp_path / "prev.pt")):
        ck.load_latest(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "prev.pt"] and not marker.exists()


def test_only_the_numpy_types_of_an_old_rng_state_are_allowed(tmp_path):
    """The allowlist for checkpoints with a numpy RNG state is a uint32 array's types, nothing more of numpy."""
    for value, name in ((np.zeros(3), "Float64DType"), (np.float64(1.0), "scalar")):
        torch.save({"format_version": ck.FORMAT_VERSION, "model": {}, "x": value}, tmp_path / "x.pt")
        with pytest.raises(ck.UnsafeCheckpointError, match=rf"x.pt holds numpy\.\S*{name}"):
            ck.load(tmp_path / "x.pt")
    torch.save({"format_version": ck.FORMAT_VERSION, "model": {}, "x": np.arange(3, dtype=np.uint32)},
               tmp_path / "x.pt")
    assert ck.load(tmp_path / "x.pt")["x"].tolist() == [0, 1, 2]


def test_rng_state_is_plain_data_and_restores_numpy_exactly(tmp_path):
    """rng_state() holds no numpy object (the checkpoint needs no allowlisted global); numpy's state comes back
    exactly, the cached Gaussian included; the old form (np.random.get_state()'s tuple) is accepted too."""
    import random

    np.random.seed(3)
    np.random.random(5)
    np.random.standard_normal()  # an odd number of legacy Gaussians: one is cached (has_gauss=1)
    random.seed(4)
    torch.manual_seed(5)
    ck.save(tmp_path, "last", {"model": {}, "rng": ck.rng_state()})
    want = np.random.get_state()
    assert want[3] == 1
    draws = (np.random.standard_normal(3), np.random.random(4), random.random(), torch.rand(2))
    assert torch.serialization.get_unsafe_globals_in_checkpoint(tmp_path / "last.pt") == []
    saved = ck.load(tmp_path / "last.pt")["rng"]
    for numpy_state in (saved["numpy"], want):  # the new form, then the old one
        np.random.seed(99)
        random.seed(99)
        torch.manual_seed(99)
        ck.set_rng_state({**saved, "numpy": numpy_state})
        got = np.random.get_state()
        assert got[0] == want[0] and np.array_equal(got[1], want[1]) and got[2:] == want[2:]
        again = (np.random.standard_normal(3), np.random.random(4), random.random(), torch.rand(2))
        assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(again, draws))


@needs_mirror
def test_a_checkpoint_with_a_numpy_rng_state_still_loads_and_resumes(crashed_run, tmp_path):
    """A checkpoint written before the numpy RNG state was plain data (np.random.get_state(), a uint32 array) loads
    through the numpy allowlist and resumes to the uninterrupted run's metrics and metrics.jsonl."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(crashed_run / "run", out)
    last = out / "ckpt" / "last.pt"
    c = ck.load(last)
    ck.set_rng_state(c["rng"])
    c["rng"]["numpy"] = np.random.get_state()  # what the older code wrote at this step
    torch.save(c, last)
    assert "numpy.ndarray" in torch.serialization.get_unsafe_globals_in_checkpoint(last)
    old = ck.load(last)["rng"]["numpy"]
    assert isinstance(old[1], np.ndarray) and old[1].dtype == np.uint32
    final = run(compose(SMALL + ["resume=auto", "threads=1"]), out)
    assert _stable(final) == _stable(_final(crashed_run / "ref"))
    assert _history(out) == _history(crashed_run / "ref")


@needs_mirror
@pytest.mark.parametrize("kind", ["zip", "pickle"])
@pytest.mark.parametrize("route", ["resume_auto", "resume_path", "best"])
def test_the_training_command_refuses_a_checkpoint_that_would_run_code(route, kind, crashed_run, tmp_path, capsys,
                                                                      monkeypatch):
    """The three places the command reads a checkpoint: resume=auto (ckpt/last.pt, with a good prev.pt beside it:
    not fallen back to), resume=<path>, and best.pt before the final evaluation (trainer.final_eval=best). Each is
    one line, exit code 2, and `touch` never runs."""
    import shutil

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    marker, out = tmp_path / "marker", tmp_path / "run"
    overrides = SMALL + ["threads=1"]
    if route == "resume_auto":
        shutil.copytree(crashed_run / "run", out)
        bad = _crafted(out / "ckpt" / "last.pt", kind, marker)
        before = {p.name: p.read_bytes() for p in (out / "ckpt").iterdir()}
        line = f"error: {_refusal(bad)}"
        overrides.append("resume=auto")
    elif route == "resume_path":
        out.mkdir()
        bad = _crafted(tmp_path / "given.pt", kind, marker)
        line = f"error: resume={bad}: {_refusal(bad)}"
        overrides.append(f"resume={bad}")
    else:
        out.mkdir()
        bad = _crafted(out / "ckpt" / "best.pt", kind, marker)  # no val split: training never writes a best.pt
        line = f"error: {_refusal(bad)}"
        overrides.append("trainer.final_eval=best")
    with pytest.raises(SystemExit) as e:
        run_job(compose(overrides), out, False, run)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(line), err
    assert not marker.exists()
    if route == "resume_auto":  # nothing fallen back to, renamed or restarted
        assert {p.name: p.read_bytes() for p in (out / "ckpt").iterdir()} == before
        assert _history(out) == _history(crashed_run / "run")
    elif route == "resume_path":
        assert not (out / "ckpt").exists()  # refused before any training
    else:
        assert ck.load(out / "ckpt" / "last.pt")["step"] == 6  # trained to the end, then refused best.pt


def test_no_file_of_the_repository_loads_with_weights_only_false():
    """Every torch.load of the repository's Python files reads with weights_only=True (checkpoint.load does): a
    load that may build any object is how a crafted file runs code. (The pattern is built here so that this
    file does not match itself.)"""
    pattern = "weights_only" + "=False"
    r = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"not a git checkout: {r.stderr.strip()}")
    files = r.stdout.split()
    assert "highway_repro/engine/checkpoint.py" in files
    hits = [f"{f}:{i}" for f in files if (REPO / f).is_file()
            for i, line in enumerate((REPO / f).read_text(errors="replace").splitlines(), 1)
            if pattern in line.replace(" ", "")]
    assert not hits, hits


# ============================================================================ 3. the error path

def test_the_project_errors_are_the_one_line_errors():
    """The command reports the project's own error classes in one line with exit code 2: config values, data faults,
    checkpoints; they are known without importing torch (a config error is reported before torch is loaded)."""
    code = ("import sys, highway_repro.train, highway_repro.cli as c; "
            "print([e.__name__ for e in c.USER_ERRORS], 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["['ConfigError',", "'HighwayError']", "False"], r.stdout + r.stderr
    for cls in (ck.CheckpointError, ck.UnsafeCheckpointError, data.DataError, data.ChecksumError,
                data.DataNotFoundError, vision.UnsafePickleError):
        assert issubclass(cls, HighwayError) and issubclass(cls, USER_ERRORS), cls
    for cls in (ValueError, TypeError, RuntimeError, KeyError):  # a plain one is a bug, not the user's mistake
        assert not issubclass(cls, USER_ERRORS), cls


@pytest.mark.parametrize("multirun", [False, True])
@pytest.mark.parametrize("error", [HighwayError("data.x=1 is bad (valid: 2)"), ValueError("a bug"), KeyError("bug")])
def test_user_errors_are_one_line_and_bugs_keep_their_traceback(error, multirun, tmp_path, capsys, monkeypatch):
    """A project error: one line on stderr and exit 2 (in a multirun: the line, metrics.json says failed with the
    error, and the job returns, so Hydra goes on with the other jobs; `SweepEnd` exits 2 at the end). Anything else
    propagates with its traceback; metrics.json says failed (the report marks the cell)."""
    def failing(cfg, out_dir, dist=None):
        raise error

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.delenv(MULTIRUN_ENV, raising=False)  # no multirun around this test
    cfg = compose(["experiment=demo", "scale=smoke"])
    user = isinstance(error, USER_ERRORS)
    if user and not multirun:
        with pytest.raises(SystemExit) as e:
            run_job(cfg, tmp_path, multirun, failing)
        assert e.value.code == 2
        assert capsys.readouterr().err == "error: data.x=1 is bad (valid: 2)\n"
    elif user:
        sweep = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
        other = SweepEnd()  # another multirun into the same folder, at the same time: the error is not its own
        other.on_multirun_start(config=sweep)
        others = os.environ[MULTIRUN_ENV]
        end = SweepEnd()  # this job's multirun (its folder is in the environment the job inherits)
        end.on_multirun_start(config=sweep)
        assert run_job(cfg, tmp_path, multirun, failing) is None
        assert capsys.readouterr().err == "error: data.x=1 is bad (valid: 2)\n"
        with pytest.raises(SystemExit) as e:
            end.on_multirun_end(config=sweep)
        assert e.value.code == 2 and "1 job of this multirun failed (?)" in capsys.readouterr().err
        monkeypatch.setenv(MULTIRUN_ENV, others)
        other.on_multirun_end(config=sweep)  # no exit
        assert not (tmp_path / ".user_errors").exists()  # its notes are removed at the multirun's end
    else:
        with pytest.raises(type(error)) as e:
            run_job(cfg, tmp_path, multirun, failing)
        assert e.value is error and e.value.__traceback__ is not None
        assert "error:" not in capsys.readouterr().err
    if user and not multirun:  # nothing to record: the user reads the line
        assert not (tmp_path / "metrics.json").exists()
    else:
        assert _final(tmp_path) == {"status": "failed", "error": f"{type(error).__name__}: {str(error).splitlines()[0]}"}


def test_a_multirun_job_that_could_record_nothing_still_fails_the_multirun(tmp_path, capsys, monkeypatch):
    """A job whose folder holds another recipe's run writes no metrics.json (it would overwrite that run's): its
    error is one line and SweepEnd still exits 2 (the job noted it in the multirun's own folder)."""
    monkeypatch.delenv(MULTIRUN_ENV, raising=False)
    sweep = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    end = SweepEnd()
    end.on_multirun_start(config=sweep)
    assert user_failure(ConfigError("resume=auto: the run folder x holds a run of another recipe"), None, True) is None
    assert capsys.readouterr().err == "error: resume=auto: the run folder x holds a run of another recipe\n"
    assert not list(tmp_path.glob("*/metrics.json")) and not (tmp_path / "metrics.json").exists()
    (tmp_path / "seed=0").mkdir()
    (tmp_path / "seed=0" / "metrics.json").write_text('{"status": "do')  # another run's, half written: not read
    with pytest.raises(SystemExit) as e:
        end.on_multirun_end(config=sweep)
    assert e.value.code == 2 and "1 job of this multirun failed (?)" in capsys.readouterr().err
    again = SweepEnd()  # counted once: the next multirun starts clean
    again.on_multirun_start(config=sweep)
    again.on_multirun_end(config=sweep)


@needs_mirror
def test_an_option_a_constructor_refuses_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    """Hydra's instantiate wraps what a constructor raises into its own exception; the project's errors come through
    as raised (here a data set's option), and torch's checks of optimizer values name the config node."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    for overrides, line in [(["data.normalize=gcn"], "error: mnist: normalize='gcn' is not valid; choose one of"),
                            (["optim.optimizer.momentum=-1"], "error: optim.optimizer: Invalid momentum value: -1")]:
        with pytest.raises(SystemExit) as e:
            run_job(compose(["experiment=demo", "scale=smoke", "threads=1"] + overrides), tmp_path, False, run)
        assert e.value.code == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(line), err


DEPTH_0 = "model.depth=0 is not allowed (valid: an integer >= 2 (1 plain input layer + depth - 1 layers))"
BAD_CONFIGS = {  # overrides -> (field=value named in the message, the valid range named in it)
    "gate_kind": (["model=transformer_lm", "data=ptb_char", "model.gate_kind=sdu_relu"],
                  "model.gate_kind='sdu_relu'", "valid: none, sdu_sigmoid, sdu_tanh, highway, gated_attn"),
    "gate_layers": (["model=transformer_lm", "data=ptb_char", "model.gate_kind=sdu_tanh", "model.gate_layers=[2,4]"],
                    "model.gate_layers=[2, 4]", "valid: 1-3"),
    "n_heads": (["model=transformer_lm", "data=ptb_char", "model.n_heads=3"],
                "model.n_heads=3", "valid: a divisor of 512"),
    "depth": (["experiment=demo", "model.depth=0"], "model.depth=0", "valid: an integer >= 2"),
    "seq_len": (["model=transformer_lm", "data=ptb_char", "data.seq_len=-5"], "data.seq_len=-5",
                "valid: a positive integer"),
    "mem_len": (["model=transformer_lm", "data=ptb_char", "+model.mem_len=8"], "model.mem_len=8",
                "valid only for TransformerXL"),
    "batch_size": (["experiment=demo", "data.batch_size=100000"], "data.batch_size=100000", "valid: 1..400"),
}


def _bad_config_cli(case: str, out: Path) -> tuple[subprocess.CompletedProcess, list[str], list[str]]:
    """`python -X importtime -m highway_repro.train <bad config>`: the process, its stderr lines without the import
    times, and the modules it imported."""
    r = subprocess.run(_cli(BAD_CONFIGS[case][0] + ["scale=smoke", f"hydra.run.dir={out}"], flags=("-X", "importtime")),
                       cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    imports = [x.rsplit("|", 1)[-1].strip() for x in r.stderr.splitlines() if x.startswith("import time:")]
    return r, [x for x in r.stderr.splitlines() if not x.startswith("import time:")], imports


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_is_one_line_naming_field_value_and_valid_range(case):
    overrides, field, valid = BAD_CONFIGS[case]
    with pytest.raises(ConfigError) as e:
        validate(compose(overrides + ["scale=smoke"]))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{field} ") and valid in msg, msg


def test_bad_config_exits_2_in_one_line_before_torch_is_imported(tmp_path):
    """What the user sees: exit code 2, one line `error: <field>=<value> ...`, no traceback; main() validates before
    it imports torch or numpy (so it fails in about a second: test_bad_config_fails_in_under_2_s, slow)."""
    _, field, valid = BAD_CONFIGS["gate_kind"]
    r, lines, imports = _bad_config_cli("gate_kind", tmp_path)
    assert r.returncode == 2, r.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith(f"error: {field} ") and valid in lines[0], lines
    assert "torch" not in imports and "numpy" not in imports


@pytest.mark.parametrize("args, line", [
    (["experiment=ht_char_pt"], "error: experiment=ht_char_pt is not a config of configs/experiment/ (valid: demo, "),
    (["-m", "experiment=demo", "variant=sdu_tanh,sdu_tan"], "error: variant=sdu_tan is not a config of configs/variant/"),
    (["experiment=demo", "scale=smok"], "error: scale=smok is not a config of configs/scale/ (valid: cpu, paper, smoke)"),
])
def test_a_misspelt_config_choice_is_one_line_before_hydra(args, line, tmp_path):
    """Hydra's own message for a choice with no file is a line per valid choice and exit 1; the command checks the
    command line's group choices first (config.check_group_choices): one line naming them, exit 2."""
    r = subprocess.run(_cli(args + [f"hydra.run.dir={tmp_path}", f"hydra.sweep.dir={tmp_path}"]), cwd=REPO,
                       env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.splitlines() == [r.stderr.strip()], r.stderr[-3000:]
    assert r.stderr.startswith(line), r.stderr
    assert not list(tmp_path.iterdir())  # nothing was composed, nothing written


def test_choices_hydra_finds_elsewhere_are_left_to_it(tmp_path):
    """`experiment=demo.yaml` is Hydra's too; with config folders added (`--config-dir`), a choice may live there."""
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text((REPO / "configs" / "experiment" / "demo.yaml").read_text())
    for args in (["experiment=demo.yaml"], ["--config-dir", str(tmp_path), "experiment=mine"]):
        r = subprocess.run(_cli(args + ["scale=smoke", "--cfg", "job"]), cwd=REPO, env=_env(), capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0 and "name: demo" in r.stdout, (args, r.stderr[-2000:])


@pytest.mark.slow  # a wall-clock bound
@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_fails_in_under_2_s(case, tmp_path):
    """Exit 2 with one line naming the field, the value and the valid range; no traceback; torch never imported.

    Time: the whole subprocess (interpreter + Hydra, which composes the config twice; torch is not imported,
    checked through -X importtime, whose output makes the times upper bounds) must take under 2 s. Measured on the
    2-core reference machine: 0.9-1.2 s of CPU time; wall 1.0-1.2 s idle, 1.5-2.3 s at load average 8 (other
    engineers' test runs). So the CPU time (user + sys of the child, independent of load) is held to 2 s, and
    the wall time to 2 s times the CPU contention (1-min load average / cores, when above 1), best of 3 tries.
    """
    import resource

    _, field, valid = BAD_CONFIGS[case]
    walls, cpus = [], []
    contention = max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    for attempt in range(3):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        r, lines, imports = _bad_config_cli(case, tmp_path / str(attempt))
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        assert r.returncode == 2, r.stderr[-3000:]
        assert "torch" not in imports and "numpy" not in imports
        assert lines == [lines[-1]] and lines[-1].startswith(f"error: {field} "), lines
        assert valid in lines[-1]
        if walls[-1] < 2.0 * contention:
            break
    print(f"{case}: wall {min(walls):.2f} s, cpu {min(cpus):.2f} s, contention {contention:.1f}")
    assert min(cpus) < 2.0, cpus
    assert min(walls) < 2.0 * contention, (walls, contention)


ONE_LINE_ERRORS = {  # overrides -> the start of the one line (field, value), what it says is allowed
    "misspelt_key": (["experiment=demo", "optim.lrr=1"], "error: optim.lrr=1 is not a key of optim",
                     "(valid: optimizer, scheduler, param_groups)"),
    "added_key_nothing_reads": (["experiment=demo", "+optim.lrr=1"], "error: +optim.lrr=1 is read by nothing",
                                "valid: + adds an argument to model, data, optim.optimizer, optim.scheduler"),
    "nan_lr_with_sgd": (["experiment=hn_table1", "optim.optimizer.lr=nan"],
                        "error: optim.optimizer.lr=nan is not allowed", "(valid: a finite number >= 0)"),
    "negative_lr_with_sgd": (["experiment=demo", "optim.optimizer.lr=-0.1"],
                             "error: optim.optimizer.lr=-0.1 is not allowed", "(valid: a finite number >= 0)"),
    "unparsable_override": (["experiment=demo", "optim.optimizer.lr=["], "error: optim.optimizer.lr=[ cannot be parsed",
                            "(valid: Hydra's override grammar"),
}


@pytest.mark.parametrize("case", sorted(ONE_LINE_ERRORS))
def test_config_errors_of_hydra_and_of_the_project_are_one_line(case, tmp_path):
    """A key Hydra does not know (its own message: 5 lines, exit 1), a key added with + that no constructor reads
    (accepted by Hydra), a learning rate that torch's SGD takes (nan), an override Hydra cannot parse: exit 2, one
    line naming the field, its value and what is allowed; nothing written, torch not imported."""
    overrides, start, valid = ONE_LINE_ERRORS[case]
    out = tmp_path / "run"
    r = subprocess.run(_cli(overrides + ["scale=smoke", f"hydra.run.dir={out}"], flags=("-X", "importtime")), cwd=REPO,
                       env=_env(), capture_output=True, text=True, timeout=120)
    lines = [x for x in r.stderr.splitlines() if not x.startswith("import time:")]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith(start) and valid in lines[0], lines
    assert "torch" not in {x.rsplit("|", 1)[-1].strip() for x in r.stderr.splitlines() if x.startswith("import time")}
    assert not (out / "metrics.json").exists()


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder that cannot be written: chmod 555, or (as root, who may write anyway) a read-only tmpfs mounted
    there; skipped where neither works."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    mounted = False
    if os.access(folder, os.W_OK):
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)], capture_output=True)
        mounted = r.returncode == 0
        if not mounted:
            folder.chmod(0o755)
            pytest.skip("no read-only folder here (root, and mount is not permitted)")
    yield folder
    if mounted:
        subprocess.run(["umount", str(folder)], check=True)
    folder.chmod(0o755)


@pytest.mark.parametrize("where", ["in", "below"])
def test_a_read_only_run_folder_is_one_line(where, read_only_folder):
    """hydra.run.dir that cannot be created or written (Hydra's own report: a traceback, exit 1): one line naming
    the path, exit 2."""
    out = read_only_folder / "run" if where == "below" else read_only_folder
    r = subprocess.run(_cli(["experiment=demo", "scale=smoke", f"hydra.run.dir={out}"]), cwd=REPO, env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.splitlines() == [r.stderr.strip()], r.stderr[-3000:]
    assert r.stderr.startswith(f"error: cannot write {out}") and "(valid: a writable folder" in r.stderr, r.stderr


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _full_disk_save(obj, f, *args, **kwargs):
    """torch.save on a full disk: a partial file, then torch's own error raised while handling the OSError."""
    f.write(b"PK partial")
    try:
        _enospc()
    except OSError:
        raise RuntimeError("[enforce fail at inline_container.cc] . unexpected pos 704 vs 598")


def _bug(*args, **kwargs):
    raise KeyError("a bug")


def test_a_failed_write_leaves_no_temp_file_and_names_the_path(tmp_path, monkeypatch):
    """metrics.json and checkpoints are written through a temp file and a rename: a full disk (here at the rename,
    and inside torch.save) is a StorageError naming the file, and the temp file is removed; an error of another
    kind keeps its type and leaves no temp file either."""
    from highway_repro.engine.loggers import write_json_atomic
    from highway_repro.errors import StorageError

    with monkeypatch.context() as m:
        m.setattr(os, "replace", _enospc)
        with pytest.raises(StorageError, match=f"cannot write {tmp_path / 'metrics.json'}: No space left on device"):
            write_json_atomic(tmp_path / "metrics.json", {"status": "done"})
    monkeypatch.setattr(torch, "save", _full_disk_save)
    with pytest.raises(StorageError) as e:
        ck.save(tmp_path / "ckpt", "last", {"model": {}, "step": 1})
    assert str(e.value).startswith(f"cannot write {tmp_path / 'ckpt' / 'last.pt'}: No space left on device")
    monkeypatch.setattr(torch, "save", _bug)
    with pytest.raises(KeyError):
        ck.atomic_torch_save({}, tmp_path / "ckpt" / "best.pt")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["ckpt"], list(tmp_path.rglob("*"))


@needs_mirror
@pytest.mark.parametrize("multirun", [False, True])
def test_a_full_disk_during_training_is_one_line(multirun, tmp_path, capsys, monkeypatch):
    """The disk fills up while the first checkpoint is written: exit 2 (in a multirun: the job's line, its
    metrics.json says failed, Hydra goes on), one line naming the checkpoint, no temp file left in ckpt/."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.delenv(MULTIRUN_ENV, raising=False)
    monkeypatch.setattr(torch, "save", _full_disk_save)
    line = (f"error: cannot write {tmp_path / 'ckpt' / 'last.pt'}: No space left on device (valid: a writable folder "
            "with free space; free some space, fix the permissions or choose another hydra.run.dir)")
    if multirun:
        assert run_job(compose(SMALL + ["threads=1"]), tmp_path, True, run) is None
        assert _final(tmp_path) == {"status": "failed", "error": "StorageError: " + line.removeprefix("error: ")}
    else:
        with pytest.raises(SystemExit) as e:
            run_job(compose(SMALL + ["threads=1"]), tmp_path, False, run)
        assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [line]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == []


# ============================================================================ 4. numerical faults

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


# ============================================================================ 5. data faults

@pytest.fixture
def offline_mirror(tmp_mirror, monkeypatch):
    """An empty mirror and cache, no network."""
    def refuse(url, dest, timeout=None):
        raise OSError("network disabled in tests")

    monkeypatch.setattr(sources, "download", refuse)
    return tmp_mirror


def _idx(shape, dtype_code=0x08) -> bytes:
    head = bytes([0, 0, dtype_code, len(shape)]) + b"".join(int(n).to_bytes(4, "big") for n in shape)
    return head + np.random.default_rng(0).integers(0, 10, int(np.prod(shape)), dtype=np.uint8).tobytes()


def _mnist(mirror: Path, n_train=50, n_test=20) -> None:
    (mirror / "mnist").mkdir()
    for name, shape in (("train-images-idx3-ubyte", (n_train, 28, 28)), ("train-labels-idx1-ubyte", (n_train,)),
                        ("t10k-images-idx3-ubyte", (n_test, 28, 28)), ("t10k-labels-idx1-ubyte", (n_test,))):
        (mirror / "mnist" / f"{name}.gz").write_bytes(gzip.compress(_idx(shape)))
    write_sums(mirror)


def _one_line_naming(e, name: str) -> None:
    msg = str(e.value)
    assert name in msg and "\n" not in msg, msg


def test_truncated_gzip_idx_file_is_named(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte.gz"
    blob = gzip.compress(_idx((50, 28, 28)))
    path.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(data.DataError) as e:
        vision.read_idx(path)
    _one_line_naming(e, str(path))


def test_truncated_or_empty_mnist_in_a_mirror_is_named(offline_mirror):
    mirror, cache = offline_mirror
    _mnist(mirror)
    assert data.build("mnist", cache_dir=cache, batch_size=10).num_examples("train") == 50
    f = mirror / "mnist" / "train-images-idx3-ubyte.gz"
    f.write_bytes(f.read_bytes()[:-100])  # truncated after its checksum was recorded
    with pytest.raises(data.ChecksumError) as e:
        data.build("mnist", cache_dir=cache / "2", batch_size=10)
    _one_line_naming(e, "mnist/train-images-idx3-ubyte.gz")
    f.write_bytes(gzip.compress(_idx((0, 28, 28))))  # an empty split, with a matching checksum
    write_sums(mirror)
    with pytest.raises(data.DataError) as e:
        data.build("mnist", cache_dir=cache / "3", batch_size=10)
    _one_line_naming(e, "train-images-idx3-ubyte.gz: holds no items")


def _ptb(mirror: Path, valid_text: str | None = None) -> None:
    (mirror / "ptb").mkdir()
    rng = np.random.default_rng(1)
    words = [f"w{i}" for i in range(30)]
    for f, n in (("train", 200), ("valid", 30), ("test", 30)):
        text = "".join(" " + " ".join(rng.choice(words, 8)) + " \n" for _ in range(n))
        (mirror / "ptb" / f"ptb.{f}.txt").write_text(valid_text if f == "valid" and valid_text is not None else text)
    write_sums(mirror)


def test_empty_text_split_is_named(offline_mirror):
    mirror, cache = offline_mirror
    _ptb(mirror, valid_text="\n")
    with pytest.raises(ValueError) as e:
        data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8)
    _one_line_naming(e, "ptb_word: the val split")
    assert "ptb.valid.txt) is empty" in str(e.value)


def test_a_text_file_that_is_not_utf8_is_named(offline_mirror):
    """A text file whose checksum matches but that is not UTF-8: one line naming it and the first bad byte."""
    mirror, cache = offline_mirror
    _ptb(mirror)
    bad = mirror / "ptb" / "ptb.valid.txt"
    bad.write_bytes(b" w1 w2 \n w3 \xff\xfe w4 \n")  # Latin-1 bytes, recorded in SHA256SUMS
    write_sums(mirror)
    with pytest.raises(data.DataError) as e:
        data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8)
    _one_line_naming(e, f"{bad} is not UTF-8 text (byte b'\\xff' at offset 12: invalid start byte)")


KILLED_CACHE_WRITER = """
import dataclasses, json, os, signal, sys
import numpy as np
from highway_repro import data
from highway_repro.data import sources

# the test's files are the committed version, as write_sums commits them in the test's process
sources.FILES.update({rel: dataclasses.replace(sources.FILES[rel], check=None, sha256=sha)
                      for rel, sha in json.loads(sys.argv[2]).items()})

real_save = np.save
def dying_save(f, arr, allow_pickle=False):
    if dying_save.calls == 1:  # the second array: half written, then the process is killed
        f.write(b"\\x93NUMPY partial")
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    dying_save.calls += 1
    real_save(f, arr, allow_pickle=allow_pickle)
dying_save.calls = 0
np.save = dying_save
data.build("ptb_word", cache_dir=sys.argv[1], batch_size=2, seq_len=8)
"""


def test_a_killed_cache_writer_leaves_no_temp_file_after_the_next_build(offline_mirror):
    """A cache writer killed (SIGKILL) inside an array's write leaves its temp file; the next build removes it (its
    writer is dead) and writes the cache: no temp file left, the arrays those of an uninterrupted build."""
    mirror, cache = offline_mirror
    _ptb(mirror)
    committed = json.dumps({rel: src.sha256 for rel, src in sources.FILES.items() if (mirror / rel).is_file()})
    r = subprocess.run([sys.executable, "-c", KILLED_CACHE_WRITER, str(cache), committed], cwd=REPO,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HIGHWAY_DATA_MIRROR": str(mirror)})
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    (folder,) = list((cache / "prepared").glob("ptb_word-*"))
    assert [p.name for p in folder.glob("*.tmp")], "the killed writer left no temp file"
    d = data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8)
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", "test.npy", "train.npy", "val.npy"]
    assert d.num_tokens("val") == 30 * 9


def test_a_corrupt_data_cache_is_refused_in_one_line_until_its_folder_is_deleted(offline_mirror):
    """A prepared folder changed after it was written is refused in one line naming the file and the folder to
    delete, never rebuilt in its place; once the folder is deleted, the next build writes it again from the source."""
    mirror, cache = offline_mirror
    _ptb(mirror)
    good = data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8)
    (folder,) = list((cache / "prepared").glob("ptb_word-*"))
    breakages = [("train.npy", lambda p: p.write_bytes(p.read_bytes()[:50])),      # truncated array
                 ("manifest.json", lambda p: p.write_text("{not json")),          # garbage manifest
                 ("val.npy", lambda p: np.save(p, np.zeros(3, np.int64)))]         # wrong shape and dtype
    for name, damage in breakages:
        damage(folder / name)
        with pytest.raises(data.ChecksumError) as e:
            data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8)
        _one_line_naming(e, f"{folder / name}")
        assert str(e.value).endswith(f"delete the folder {folder} to rebuild it from the raw files"), name
        shutil.rmtree(folder)
        again = data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8)
        for s in ("train", "val", "test"):
            assert np.array_equal(again.streams[s], good.streams[s]), (name, s)


def test_interrupted_cache_write_leaves_no_partial_file(offline_mirror, monkeypatch):
    """A crash while a cache array is written (disk full, kill) leaves no file under a final name, no temp
    file, and no manifest; the next build rebuilds the cache."""
    mirror, cache = offline_mirror
    _ptb(mirror)
    real_save = np.save
    calls = []

    def dying_save(f, arr, allow_pickle=False):
        calls.append(1)
        if len(calls) == 2:  # the second array: half written, then the process "dies"
            f.write(b"\x93NUMPY partial")
            raise OSError("No space left on device")
        real_save(f, arr, allow_pickle=allow_pickle)

    monkeypatch.setattr(np, "save", dying_save)
    with pytest.raises(OSError, match="No space left"):
        data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8)
    monkeypatch.setattr(np, "save", real_save)
    (folder,) = list((cache / "prepared").glob("ptb_word-*"))
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["train.npy"], names  # the one complete array; no partial val.npy, no temp file, no manifest
    d = data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8)
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", "test.npy", "train.npy", "val.npy"]
    assert d.num_tokens("val") == 30 * 9


# ============================================================================ 6. sweeps with a failing job

@needs_mirror
@pytest.mark.slow  # a Hydra multirun in a subprocess; the job's bookkeeping: test_user_errors_are_one_line_and_...
def test_sweep_with_a_failing_job_finishes_the_others_and_reports_the_error(tmp_path):
    sweep = tmp_path / "sweep"
    r = subprocess.run(_cli(["-m", "experiment=demo", "scale=smoke", "model.depth=0,2", "trainer.max_steps=2",
                             "threads=1", f"hydra.sweep.dir={sweep}"]), cwd=REPO, env=_env(), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr  # once all jobs have run (cli.SweepEnd)
    lines = [x for x in r.stderr.splitlines() if x.startswith("error: [")]  # one line for the failed job
    assert len(lines) == 1 and "model.depth=0" in lines[0] and lines[0].endswith(f"] {DEPTH_0}"), r.stderr[-3000:]
    jobs = {json.loads((p / "metrics.json").read_text())["status"]: p for p in sweep.iterdir() if p.is_dir()}
    assert set(jobs) == {"done", "failed"}, r.stderr[-3000:]
    assert "model.depth=2" in jobs["done"].name and "model.depth=0" in jobs["failed"].name
    assert _final(jobs["failed"])["error"] == f"ConfigError: {DEPTH_0}"
    out = tmp_path / "report" / "t"
    assert report.main([str(sweep), "--group-by", "model.depth", "--metrics", "test/acc", "--out", str(out)]) == 0
    rows = {line.split("|")[1].strip(): line for line in out.with_suffix(".md").read_text().splitlines()
            if line.startswith("| ") and line.split("|")[1].strip() in ("0", "2")}
    assert set(rows) == {"0", "2"}
    assert "| 2 | 1 |" in rows["2"] and "failed" not in rows["2"]
    assert "| 0 | 0 (1 failed) |" in rows["0"] and DEPTH_0 in rows["0"]  # n done (failed), the error


# ============================================================================ 7. a damaged kept run in the reports

def test_make_tables_names_a_damaged_kept_run_and_fails(tmp_path, capsys):
    """A kept run whose metrics.json cannot be parsed: `make tables` names it (path and parse error), the table's
    header and row count it as damaged, its numbers are in no statistic, and the command exits 1; 0 with
    --allow-damaged (the same tables). A copy of a results tree, never the committed one."""
    from highway_repro.runner.cli import main as reproduce

    kept = tmp_path / "results" / "highway_transformer" / "runs" / "ht_enwik8_l6-cpu"
    for seed, bpc in ((0, 1.5), (1, 9.0)):
        run_dir = kept / f"seed={seed},variant=baseline"
        run_dir.mkdir(parents=True)
        (run_dir / "config_resolved.yaml").write_text(f"seed: {seed}\nvariant: baseline\n")
        (run_dir / "metrics.json").write_text(json.dumps({"status": "done", "step": 10, "test/bpc": bpc,
                                                          "time/wall_s": 1.0}))
    damaged = kept / "seed=1,variant=baseline" / "metrics.json"
    damaged.write_text(damaged.read_text()[:-20])  # cut after the run wrote it
    args = ["--all", "--report-only", "--scale", "cpu", "--results", str(tmp_path / "results"), "--runs",
            str(tmp_path / "runs")]
    assert reproduce(args) == 1
    err = capsys.readouterr().err
    assert f"error: {damaged} cannot be parsed (JSONDecodeError: " in err and "counted as damaged" in err
    md = (tmp_path / "results" / "highway_transformer" / "enwik8_l6.md").read_text()
    assert "runs: 1 done, 0 failed, 0 missing, **1 damaged (metrics.json cannot be parsed)**" in md
    rows = [line for line in md.splitlines() if line.startswith("| ") and "(1 damaged)" in line]
    assert len(rows) == 1 and "| 1 (1 damaged) |" in rows[0] and "9.0" not in md, md
    assert reproduce(args + ["--allow-damaged"]) == 0
    assert f"warning: {damaged} cannot be parsed" in capsys.readouterr().err
