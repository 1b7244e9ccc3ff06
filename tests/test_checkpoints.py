"""Checkpoints: format version and resolved config, a corrupt last.pt falls back to prev.pt, a checkpoint of
another architecture is a one-line error; a checkpoint that would run code (a crafted zip or bare pickle) is
refused in one line wherever it is read (resume=auto, resume=<path>, best.pt), never fallen back from, and nothing
in it runs, whatever its pickle protocol; the RNG state is plain data, and a checkpoint with numpy's RNG state as an
array (the older format) is one line naming the migration, after which it resumes exactly."""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from conftest import REPO, compose, mirror, needs_mirror
from highway_repro.engine import checkpoint as ck
from highway_repro.engine.trainer import Trainer
from highway_repro.train import run, run_job
from highway_repro.train.job import USER_ERRORS
from _faults import SMALL, Crash, _stable, _history, _final, _reference


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
    assert err[0].startswith(f"error: resume={ckpt}: checkpoint does not fit this architecture; "
                             "missing in checkpoint: ")
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


def _refusal(path: Path, kind: str = "zip") -> str:
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
    assert str(e.value).startswith(_refusal(path, kind)) and "\n" not in str(e.value), e.value
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
        with pytest.raises(ck.UnsafeCheckpointError, match=_refusal(tmp_path / "last.pt", kind)):
            ck.load_latest(tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "prev.pt"]
    assert (tmp_path / "prev.pt").read_bytes() == prev
    (tmp_path / "last.pt").write_bytes(b"garbage")  # a corrupt last.pt before such a prev.pt: refused too
    _crafted(tmp_path / "prev.pt", "zip", marker)
    with pytest.raises(ck.UnsafeCheckpointError, match=_refusal(tmp_path / "prev.pt")):
        ck.load_latest(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "prev.pt"] and not marker.exists()


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
@pytest.mark.parametrize("kind", ["zip", "pickle"])
def test_a_crafted_pickle_of_any_protocol_is_refused_not_taken_for_a_corrupt_file(kind, protocol, tmp_path):
    """torch.save writes protocol 2, and torch's own scan of a checkpoint (`get_unsafe_globals_in_checkpoint`) reads
    no other; a crafted file of another protocol, a torch.save zip with its data.pkl replaced or a bare pickle, is
    still refused naming the global (the project's scan reads every protocol), so that load_latest never falls back
    from it to prev.pt or renames it."""
    import zipfile

    marker = tmp_path / "marker"
    ck.save(tmp_path, "last", {"model": {}, "step": 1})
    ck.save(tmp_path, "last", {"model": {}, "step": 2})
    payload = {"format_version": ck.FORMAT_VERSION, "model": {}, "step": 99, "x": _RunsCode(marker)}
    data = pickle.dumps(payload, protocol=protocol)
    last = tmp_path / "last.pt"
    if kind == "zip":
        with zipfile.ZipFile(last) as z:
            items = {n: z.read(n) for n in z.namelist()}
        with zipfile.ZipFile(last, "w") as z:
            for n, blob in items.items():
                z.writestr(n, data if n.endswith("data.pkl") else blob)
    else:
        last.write_bytes(data)
    with pytest.raises(ck.UnsafeCheckpointError, match=_refusal(last)):
        ck.load_latest(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "prev.pt"] and not marker.exists()


