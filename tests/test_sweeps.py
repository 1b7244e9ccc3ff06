"""One grid, in Hydra: a table's sweep files are its whole grid. `python -m highway_repro.train -m
sweep=<table>/<file> scale=<scale>` runs each file's jobs, and the runner (`make reproduce-<table>`) plans the union of
the same jobs, under the folder names of the runs kept in results/."""

from __future__ import annotations

import itertools
import json
import os
import sys

import pytest

from conftest import REPO

SCALES = sorted(p.stem for p in (REPO / "configs" / "scale").glob("*.yaml"))


def _hydra_jobs(sweep: str, scale: str) -> list[str]:
    """The folder names of the jobs `train -m sweep=<sweep> scale=<scale>` launches, computed from Hydra alone:
    the composed config's `hydra.sweeper.params`, each value list from Hydra's override parser, their Cartesian
    product in the basic sweeper's order, each job named by `override_dirname` (sorted, excluded keys left out)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    import highway_repro.train  # noqa: F401  (the `hp` resolver)

    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=[f"sweep={sweep}", f"scale={scale}"], return_hydra_config=True)
    exclude = set(cfg.hydra.job.config.override_dirname.exclude_keys)
    parser = OverridesParser.create()
    axes = []
    for key, value in cfg.hydra.sweeper.params.items():
        o = parser.parse_override(f"{key}={value}")
        axes.append([f"{key}={v}" for v in (o.sweep_string_iterator() if o.is_sweep_override() else [o.value()])])
    return [",".join(sorted(o for o in job if o.split("=", 1)[0] not in exclude)) for job in itertools.product(*axes)]


def _tables() -> list[str]:
    from highway_repro.targets import TARGETS

    return [n for n, t in TARGETS.items() if t.sweep and not t.parts]


@pytest.mark.parametrize("name", _tables())
def test_train_m_and_the_runner_run_the_same_grid(name):
    """For every table and scale, the union of the jobs Hydra launches for the table's sweep files is the runner's
    plan, each run once; the files choose the table's own experiment (no `experiment=` needed)."""
    from highway_repro.runner.plan import plan

    for scale in SCALES:
        files = [p.stem for p in (REPO / "configs" / "sweep" / name).glob(f"{scale}*.yaml")]
        assert f"{scale}" in files, (name, scale, files)
        hydra = [j for f in files for j in _hydra_jobs(f"{name}/{f}", scale)]
        runner = plan(name, scale, [])[2]
        assert len(runner) == len(set(runner)) and set(runner) == set(hydra), (name, scale, set(runner) ^ set(hydra))


def test_the_grid_keeps_every_kept_run_and_the_planned_names():
    """No kept run is orphaned: at the cpu scale every kept run folder of every table is in the runner's plan, and
    the plan names the same runs as it did when the grids were read from the scale files (their `extra_grids`),
    pinned in tests/grid_names_cpu.json."""
    from highway_repro.runner.plan import plan
    from highway_repro.targets import runs_folder

    pinned = json.loads((REPO / "tests" / "grid_names_cpu.json").read_text())
    assert set(pinned) == set(_tables())
    for name, names in pinned.items():
        planned = plan(name, "cpu", [])[2]
        assert sorted(planned) == names, name
        kept = [p.parent.name for apart in (False, True)  # the runs made on a GPU are kept apart
                for p in (REPO / "results" / runs_folder(name, "cpu", apart)).glob("*/metrics.json")]
        assert set(kept) <= set(planned), (name, sorted(set(kept) - set(planned)))
        assert kept or name in ("demo",), name  # the check reads real folders


def test_jobs_are_the_product_of_each_keys_values_as_hydras_basic_sweeper_makes_them():
    """`grids.jobs_of` expands a grid as Hydra's basic sweeper does, from Hydra's public override parser: the
    product of each key's values in order, a later override of a key in the earlier one's place (the command line
    over a sweep file), `range(a,b)` expanded, `+`-keys kept; an interval is no grid."""
    from highway_repro.grids import jobs_of

    assert jobs_of(["a=1,2", "b=x,y"]) == [["a=1", "b=x"], ["a=1", "b=y"], ["a=2", "b=x"], ["a=2", "b=y"]]
    assert jobs_of(["variant=a,b", "seed=range(0,2)", "+x=1", "variant=c"]) == [
        ["variant=c", "seed=0", "+x=1"], ["variant=c", "seed=1", "+x=1"]]
    with pytest.raises(ValueError, match=r"^lr: an interval sweep is not a grid"):
        jobs_of(["lr=interval(0,1)"])


def test_a_sweep_file_for_a_missing_scale_is_named():
    from highway_repro.errors import ConfigError
    from highway_repro.runner.plan import table_files

    with pytest.raises(ConfigError, match=r"sweep=ht_char_ptb/gpu: no file configs/sweep/ht_char_ptb/gpu.yaml "
                                          r"\(valid: cpu, cpu-extra_seeds, paper, smoke\)"):
        table_files("ht_char_ptb", "gpu")


def test_each_job_gets_its_own_gpu(tmp_path, monkeypatch):
    """`--jobs N` on a machine with several CUDA GPUs: each running job sees one GPU of its own
    (CUDA_VISIBLE_DEVICES), the GPU that the fewest running jobs hold; one job, or one GPU, sets nothing."""
    from highway_repro.runner import queue
    from highway_repro.runner.table import TablePlan

    def cmd(k):
        code = (f"import os, pathlib, time; time.sleep(0.6); pathlib.Path({str(tmp_path)!r}, 'job{k}')"
                ".write_text(os.environ.get('CUDA_VISIBLE_DEVICES', 'all'))")
        return [sys.executable, "-c", code]

    def devices(jobs):
        for f in tmp_path.glob("job*"):
            f.unlink()
        p = TablePlan("t", tmp_path / "runs", tmp_path / "kept", False, False, "make t",
                      commands=[cmd(k) for k in range(4)])
        assert queue.run_queue([p], jobs=jobs) == 0
        return [(tmp_path / f"job{k}").read_text() for k in range(4)]

    monkeypatch.setattr(queue, "gpu_ids", lambda: ["0", "1"])
    got = devices(2)
    assert sorted(got[:2]) == ["0", "1"] and sorted(got[2:]) == ["0", "1"], got  # two at a time, one GPU each
    assert devices(1) == ["all"] * 4  # one job: it sees every GPU, as it would alone
    monkeypatch.setattr(queue, "gpu_ids", lambda: ["0"])
    assert devices(2) == ["all"] * 4
    assert queue.pick_gpu(["0", "1", "2"], ["0", "2"]) == "1" and queue.pick_gpu(["0", "1"], ["0", "1", "0"]) == "1"


def test_the_gpus_come_from_cuda_visible_devices_where_set(monkeypatch):
    from highway_repro.runner.queue import gpu_ids

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert gpu_ids() == ["2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu_ids() == []
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("PATH", os.devnull)  # no nvidia-smi
    assert gpu_ids() == []
