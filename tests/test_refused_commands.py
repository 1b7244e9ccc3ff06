"""A command the entry point refuses changes nothing the report reads, and runs nothing it was handed.

- A train command aimed at a run folder that another process writes is refused in one line (exit code 2) before
  anything of the folder is written: `.hydra/overrides.yaml` (by which the report files the run), `.hydra/
  config.yaml`, config_resolved.yaml and metrics.json stay byte for byte as they were, in a run and in a multirun's
  job (basic, joblib and grouped launchers). A job that is not refused gets the `.hydra/` files Hydra writes.
- Hydra's `--experimental-rerun` (it unpickles a file) is refused in every spelling Hydra's parser takes for it.

In-process where the case allows it (the test process holds the folder's lock, which a second `take` in the same
process is refused as another process is); the real commands as subprocesses under `-m slow`.
"""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, needs_mirror, run_cli
from highway_repro.lock import RUN_LOCK, take
from highway_repro.train import job

SMOKE = ["experiment=demo", "scale=smoke", "trainer.max_steps=2", "threads=1"]
LAUNCHERS = {"run": [], "basic": ["-m"], "joblib": ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
             "grouped": ["-m", "hydra/launcher=grouped"]}
READ_BY_THE_REPORT = (".hydra/overrides.yaml", ".hydra/config.yaml", ".hydra/hydra.yaml", "config_resolved.yaml",
                      "metrics.json")


class MakeMarker:
    """Unpickling this calls os.makedirs(marker): the proof that a file ran code."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.makedirs, (self.marker,)


def command(launcher: str, run: Path, *overrides: str) -> list[str]:
    """The arguments of a command of `launcher` (a run, or a multirun of one job) in the run folder `run`."""
    if launcher == "run":
        return [*SMOKE, *overrides, f"hydra.run.dir={run}"]
    return [*LAUNCHERS[launcher], *SMOKE, *overrides, f"hydra.sweep.dir={run.parent}", f"hydra.sweep.subdir={run.name}"]


def a_run_folder(run: Path) -> dict[str, bytes]:
    """A run folder as a finished run leaves it (seed=0); its files the report reads."""
    files = {".hydra/overrides.yaml": b"- experiment=demo\n- seed=0\n", ".hydra/config.yaml": b"seed: 0\n",
             ".hydra/hydra.yaml": b"hydra: {}\n", "config_resolved.yaml": b"seed: 0\n",
             "metrics.json": b'{"status": "done", "val/loss": 0.5}'}
    for rel, data in files.items():
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_bytes(data)
    return files


def files(run: Path) -> dict[str, bytes]:
    return {rel: (run / rel).read_bytes() for rel in READ_BY_THE_REPORT if (run / rel).exists()}


BUSY = r"error: (\[[^]]*\] )?run folder {run} is in use by pid {pid} on host \S+ since [-\d: ]+ \(valid: one writer " \
       r"per run folder; wait for it or stop it\)"


@pytest.mark.parametrize("launcher", ["run", "basic", "grouped"])
def test_a_command_refused_on_a_busy_run_folder_changes_none_of_its_files(tmp_path, monkeypatch, capsys, launcher):
    run = tmp_path / "sweep" / "run"
    before = a_run_folder(run)
    with take(run / RUN_LOCK, f"run folder {run}", "one writer per run folder"):  # another writer trains in it
        code, lines = run_cli(monkeypatch, capsys, command(launcher, run, "seed=1"))
        assert files(run) == before
    assert code == 2
    assert re.fullmatch(BUSY.format(run=re.escape(str(run)), pid=os.getpid()), lines[0]), lines
    if launcher == "run":
        assert len(lines) == 1, lines
    else:  # the job's line, then the multirun's
        assert len(lines) == 2 and lines[1].startswith("error: 1 job of this multirun failed"), lines


def test_a_bad_config_refused_on_a_busy_folder_writes_no_metrics_there(tmp_path, monkeypatch, capsys):
    """A multirun's job with a config error notes it in its folder's metrics.json, but not in another writer's."""
    run = tmp_path / "sweep" / "run"
    before = a_run_folder(run)
    with take(run / RUN_LOCK, f"run folder {run}", "one writer per run folder"):
        code, lines = run_cli(monkeypatch, capsys, command("basic", run, "seed=-1"))
        assert files(run) == before
    assert code == 2 and "seed=-1 is not allowed" in lines[0], lines