def test_the_old_numpy_rng_format_is_named_and_any_other_numpy_type_refused(tmp_path):
    """A checkpoint asking for a uint32 array's types and nothing else is the older format of this project's
    checkpoints: one line naming the migration (an OldCheckpointError, never fallen back from); any other numpy type
    is refused as asking for code no checkpoint holds, naming it."""
    for value, name in ((np.zeros(3), "Float64DType"), (np.float64(1.0), "scalar")):
        torch.save({"format_version": ck.FORMAT_VERSION, "model": {}, "x": value}, tmp_path / "x.pt")
        with pytest.raises(ck.UnsafeCheckpointError, match=rf"x.pt holds numpy\.\S*{name}"):
            ck.load(tmp_path / "x.pt")
    (tmp_path / "ckpt").mkdir()
    torch.save({"format_version": ck.FORMAT_VERSION, "model": {}, "rng": {"numpy": np.random.get_state()}},
               tmp_path / "ckpt" / "x.pt")
    with pytest.raises(ck.OldCheckpointError) as e:
        ck.load(tmp_path / "ckpt" / "x.pt")
    assert str(e.value) == (f"checkpoint {tmp_path / 'ckpt' / 'x.pt'} holds numpy's RNG state as an array, the "
                            f"format of older checkpoints of this project: python scripts/migrate_kept_runs.py "
                            f"{tmp_path / 'ckpt' / 'x.pt'} rewrites it")
    assert not isinstance(e.value, ck.CheckpointError) and isinstance(e.value, USER_ERRORS)
    # a uint32 array anywhere but the RNG state is no checkpoint of ours: refused, not taken for the old format
    torch.save({"format_version": ck.FORMAT_VERSION, "model": {}, "x": np.arange(3, dtype=np.uint32)},
               tmp_path / "y.pt")
    with pytest.raises(ck.UnsafeCheckpointError, match=r"y.pt holds numpy\."):
        ck.load(tmp_path / "y.pt")


def test_rng_state_is_plain_data_and_restores_numpy_exactly(tmp_path):
    """rng_state() holds no numpy object (the checkpoint needs no allowlisted global); numpy's state comes back
    exactly, the cached Gaussian included."""
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
    np.random.seed(99)
    random.seed(99)
    torch.manual_seed(99)
    ck.set_rng_state(saved)
    got = np.random.get_state()
    assert got[0] == want[0] and np.array_equal(got[1], want[1]) and got[2:] == want[2:]
    again = (np.random.standard_normal(3), np.random.random(4), random.random(), torch.rand(2))
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(again, draws))


@needs_mirror
def test_a_checkpoint_with_a_numpy_rng_state_is_migrated_and_then_resumes_exactly(crashed_run, tmp_path):
    """A checkpoint written before the numpy RNG state was plain data (np.random.get_state(), a uint32 array):
    resume=auto stops in one line naming the migration (no fall-back to prev.pt, which has the same format, no start
    from step 0); scripts/migrate_kept_runs.py rewrites it and then the run resumes to the uninterrupted run's
    metrics and metrics.jsonl."""
    import shutil

    from conftest import load_script

    out = tmp_path / "run"
    shutil.copytree(crashed_run / "run", out)
    last = out / "ckpt" / "last.pt"
    c = ck.load(last)
    ck.set_rng_state(c["rng"])
    c["rng"]["numpy"] = np.random.get_state()  # what the older code wrote at this step
    torch.save(c, last)
    assert "numpy.ndarray" in torch.serialization.get_unsafe_globals_in_checkpoint(last)
    with pytest.raises(ck.OldCheckpointError, match="migrate_kept_runs.py"):
        run(compose(SMALL + ["resume=auto", "threads=1"]), out)
    assert sorted(p.name for p in (out / "ckpt").iterdir()) == ["last.pt", "prev.pt"]
    assert load_script("migrate_kept_runs").migrate(out) == [last]
    assert isinstance(ck.load(last)["rng"]["numpy"], dict)
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
        line = f"error: {_refusal(bad, kind)}"
        overrides.append("resume=auto")
    elif route == "resume_path":
        out.mkdir()
        bad = _crafted(tmp_path / "given.pt", kind, marker)
        line = f"error: resume={bad}: {_refusal(bad, kind)}"
        overrides.append(f"resume={bad}")
    else:
        out.mkdir()
        bad = _crafted(out / "ckpt" / "best.pt", kind, marker)  # no val split: training never writes a best.pt
        line = f"error: {_refusal(bad, kind)}"
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
