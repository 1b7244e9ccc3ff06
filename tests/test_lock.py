"""One writer per run folder and per table (`highway_repro.lock`): a second trainer on a run folder, or a second
runner on a table, is refused at once with one line naming the holder, exit code 2; a holder that died (kill -9)
leaves a lock the next writer takes over; `checkpoint.save` removes only the temp files of dead writers.

Fast tests in-process; the slow ones with real `python -m highway_repro.train` / `highway_repro.runner`
processes on the demo's smoke scale (they need the data mirror).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import REPO, needs_mirror
from highway_repro.train import run_job
from highway_repro.train.job import folder_lock
from highway_repro.engine import checkpoint as ck
from highway_repro.errors import BusyError, StorageError
from highway_repro.lock import RUN_LOCK, take
from highway_repro.runner.cli import hold_tables, main as reproduce

SINCE = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
HOLD = ("import sys, time; from highway_repro.lock import take; take(sys.argv[1], 'x', 'y'); "
        "print('held', flush=True); time.sleep(60)")


def busy_line(what: str, pid: int, allowed: str) -> str:
    return (rf"{re.escape(what)} is in use by pid {pid} on host {re.escape(socket.gethostname())} since {SINCE} "
            rf"\(valid: {re.escape(allowed)}; wait for it or stop it\)")


def holding_process(path: Path) -> subprocess.Popen:
    """Another process that holds the lock `path` (until it is killed)."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "held\n"
    return p


# ============================================================================ fast: in-process

def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    path = tmp_path / RUN_LOCK
    with take(path, f"run folder {tmp_path}", "one writer per run folder"):
        assert json.loads(path.read_text())["pid"] == os.getpid()
        with pytest.raises(BusyError, match=busy_line(f"run folder {tmp_path}", os.getpid(),
                                                      "one writer per run folder")):
            take(path, f"run folder {tmp_path}", "one writer per run folder")
    assert not path.exists()  # released: the file goes with it
    take(path, "x", "y").release()


def test_a_lock_whose_holder_was_killed_is_taken_over(tmp_path):
    """kill -9 leaves the lock file behind; the kernel released the lock itself, and the next writer takes it."""
    path = tmp_path / RUN_LOCK
    p = holding_process(path)
    with pytest.raises(BusyError, match=busy_line("x", p.pid, "y")):
        take(path, "x", "y")
    p.kill()
    p.wait()
    assert json.loads(path.read_text())["pid"] == p.pid  # what the dead holder left
    with take(path, "x", "y"):
        assert json.loads(path.read_text())["pid"] == os.getpid()


@pytest.mark.parametrize("kind", ["symbolic link", "dangling symbolic link", "hard link"])
def test_a_link_at_the_lock_path_is_one_line_and_never_written_through(tmp_path, capsys, kind):
    """A link at `<run folder>/.writer.lock` to a file outside the folder: the trainer refuses it in one line naming
    the path, and the file it points at stays as it was (a dangling link's target is not created)."""
    def train(cfg, out_dir, dist=None):
        raise AssertionError("a refused job must not train")

    run, outside = tmp_path / "run", tmp_path / "outside.txt"
    run.mkdir()
    if kind != "dangling symbolic link":
        outside.write_text("not a lock\n")
    if "symbolic" in kind:
        (run / RUN_LOCK).symlink_to(outside)
    else:
        os.link(outside, run / RUN_LOCK)
    with pytest.raises(SystemExit) as e:
        run_job(OmegaConf.create({"resume": "auto"}), run, False, train)
    assert e.value.code == 2
    err, path = capsys.readouterr().err, re.escape(str(run / RUN_LOCK))
    valid = (r"it is a symbolic link \(valid: a regular file; remove the link\)" if "symbolic" in kind else
             r"it is not a regular file of its own \(valid: a regular file with no other hard links; remove it\)")
    assert re.fullmatch(f"error: cannot write {path}: {valid}\n", err), err
    if kind == "dangling symbolic link":
        assert not outside.exists()
    else:
        assert outside.read_text() == "not a lock\n"
    assert os.path.lexists(run / RUN_LOCK)  # left for the user to remove
    with pytest.raises(StorageError, match=f"^cannot write {path}: it is "):
        take(run / RUN_LOCK, "x", "y")


