"""Hydra launchers: a joblib multirun of two smoke jobs, and the SLURM (submitit) launcher config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

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


def test_jobs_caps_every_job_in_flight_across_the_arrays_and_tables(tmp_path, monkeypatch):
    """On SLURM `--jobs` is the cap on all of a runner's jobs in flight: the arrays it submits (split at MaxArraySize,
    one or more per table, and a lost job's new one) each hold their lane's share of `--jobs` (`%share`), and the
    arrays of a lane go one after another (`afterany` on the one before): the shares of the lanes sum to at most
    `--jobs`. Rendered by a stand-in for submitit's executor; no SLURM needed."""
    import submitit

    from highway_repro.runner import slurm

    out = {"sinfo": "test\n", "scontrol": "MaxArraySize = 4\n", "squeue": ""}
    monkeypatch.setattr(slurm, "_slurm", lambda *cmd: out[cmd[0]])
    arrays = []

    class Executor:
        def __init__(self, **kw):
            self.kw = {}

        def update_parameters(self, **kw):
            self.kw = kw

        def submit_array(self, fns):
            arrays.append({**self.kw, "size": len(fns), "id": str(100 + len(arrays))})
            return [type("J", (), {"job_id": f"{arrays[-1]['id']}_{i}"})() for i in range(len(fns))]

    monkeypatch.setattr(submitit, "AutoExecutor", Executor)

    class Plan:
        threads, peak_gb = 1, 1.0

        def __init__(self, name):
            self.name = name

    def in_flight(arrays):
        """The most jobs that may run at once: each chain of arrays (one waiting for the other) runs one at a time."""
        waits = {a["id"]: a["slurm_additional_parameters"].get("dependency", "").removeprefix("afterany:")
                 for a in arrays}
        heads = [a for a in arrays if not waits[a["id"]]]
        chains = [[h] for h in heads]
        for chain in chains:
            while nxt := [a for a in arrays if waits[a["id"]] == chain[-1]["id"]]:
                assert len(nxt) == 1
                chain.append(nxt[0])
        assert sum(len(c) for c in chains) == len(arrays)
        return sum(max(a["slurm_array_parallelism"] for a in c) for c in chains)

    for jobs, sizes in [(3, [10]), (2, [5]), (10, [10, 3]), (2, [6, 6, 1]), (1, [9]), (50, [9])]:
        arrays.clear()
        cluster = slurm.Cluster("test", "cpu", tmp_path / f"s{jobs}", jobs)
        tables = [(Plan(f"t{k}"), [([f"cmd{k}-{i}"], None) for i in range(n)]) for k, n in enumerate(sizes)]
        got = cluster.submit(tables)
        assert [a["size"] for a in arrays] == [min(4, n - i) for n in sizes for i in range(0, n, 4)]
        assert len(got) == sum(sizes) and in_flight(arrays) <= jobs, (jobs, sizes, arrays)
        assert in_flight(arrays) >= min(jobs, len(arrays)), (jobs, sizes, arrays)  # each lane busy
        out["squeue"] = "".join(f"{a['id']}_0 RUNNING\n" for a in arrays)  # a lost job's new one joins a lane
        cluster.submit([(tables[0][0], [(["again"], None)])], tries=1)
        assert in_flight(arrays) <= jobs, (jobs, sizes, arrays)
        out["squeue"] = ""


def test_a_job_is_lost_only_when_two_readings_of_squeue_in_a_row_miss_it(tmp_path, monkeypatch):
    """A followed SLURM job with no result is taken for lost (and submitted again by the queue) only once two
    readings of squeue in a row miss it: a job missed by one reading, between two states (a requeue under way), is
    not. squeue's answers are set here; no SLURM needed."""
    from highway_repro.runner import slurm

    answers = {"sinfo": ["test\n"], "scontrol": ["MaxArraySize = 1001\n"]}
    monkeypatch.setattr(slurm, "_slurm", lambda *cmd: answers[cmd[0]].pop(0) if len(answers[cmd[0]]) > 1
                        else answers[cmd[0]][0])
    monkeypatch.setattr(slurm, "LOST_CHECK_S", 0.0)  # squeue asked at every poll
    cluster = slurm.Cluster("test", "cpu", tmp_path, 1)
    submitted = type("J", (), {"job_id": "7_0", "paths": type("P", (), {"result_pickle": tmp_path / "no.pkl"})()})()
    job = slurm.Job(cluster, submitted, ["cmd"], None, 10)
    answers["squeue"] = ["", "7_0 PENDING\n", "", "7_0 REQUEUED\n", "", "", "7_0 RUNNING\n"]
    polls = []
    for _ in range(6):
        time.sleep(0.002)
        polls.append(job.poll())
    assert polls == [None] * 5 + [1] and job.lost, polls  # missing, back, missing, back, missing, missing: lost


def test_a_runner_stopped_by_an_error_leaves_its_slurm_jobs_to_the_same_command(tmp_path):
    """An error that ends the runner (here a squeue that fails) cancels none of its SLURM jobs: they go on, and the
    same command re-attaches (the local queue, by contrast, stops its trainers)."""
    from highway_repro.errors import ConfigError
    from highway_repro.runner.queue import run_queue
    from highway_repro.runner.table import TablePlan

    cancelled = []

    class Job:
        pid, tries, cmd, secs = "slurm job 7_0", 0, ["cmd"], None

        def poll(self):
            raise ConfigError("cluster slurm: squeue failed: slurm_load_jobs error: Socket timed out")

    class Cluster:
        detach = False

        def submit(self, tables, tries=0):
            return [(plan, job) for plan, items in tables for _ in items]

        def cancel(self, jobs):
            cancelled.extend(jobs)

        def line(self):
            return ""

    job = Job()
    job.cluster = Cluster()
    plan = TablePlan("t", tmp_path / "sweep", tmp_path / "kept", False, False, "make t", commands=[["cmd"]])
    with pytest.raises(ConfigError, match="squeue failed"):
        run_queue([plan], 1, cluster=job.cluster)
    assert cancelled == []