@pytest.mark.parametrize("launcher", ["run", "basic"])
def test_a_job_writes_the_hydra_files_hydra_writes(tmp_path, monkeypatch, capsys, launcher):
    """The `.hydra/` files written once the job holds its folder are those Hydra writes itself (here: without the
    callback), but for the callback and the override that leaves it out."""
    ours, hydras = tmp_path / "ours" / "run", tmp_path / "hydra" / "run"
    for run, extra in ((ours, []), (hydras, ["~hydra.callbacks.run_folder"])):
        code, lines = run_cli(monkeypatch, capsys, command(launcher, run, "seed=-1", *extra))
        assert code == 2 and "seed=-1 is not allowed" in lines[0], lines  # a job that ends before it trains
        assert not (run / RUN_LOCK).exists()  # released as its job or command ended
    for name in ("config.yaml", "overrides.yaml"):
        assert (ours / ".hydra" / name).read_bytes() == (hydras / ".hydra" / name).read_bytes(), name
    mine, theirs = (yaml.safe_load((run / ".hydra" / "hydra.yaml").read_text())["hydra"] for run in (ours, hydras))
    del mine["callbacks"]["run_folder"]
    theirs["overrides"]["hydra"].remove("~hydra.callbacks.run_folder")
    for h, run in ((mine, ours), (theirs, hydras)):
        assert h["output_subdir"] == ".hydra"
        h["overrides"]["hydra"] = [o.replace(str(run.parent), "<dir>") for o in h["overrides"]["hydra"]]
        h["run"]["dir"], h["sweep"]["dir"], h["runtime"]["output_dir"] = "<dir>", "<dir>", "<dir>"
    assert mine == theirs


@pytest.mark.parametrize("spelling", ["--e", "--exp", "--experimental-re", "--experimental-rerun"])
@pytest.mark.parametrize("joined", [True, False])
def test_experimental_rerun_is_refused_in_every_spelling_hydra_takes(tmp_path, monkeypatch, capsys, spelling,
                                                                    joined):
    blob = tmp_path / "config.pickle"
    blob.write_bytes(pickle.dumps(MakeMarker(tmp_path / "MARKER")))
    args = [f"{spelling}={blob}"] if joined else [spelling, str(blob)]
    code, lines = run_cli(monkeypatch, capsys, args)
    assert not (tmp_path / "MARKER").exists()
    assert code == 2 and len(lines) == 1 and "--experimental-rerun unpickles a file" in lines[0], lines


def test_what_is_not_that_flag_is_left_to_hydra():
    for arg in ("--", "--cfg=job", "--config-dir=x", "--exps", "--experimental-rerunx=1", "seed=1"):
        assert not job.hydra_flag(arg, "--experimental-rerun", "--e"), arg
    assert job.hydra_flag("--config-d=x", "--config-dir", "--config-d")


# ============================================================================ slow: real processes

@pytest.mark.slow
@needs_mirror
@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_a_second_command_on_a_run_folder_leaves_the_first_s_files(tmp_path, launcher):
    """Two commands on one folder: the first trained in it (seed=0); while its folder is held, the second (seed=1)
    is refused in one line, exit code 2, and the files the report reads are byte-identical afterwards."""
    env = {**{k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}, "OMP_NUM_THREADS": "1",
           "WANDB_MODE": "disabled"}
    run = tmp_path / "sweep" / "run"
    train = [sys.executable, "-m", "highway_repro.train"]
    first = subprocess.run([*train, *command("run", run, "seed=0")], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    before = files(run)
    assert set(before) == set(READ_BY_THE_REPORT)
    with take(run / RUN_LOCK, f"run folder {run}", "one writer per run folder"):
        second = subprocess.run([*train, *command(launcher, run, "seed=1")], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=300)
    assert files(run) == before
    assert second.returncode == 2, second.stderr[-3000:]
    errors = [x for x in second.stderr.splitlines() if x.startswith("error: ")]
    assert re.fullmatch(BUSY.format(run=re.escape(str(run)), pid=os.getpid()), errors[0]), second.stderr[-3000:]
    assert len(errors) == (1 if launcher == "run" else 2) and "Traceback" not in second.stderr, second.stderr[-3000:]