def test_a_released_lock_removes_only_its_own_file(tmp_path):
    path, other = tmp_path / RUN_LOCK, tmp_path / "other"
    lock = take(path, "x", "y")
    other.write_text("another writer's lock")
    os.replace(other, path)  # the path is no longer the holder's file (removed and taken anew)
    lock.release()
    assert path.read_text() == "another writer's lock"


def test_checkpoint_save_removes_only_dead_writers_temp_files(tmp_path):
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        (tmp_path / f".last.pt.tmp{live.pid}").write_bytes(b"being written")
        (tmp_path / f".best.pt.tmp{dead.pid}").write_bytes(b"partial")
        ck.save(tmp_path, "last", {"model": {}, "step": 1})
        assert sorted(p.name for p in tmp_path.iterdir()) == [f".last.pt.tmp{live.pid}", "last.pt"]
    finally:
        live.kill()
        live.wait()


def test_a_trainer_on_a_held_run_folder_is_one_line_and_touches_nothing(tmp_path, capsys):
    def train(cfg, out_dir, dist=None):
        raise AssertionError("a refused job must not train")

    cfg = OmegaConf.create({"resume": "auto"})
    p = holding_process(tmp_path / RUN_LOCK)
    try:
        with pytest.raises(SystemExit) as e:
            run_job(cfg, tmp_path, False, train)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert re.fullmatch("error: " + busy_line(f"run folder {tmp_path}", p.pid, "one writer per run folder") + "\n",
                            err), err
        assert run_job(cfg, tmp_path, True, train) is None  # in a multirun: the line, and the other jobs go on
        assert sorted(f.name for f in tmp_path.iterdir()) == [RUN_LOCK]  # no metrics.json written into it
    finally:
        p.kill()
        p.wait()


def test_a_trainer_holds_its_run_folder_for_the_whole_job(tmp_path, capsys):
    def train(cfg, out_dir, dist=None):
        assert json.loads((out_dir / RUN_LOCK).read_text())["pid"] == os.getpid()
        return {"status": "done", "step": 1, "val/loss": 0.5}

    assert run_job(OmegaConf.create({"resume": "auto"}), tmp_path, False, train) == 0.5
    assert not (tmp_path / RUN_LOCK).exists()


class FakeDist:
    """The two calls folder_lock makes of a DistInfo: rank 0's refusal (or None) reaches every rank."""

    def __init__(self, rank: int, from_rank0=None):
        self.rank, self.from_rank0 = rank, from_rank0

    def broadcast_object(self, obj):
        return obj if self.rank == 0 else self.from_rank0


def test_under_ddp_rank_0_alone_holds_the_folder_and_every_rank_hears_a_refusal(tmp_path):
    assert folder_lock(tmp_path, FakeDist(1)) is None and not (tmp_path / RUN_LOCK).exists()
    held = folder_lock(tmp_path, FakeDist(0))
    with pytest.raises(BusyError, match="in use by pid"):
        folder_lock(tmp_path, FakeDist(0))
    with pytest.raises(BusyError, match="in use by pid"):
        folder_lock(tmp_path, FakeDist(1, BusyError("run folder x is in use by pid 1")))
    held.release()


def test_a_second_runner_stops_before_it_plans_and_an_estimate_needs_no_lock(tmp_path, capsys):
    runs, results = tmp_path / "runs", tmp_path / "results"
    args = ["demo", "--scale", "smoke", "--runs", str(runs), "--results", str(results)]
    with hold_tables(["demo"], "smoke", runs):
        assert reproduce(args) == 2
        err = capsys.readouterr().err
        assert re.fullmatch("error: " + busy_line("table demo at scale smoke", os.getpid(),
                                                  "one runner per table and scale") + "\n", err), err
        assert not (runs / "demo-smoke").exists() and not results.exists()  # nothing planned, nothing restored
        assert reproduce(args + ["--report-only"]) == 0  # the holder writes that report: the others go on
        assert "warning: [demo] not reported now: table demo at scale smoke is in use" in capsys.readouterr().err
    assert list((runs / ".locks").iterdir()) == []  # released


# ============================================================================ slow: real processes

def _env() -> dict:
    return {**{k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}, "OMP_NUM_THREADS": "1",
            "WANDB_MODE": "disabled"}


TRAIN = [sys.executable, "-m", "highway_repro.train", "experiment=demo", "scale=smoke", "trainer.max_steps=100000",
         "trainer.log_every=1", "trainer.eval_every=0", "trainer.checkpoint_every=5", "threads=1", "resume=auto"]


