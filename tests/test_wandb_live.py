"""Runs trained with `logger=wandb` (offline, into tmp_path): one W&B run for a run folder, live or exported (the
same id, name, group, job type, tags, config and logged values), and the runner reports them as it reports any run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from conftest import REPO, compose, needs_mirror
from test_wandb_export import offline, read_offline_run, same

JOB = ["model.width=4", "seed=0"]  # hn_table1's smoke grid: one job
SETTING = ["sweep=hn_table1/smoke", "experiment=hn_table1", "scale=smoke", "resume=auto", "logger=wandb", "threads=1"]


def train_live(results):
    """hn_table1's smoke job trained with logger=wandb in the folder the runner keeps it in, its .hydra/overrides.yaml
    written first as the job's callback writes it; the run folder."""
    from highway_repro.train import run

    folder = results / "highway_networks" / "runs" / "hn_table1-smoke" / ",".join(sorted(JOB))
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(JOB + SETTING))
    run(compose(JOB + [o for o in SETTING if not o.startswith("sweep=")]), folder)
    return folder


@needs_mirror
def test_a_live_run_and_its_export_are_one_w_and_b_run(tmp_path, monkeypatch):
    """A run trained with logger=wandb, then its folder exported (`make wandb-export`'s code), read back from the two
    .wandb files: the same id, name, group, job type, tags (its table, scale and device: the dashboard's filter) and
    config, and the same value at every step of every key and in the summary."""
    from highway_repro.dashboards.export import export

    offline(monkeypatch, tmp_path)
    folder = train_live(tmp_path / "results")
    (live_dir,) = (folder / "wandb").glob("offline-run-*")
    live = read_offline_run(live_dir)
    out = tmp_path / "export"
    export(tmp_path / "results", out, jobs=1, folders=[folder])
    (entry,) = json.loads((out / "exported.json").read_text()).values()
    kept = read_offline_run(out / entry["run"])
    a, b = live["run"], kept["run"]
    assert (a.run_id, a.display_name, a.run_group, a.job_type) == (b.run_id, b.display_name, b.run_group, b.job_type)
    assert (b.display_name, b.run_group, b.job_type) == ("model.width=4,seed=0", "hn_table1", "train")
    assert sorted(a.tags) == sorted(b.tags) == ["device:cpu", "scale:smoke", "table:hn_table1"]
    assert live["config"] == kept["config"] and kept["config"]["row"] == "model.width=4"
    assert sorted(live["history"]) == sorted(kept["history"]) and len(live["history"]) > 2
    for step, values in kept["history"].items():
        assert values.keys() == live["history"][step].keys(), step
        assert all(same(live["history"][step][k], v) for k, v in values.items()), step
    final = {k: v for k, v in kept["summary"].items() if not k.startswith("_")}
    assert {k: v for k, v in live["summary"].items() if not k.startswith("_")}.keys() == final.keys()
    assert all(same(live["summary"][k], v) for k, v in final.items())


@needs_mirror
@pytest.mark.slow  # a table's four smoke runs and its report, twice: about 30 s on 2 cores
def test_the_runner_with_the_wandb_logger_reports_as_without_it(tmp_path):
    """`python -m highway_repro.runner demo logger=wandb` trains (through the grouped launcher, whose jobs are set up
    before any trains), reports every run and exits 0, W&B printing nothing; a later runner of the table (nothing
    left to train) and `--report-only` report it again."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path)}
    base = [sys.executable, "-m", "highway_repro.runner", "demo", "--scale", "smoke", "--runs", str(tmp_path / "runs"),
            "--results", str(tmp_path / "results")]
    for extra in (["logger=wandb", "threads=1", "--group", "auto"], ["logger=wandb", "threads=1"], ["--report-only"]):
        r = subprocess.run(base + extra, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "Traceback" not in r.stderr and "no runs under" not in r.stderr
        assert "wandb:" not in r.stdout + r.stderr
        md = (tmp_path / "results" / "demo" / "demo.md").read_text()
        for depth, kind in ((10, "plain"), (10, "highway"), (50, "plain"), (50, "highway")):
            assert f"| {depth} | {kind} |" in md
    assert len(list((tmp_path / "runs" / "demo-smoke").glob("*/wandb/offline-run-*"))) == 4
