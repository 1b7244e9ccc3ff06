"""Each Highway Networks make target end to end at scale=smoke: sweep (or run), then its report.

Subprocess pipelines: hn_cifar (a sweep and its table through the runner) runs in the default suite,
the others are slow tests."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from conftest import REPO, needs_mirror

# target -> (report file, lines the report must contain)
TARGETS = {
    "hn_fig1": ("highway_networks/fig1", ["| 4 | plain |", "| 4 | highway |", "| 4 | residual |"]),
    "hn_table1": ("highway_networks/table1", ["| 4 | highway |"]),
    "hn_cifar": ("highway_networks/cifar", ["| highway |", "| plain |"]),
    "hn_analysis": ("highway_networks/analysis", ["## What the figures show", "lesionable"]),
}


FAST = {"hn_cifar"}


@needs_mirror
@pytest.mark.parametrize("target", [t if t in FAST else pytest.param(t, marks=pytest.mark.slow)
                                    for t in sorted(TARGETS)])
def test_target_pipeline_smoke(target, tmp_path):
    out, expected = TARGETS[target]
    r = subprocess.run([sys.executable, "-m", "highway_repro.runner", target, "--scale", "smoke",
                        "--runs", str(tmp_path / "runs"), "--results", str(tmp_path / "results"), "threads=1"],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    md = (tmp_path / "results" / f"{out}.md").read_text()
    for line in expected:
        assert line in md, (line, md)
    assert "scale: smoke" in md and "wall time" in md
    scale_file = f"configs/experiment_scale/{target}/smoke.yaml"  # the recipe at this scale, verbatim, at the end
    assert f"<summary>{scale_file}</summary>" in md and (REPO / scale_file).read_text().rstrip() in md
    if target == "hn_analysis":
        for fig in ("heatmaps", "routing", "lesion"):
            assert (tmp_path / "results" / f"{out}_{fig}.png").stat().st_size > 1000
        # a fresh clone has no checkpoint: `make tables` rebuilds the same report from the kept files
        shutil.rmtree(tmp_path / "runs")
        (tmp_path / "results" / f"{out}.md").unlink()
        r = subprocess.run([sys.executable, "-m", "highway_repro.runner", target,
                            "--scale", "smoke", "--report-only",
                            "--runs", str(tmp_path / "runs"), "--results", str(tmp_path / "results")],
                           cwd=REPO, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        assert (tmp_path / "results" / f"{out}.md").read_text() == md