def _steps(run: Path) -> list[int]:
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(x)["step"] for x in lines if x.strip() and "train/loss" in x]


def _wait(cond, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached in {timeout} s")
        time.sleep(0.2)


def _start_training(run: Path, log: Path) -> subprocess.Popen:
    """A trainer in `run`, once it has logged 3 steps beyond those already there."""
    beyond = max(_steps(run), default=0) + 3
    p = subprocess.Popen(TRAIN + [f"hydra.run.dir={run}"], cwd=REPO, env=_env(), stdout=log.open("w"),
                         stderr=subprocess.STDOUT)
    _wait(lambda: max(_steps(run), default=0) >= beyond or p.poll() is not None, "training")
    assert p.poll() is None, log.read_text()[-3000:]
    return p


def _refused(cmd: list[str], holder: int, what: str, allowed: str) -> float:
    """Run `cmd` while `holder` holds the lock: one line naming it, exit code 2; returns its wall time."""
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert re.fullmatch("error: " + busy_line(what, holder, allowed) + "\n", r.stderr), r.stderr
    return took


def _stop(p: subprocess.Popen) -> int:
    p.send_signal(signal.SIGTERM)
    return p.wait(120)


@pytest.mark.slow
@needs_mirror
def test_two_trainers_on_one_run_folder(tmp_path):
    """The second is refused in about the time a bad config takes (no torch work); the first goes on alone, and
    its metrics.jsonl has each step once, in order."""
    run = tmp_path / "run"
    p = _start_training(run, tmp_path / "first.log")
    try:
        took = _refused(TRAIN + [f"hydra.run.dir={run}"], p.pid, f"run folder {run}", "one writer per run folder")
        print(f"refused in {took:.2f} s")
        n = len(_steps(run))
        _wait(lambda: len(_steps(run)) > n + 2, "the first trainer goes on")
    finally:
        rc = _stop(p)
    assert rc == 128 + signal.SIGTERM
    steps = _steps(run)
    assert steps == sorted(set(steps)), steps
    assert json.loads((run / "metrics.json").read_text())["status"] == "interrupted"
    assert not (run / RUN_LOCK).exists() and not list((run / "ckpt").glob(".*.pt.tmp*"))


@pytest.mark.slow
@needs_mirror
def test_a_killed_trainers_run_folder_is_taken_over_by_the_next(tmp_path):
    run = tmp_path / "run"
    p = _start_training(run, tmp_path / "first.log")
    _wait(lambda: (run / "ckpt" / "last.pt").exists(), "a checkpoint")
    p.kill()
    p.wait()
    assert json.loads((run / RUN_LOCK).read_text())["pid"] == p.pid  # left behind, no longer held
    q = _start_training(run, tmp_path / "second.log")
    try:
        assert json.loads((run / RUN_LOCK).read_text())["pid"] == q.pid
    finally:
        assert _stop(q) == 128 + signal.SIGTERM
    steps = _steps(run)
    assert steps == sorted(set(steps)), steps  # resumed from its checkpoint, each step logged once
    assert not (run / RUN_LOCK).exists()


@pytest.mark.slow
@needs_mirror
def test_two_runners_on_one_table(tmp_path):
    runs, results = tmp_path / "runs", tmp_path / "results"
    cmd = [sys.executable, "-m", "highway_repro.runner", "demo", "--scale", "smoke", "--runs", str(runs),
           "--results", str(results), "trainer.max_steps=100000", "trainer.log_every=1"]
    log = tmp_path / "first.log"
    p = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=log.open("w"), stderr=subprocess.STDOUT,
                         start_new_session=True)
    try:
        _wait(lambda: any(_steps(f.parent) for f in (runs / "demo-smoke").glob("*/metrics.jsonl"))
              or p.poll() is not None, "training")
        assert p.poll() is None, log.read_text()[-3000:]
        took = _refused(cmd, p.pid, "table demo at scale smoke", "one runner per table and scale")
        print(f"refused in {took:.2f} s")
        started = [x for x in log.read_text().splitlines() if x.startswith("+ ")]
    finally:
        rc = _stop(p)
    assert rc == 128 + signal.SIGTERM, log.read_text()[-3000:]
    assert len(started) == 1  # --jobs 1: the first runner's one multirun, and nothing from the second
    assert list((runs / ".locks").iterdir()) == []
