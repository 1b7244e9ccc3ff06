"""Runs trained with `logger=wandb` (offline, into tmp_path): the runner reports them as it reports any run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO, needs_mirror


@needs_mirror
@pytest.mark.slow  # a table's four smoke runs and its report, twice: about 30 s on 2 cores
def test_the_runner_with_the_wandb_logger_reports_as_without_it(tmp_path):
    """`python -m highway_repro.runner demo logger=wandb` trains, reports every run and exits 0; a later runner of
    the table (nothing left to train) and `--report-only` report it again."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path)}
    base = [sys.executable, "-m", "highway_repro.runner", "demo", "--scale", "smoke", "--runs", str(tmp_path / "runs"),
            "--results", str(tmp_path / "results")]
    for extra in (["logger=wandb", "threads=1"], ["logger=wandb", "threads=1"], ["--report-only"]):
        r = subprocess.run(base + extra, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "Traceback" not in r.stderr and "no runs under" not in r.stderr
        md = (tmp_path / "results" / "demo" / "demo.md").read_text()
        for depth, kind in ((10, "plain"), (10, "highway"), (50, "plain"), (50, "highway")):
            assert f"| {depth} | {kind} |" in md
    assert len(list((tmp_path / "runs" / "demo-smoke").glob("*/wandb/offline-run-*"))) == 4
