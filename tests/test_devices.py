"""One device per comparison: runs made on a GPU at a scale made for CPUs are kept apart (`<table>-<scale>-gpu`),
and a table compares the runs of one device (`report.runs.one_device`), read from every kept run's run_info.json."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import REPO

from highway_repro.report.runs import device, load_run, one_device
from highway_repro.runner.keep import keep, table_runs
from highway_repro.targets import SCALES
from highway_repro.targets import REPORTS, TARGETS, kept_apart, runs_folder


def test_every_kept_run_sits_with_the_runs_of_its_device():
    """A cpu-scale table's folder holds CPU-made runs only; its `-gpu` folder GPU-made runs only."""
    checked = 0
    for folder in sorted((REPO / "results").glob("*/runs/*")):
        scale = folder.name.removesuffix("-gpu").rsplit("-", 1)[-1]
        if not kept_apart(scale):
            continue
        for run in sorted(p.parent for p in folder.glob("*/metrics.json")):
            on_gpu = bool(json.loads((run / "run_info.json").read_text()).get("cuda_device"))
            assert on_gpu == folder.name.endswith("-gpu"), run
            checked += 1
    assert checked > 600


def test_no_table_compares_runs_of_two_devices():
    """What each report compares (the runs `make tables` reads, after `one_device`) was made on one device; a
    table with runs of both leaves the fewer out and says so."""
    mixed = []
    for name in REPORTS:
        for scale in SCALES:
            runs = [r for part in TARGETS[name].parts or (name,)
                    for r in table_runs(part, scale, REPO / "runs" / "none", REPO / "results")]
            if not runs:
                continue
            compared, left_out = one_device(runs)
            assert len({device(r) for r in compared}) == 1, (name, scale)
            assert len(compared) >= len(left_out)
            mixed += [name] if left_out else []
    assert {"ht_placement_scan", "ht_enwik8_l12", "ht_word_ptb", "hn_table1"} <= set(mixed)


def _run(folder: Path, cuda: str | None) -> Path:
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"status": "done", "test/loss": 1.0}))
    (folder / "run_info.json").write_text(json.dumps({"cuda_device": cuda, "threads": 1}))
    return folder


def test_the_runner_keeps_a_gpu_made_run_apart_and_the_report_leaves_it_out(tmp_path):
    sweep, kept, apart = tmp_path / "sweep", tmp_path / "kept", tmp_path / "kept-gpu"
    _run(sweep / "seed=0", None)
    _run(sweep / "seed=1", "NVIDIA H200")
    keep(sweep, kept, apart=apart)
    assert [p.name for p in kept.iterdir()] == ["seed=0"] and [p.name for p in apart.iterdir()] == ["seed=1"]
    runs = [load_run(kept / "seed=0"), load_run(apart / "seed=1"), load_run(_run(tmp_path / "x" / "seed=2", None))]
    compared, left_out = one_device(runs)
    assert [r.path.name for r in compared] == ["seed=0", "seed=2"] and [r.path.name for r in left_out] == ["seed=1"]
    assert one_device(runs[1:2]) == ([runs[1]], [])  # a table made on a GPU only compares its GPU runs
    assert runs_folder("hn_table1", "cpu", apart=True).endswith("runs/hn_table1-cpu-gpu") and not kept_apart("paper")
