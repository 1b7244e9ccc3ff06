"""Hydra launchers: a joblib multirun of two smoke jobs, and the SLURM (submitit) launcher config."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, needs_mirror


def _train(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "highway_repro.train", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


@needs_mirror
@pytest.mark.slow  # two joblib worker processes
def test_joblib_multirun_of_two_smoke_jobs(tmp_path):
    """Two jobs in joblib worker processes; a third with a bad value fails in its worker: the multirun exits 2 once
    all have run (cli.SweepEnd reads the jobs' records, not the workers' memory)."""
    r = _train("-m", "experiment=demo", "scale=smoke", "model.depth=0,2,3", "hydra/launcher=joblib",
               "hydra.launcher.n_jobs=2", "threads=1", f"hydra.sweep.dir={tmp_path}")
    assert r.returncode == 2, r.stderr[-3000:]
    end = [x for x in r.stderr.splitlines() if x.startswith("error: 1 job of this multirun failed (")]
    assert len(end) == 1 and "model.depth=0" in end[0] and "model.depth=2" not in end[0], r.stderr[-3000:]
    status = {p.parent.name: json.loads(p.read_text())["status"] for p in tmp_path.glob("*/metrics.json")}
    assert status == {"model.depth=0": "failed", "model.depth=2": "done", "model.depth=3": "done"}
    assert "Joblib" in r.stdout + r.stderr  # the joblib launcher ran the jobs
    # the runner plans the folder names Hydra gave: Hydra's own overrides (the launcher's) are never part of them
    from highway_repro.runner.plan import job_names, plan

    cfg = plan("demo", "smoke", [])[0]
    grid = ["model.depth=0,2,3", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "threads=1"]
    assert set(job_names(cfg, [grid])) == set(status)


@pytest.mark.parametrize("preset,gpus", [("submitit_cluster", "null"), ("submitit_cluster_gpu", "1")])
def test_the_slurm_presets_compose_and_the_cpu_one_asks_for_no_gpu(preset, gpus):
    """A CPU cluster refuses a job that asks for a GPU (sbatch: "Invalid generic resource (gres) specification")."""
    r = _train(f"hydra/launcher={preset}", "--cfg", "hydra", "-p", "hydra.launcher", timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "hydra_submitit_launcher" in out and "SlurmLauncher" in out
    assert f"gpus_per_node: {gpus}" in out and "max_num_timeout: 3" in out, out
    from highway_repro.runner.slurm import preset as runner_preset  # the runner reads the same file

    assert str(runner_preset("cpu" if gpus == "null" else "gpu")["gpus_per_node"]).replace("None", "null") == gpus
