"""A table's grid lives in config files: every experiment has every scale, every variant composes, the runner
expands the files into the jobs Hydra runs, and finished runs are kept and restored (highway_repro/runner/)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from conftest import CONFIG_DIR, EXPERIMENTS, REPO, SCALES, compose, load_script, needs_mirror

VARIANTS = sorted(p.stem for p in (CONFIG_DIR / "variant").glob("*.yaml"))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_has_every_scale(experiment):
    have = sorted(p.stem for p in (CONFIG_DIR / "experiment_scale" / experiment).glob("*.yaml"))
    assert have == sorted(SCALES), f"configs/experiment_scale/{experiment}/ has {have}, want {sorted(SCALES)}"


def test_every_scale_of_the_root_config_is_a_scale():
    """The root config's default scale is one of configs/scale/, and every scale composes with its name."""
    import yaml

    defaults = yaml.safe_load((CONFIG_DIR / "train.yaml").read_text())["defaults"]
    default = next(d["scale"] for d in defaults if isinstance(d, dict) and "scale" in d)
    assert default in SCALES and set(SCALES) >= {"paper", "cpu", "smoke"}
    for scale in SCALES:
        assert compose(["experiment=demo", f"scale={scale}"]).scale_name == scale


def test_a_missing_scale_file_is_an_error(tmp_path):
    from highway_repro.train.config import ConfigError, check_scale_file

    check_scale_file(CONFIG_DIR, "hn_fig1", "cpu")
    check_scale_file(CONFIG_DIR, None, "cpu")  # runs without an experiment compose as before
    with pytest.raises(ConfigError,
                       match=r"scale=cpux is not allowed for experiment=hn_fig1 \(valid: cpu, paper, smoke"):
        check_scale_file(CONFIG_DIR, "hn_fig1", "cpux")


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_file_names_itself_and_sets_the_gate(variant):
    """Each variant file sets its own name, a label and a gate kind of the registry (none only for the baselines),
    and the composed config keeps that gate kind."""
    import yaml

    from highway_repro.models.placement import GATE_KINDS

    own = yaml.safe_load((CONFIG_DIR / "variant" / f"{variant}.yaml").read_text())
    assert own["variant"] == variant and own["variant_label"]
    kind = own["model"]["gate_kind"]
    assert kind in GATE_KINDS and (kind == "none") == variant.startswith("baseline"), (variant, kind)
    assert compose(["experiment=ht_enwik8_l6", "scale=smoke", f"variant={variant}"]).model.gate_kind == kind


def test_every_swept_variant_exists():
    """Every row a sweep file lists (`hydra.sweeper.params.variant`) is a file configs/variant/<row>.yaml."""
    files = sorted((CONFIG_DIR / "sweep").glob("*/*.yaml"))
    assert len(files) >= 30
    swept = 0
    for f in files:
        params = (yaml.safe_load(f.read_text()).get("hydra") or {}).get("sweeper", {}).get("params") or {}
        rows = params.get("variant")
        for v in str(rows).split(",") if rows else []:
            assert v.strip() in VARIANTS, (f.relative_to(CONFIG_DIR), v)
            swept += 1
    assert swept >= 100, swept


def test_grid_of_enwik8_l6_at_cpu_scale():
    """Two seeds for every row, five for the rows a paper claim compares, from the files."""
    from highway_repro.runner.plan import plan

    _, grids, names = plan("ht_enwik8_l6", "cpu", [])
    assert len(grids) == 2 and len(names) == 8 * 2 + 6 * 3 == len(set(names))
    assert "seed=4,variant=tanh_l3_6" in names and "seed=2,variant=gated_attn" not in names
    # a command-line override replaces the grid's value of the same key in every grid
    _, _, names = plan("ht_enwik8_l6", "cpu", ["variant=baseline"])
    assert names == [f"seed={s},variant=baseline" for s in range(5)]
    # where a run trains and how often it writes checkpoints do not name it: a run made on a GPU keeps its folder
    assert plan("ht_enwik8_l6", "cpu", ["variant=baseline", "trainer.device=cuda",
                                                 "trainer.checkpoint_every=100"])[2] == names
    _, _, names = plan("hn_fig1", "smoke", [])
    assert names == ["model.depth=4,model.kind=plain,trial=0", "model.depth=4,model.kind=highway,trial=0",
                     "model.depth=4,model.kind=residual,trial=0"]


def test_a_folder_name_reads_back_as_the_overrides_that_named_it():
    """`dirname_items` inverts `dirname` where a value holds commas and a key holds `@`, `/` or a leading `+`."""
    from highway_repro.grids import cell_of, dirname, dirname_items

    job = ["model.sizes=[1,2,3]", "+data@extra/part=a,b", "seed=0", "name=x", "hydra.launcher.size=4"]
    name = dirname(job, ["name"])
    assert name == "+data@extra/part=a,b,model.sizes=[1,2,3],seed=0"
    assert dirname_items(name) == ["+data@extra/part=a,b", "model.sizes=[1,2,3]", "seed=0"]
    assert cell_of(name) == "+data@extra/part=a,b,model.sizes=[1,2,3]"  # the cell a run repeats


def test_paper_claim_rows_have_five_seeds_at_cpu_scale():
    """Every row that a paper claim compares (report/papers.PAPER_CLAIMS) runs at least 5 seeds at the cpu scale
    (a random search: its trials); every other row at least 2."""
    from collections import Counter

    from highway_repro.report.papers import PAPER_CLAIMS
    from highway_repro.runner.plan import override_key, plan

    def cells(table):
        out = Counter()
        for n in plan(table, "cpu", [])[2]:
            parts = dict(p.split("=", 1) for p in n.split(","))
            out[tuple(v for k, v in sorted(parts.items()) if override_key(k) not in ("seed", "trial"))] += 1
        return out

    tables = {c.table for c in PAPER_CLAIMS} - {"ht_paper_anchor"}  # the anchor: paper size, its own seed count
    for table in sorted(tables):
        n = cells(table)
        assert min(n.values()) >= 2, (table, n)
        for c in (c for c in PAPER_CLAIMS if c.table == table):
            for side in (c.row, c.against) if isinstance(c.against, tuple) else (c.row,):
                for row in ((r,) for r in side) if len(side) > 1 and table == "ht_placement_scan" else (side,):
                    want = {k for k in n if set(row) <= set(k) or set(k) <= set(row)}
                    assert want and all(n[k] >= 5 for k in want), (table, row, {k: n[k] for k in want})


def _fake_run(folder, status="done", wall=10.0, cpu=None, info=None):
    folder.mkdir(parents=True)
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "overrides.yaml").write_text("- seed=0\n")
    times = {"time/wall_s": wall, **({"time/cpu_s": cpu} if cpu is not None else {})}
    (folder / "metrics.json").write_text(json.dumps({"status": status, **times}))
    if info is not None:
        (folder / "run_info.json").write_text(json.dumps(info))
    (folder / "metrics.jsonl").write_text('{"step": 0}\n')
    (folder / "config_resolved.yaml").write_text("seed: 0\n")
    (folder / "ckpt").mkdir()
    (folder / "ckpt" / "last.pt").write_bytes(b"weights")


def test_finished_runs_are_kept_without_checkpoints_and_restored(tmp_path):
    from highway_repro.runner.keep import keep, restore

    sweep, kept = tmp_path / "sweep", tmp_path / "results" / "runs"
    _fake_run(sweep / "seed=0", "done")
    _fake_run(sweep / "seed=1", "diverged")
    _fake_run(sweep / "seed=2", "failed")
    _fake_run(sweep / "seed=3", "running")
    assert keep(sweep, kept) == 2 * 4  # the fake runs have no run_info.json
    assert sorted(p.name for p in kept.iterdir()) == ["seed=0", "seed=1"]
    assert not list(kept.rglob("*.pt")) and (kept / "seed=0" / ".hydra" / "overrides.yaml").exists()
    assert keep(sweep, kept) == 0  # unchanged files are not written again
    fresh = tmp_path / "fresh_sweep"
    assert restore(kept, fresh, dry=True) == ["seed=0", "seed=1"] and not fresh.exists()  # an estimate copies nothing
    assert restore(kept, fresh) == ["seed=0", "seed=1"]
    assert json.loads((fresh / "seed=1" / "metrics.json").read_text())["status"] == "diverged"
    assert restore(kept, fresh) == []  # a finished run in the sweep folder is left alone


def test_a_single_run_table_restores_its_kept_run_and_is_not_trained_again(tmp_path):
    """The gate analyses' run is kept as <kept>/run and restored into the sweep folder itself: the table counts it
    done (its findings are kept, so the report needs no weights), and its report reads it once, not twice."""
    from highway_repro.runner.keep import table_runs, keep, restore

    sweep, results = tmp_path / "runs" / "hn_analysis-cpu", tmp_path / "results"
    kept = results / "highway_networks" / "runs" / "hn_analysis-cpu"
    _fake_run(sweep, "done")
    keep(sweep, kept, single=True)
    assert (kept / "run" / "metrics.json").exists() and not (kept / "run" / "ckpt").exists()
    fresh = tmp_path / "fresh" / "hn_analysis-cpu"
    assert restore(kept, fresh, single=True, dry=True) == ["run"] and not fresh.exists()
    assert restore(kept, fresh, single=True) == ["run"] and json.loads((fresh / "metrics.json").read_text())
    assert restore(kept, fresh, single=True) == []  # finished there already
    assert len(table_runs("hn_analysis", "cpu", tmp_path / "runs", results)) == 1


def test_a_run_is_priced_by_its_cells_kept_runs_on_its_device_else_the_scale_file(tmp_path):
    """The one cost rule: a run takes the mean of its grid cell's kept runs made on the device it goes to, else the
    scale file's est_step_s x max_steps; a cell's cost is not another cell's (a depth-100 net against a depth-10
    one); a diverged run counts with what it cost, a failed one not at all."""
    from omegaconf import OmegaConf

    from highway_repro.runner.estimate import per_run_s

    cfg = OmegaConf.create({"est_step_s": 0.5, "trainer": {"max_steps": 100, "device": "cpu"}})
    kept = tmp_path / "kept"
    _fake_run(kept / "model.depth=10,trial=0", wall=60.0)
    _fake_run(kept / "model.depth=10,trial=1", wall=120.0)
    _fake_run(kept / "model.depth=100,trial=0", wall=600.0)
    _fake_run(kept / "model.depth=100,trial=1", "diverged", wall=2.0)
    _fake_run(kept / "model.depth=100,trial=3", "failed", wall=5.0)
    _fake_run(kept / "model.depth=50,trial=1", wall=1.0, info={"threads": 1, "cuda_device": "NVIDIA H200"})
    todo = ["model.depth=10,trial=2", "model.depth=100,trial=2", "model.depth=50,trial=0"]
    secs, how = per_run_s(todo, sorted(kept.iterdir()), cfg)
    assert secs == [90.0, 301.0, 50.0] and "2 from their cells' kept runs" in how and "x 100 steps" in how, how
    gpu = OmegaConf.merge(cfg, {"trainer": {"device": "cuda"}})  # the GPU run prices runs that go to a GPU only
    assert per_run_s(todo, sorted(kept.iterdir()), gpu)[0] == [50.0, 50.0, 1.0]
    assert per_run_s(todo, [], OmegaConf.create({"trainer": {"max_steps": 1}}))[0] == [None] * 3


def test_overrides_that_change_the_recipe_neither_restore_nor_price_by_the_kept_runs(tmp_path, capsys):
    """`reproduce hn_table1 trainer.max_steps=10`: other jobs than the kept runs (the override is in their folder
    names), so none is restored or counted, and they are priced at est_step_s x 10 steps."""
    from highway_repro.runner.table import plan_table

    results = tmp_path / "results"
    kept = results / "highway_networks" / "runs" / "hn_table1-cpu"
    _fake_run(kept / "model.width=16,seed=0", wall=3000.0)
    p = plan_table("hn_table1", "cpu", 1, ["trainer.max_steps=10"], tmp_path / "runs", results, estimate_only=True)
    out = capsys.readouterr().out
    assert "10 runs, 0 finished (0 restored from" in out and len(p.todo) == 10 and "x 10 steps" in out, out
    plan_table("hn_table1", "cpu", 1, ["seed=0"], tmp_path / "runs", results, estimate_only=True)  # the same recipe
    assert "2 runs, 1 finished (1 restored from" in capsys.readouterr().out


def test_the_plan_prices_what_is_left_and_the_whole_table_with_its_margin(tmp_path, capsys):
    """Half a table kept: the cells with no kept run at est_step_s x max_steps (hn_table1 cpu: 0.2 x 12,600 =
    2,520 s), the others at their kept runs' mean; the line states the margin across machines and prices the whole
    table beside (what --fresh would train: 10 runs, the kept one's cell at 30 s)."""
    from highway_repro.runner.estimate import MARGIN
    from highway_repro.runner.table import plan_table

    results = tmp_path / "results"
    _fake_run(results / "highway_networks" / "runs" / "hn_table1-cpu" / "model.width=16,seed=0", wall=30.0)
    p = plan_table("hn_table1", "cpu", 2, [], tmp_path / "runs", results, estimate_only=True)
    assert p.secs == [2520.0] * 5 + [30.0] * 4, p.secs  # width 32 (no kept run) first, then width 16's seeds 1-4
    out = capsys.readouterr().out
    assert f"± {MARGIN * 100:.0f} % across machines" in out and "5 at est_step_s 0.2 x 12600 steps" in out, out
    assert "the whole table: 10 x" in out and f"= {(5 * 2520 + 5 * 30) / 3600:.1f} CPU-hours" in out, out


def test_launcher_overrides_neither_name_a_run_nor_change_its_recipe(tmp_path, capsys):
    """hydra/launcher=... and hydra.launcher.* are Hydra's own overrides, never in a folder name: the kept runs are
    restored and price the plan whatever launcher is named."""
    from highway_repro.runner.table import plan_table

    results = tmp_path / "results"
    kept = results / "highway_networks" / "runs" / "hn_table1-cpu"
    _fake_run(kept / "model.width=16,seed=0", wall=30.0)
    extra = ["hydra/launcher=submitit_cluster", "hydra.launcher.partition=p", "seed=0"]
    p = plan_table("hn_table1", "cpu", 1, extra, tmp_path / "runs", results, estimate_only=True)
    assert "2 runs, 1 finished (1 restored from" in capsys.readouterr().out and p.todo == ["model.width=32,seed=0"]


def test_no_slurm_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "highway_repro.runner", "hn_table1", "--scale", "smoke", "--cluster",
                        "slurm", "--partition", "p", "--runs", str(tmp_path / "runs"), "--results",
                        str(tmp_path / "results")], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PATH": str(tmp_path)})  # no sinfo, no sbatch
    assert r.returncode == 2 and r.stderr.startswith("error: cluster slurm: no SLURM"), r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


def test_a_grouped_run_is_priced_at_the_share_it_logged(tmp_path):
    """A kept run trained in a group logged its share of the group's time, which prices its cell."""
    from highway_repro.runner.table import plan_table

    results = tmp_path / "results"
    kept = results / "highway_networks" / "runs" / "hn_fig1-cpu"
    for trial in range(2):
        _fake_run(kept / f"model.depth=10,model.kind=plain,trial={trial}", wall=100.0, cpu=100.0,
                  info={"threads": 1, "group": {"size": 8}})
    p = plan_table("hn_fig1", "cpu", 1, [], tmp_path / "runs", results, group="auto")
    cell = [s for n, s in zip(p.todo, p.secs) if n.startswith("model.depth=10,model.kind=plain,")]
    assert cell and set(cell) == {100.0}, cell


def test_kept_runs_are_priced_by_their_cpu_time_per_thread(tmp_path):
    """A CPU run's price is its CPU time / its threads, not its wall time, which a machine shared with other work
    inflates (the L6 run that took 2,197 s of wall time beside a third process used 1,720 CPU-s); a GPU run's
    CPU time says nothing of its GPU time: its wall time."""
    from highway_repro.runner.estimate import run_seconds

    _fake_run(tmp_path / "shared", wall=2197.0, cpu=1720.0, info={"threads": 1})
    _fake_run(tmp_path / "four", wall=100.0, cpu=360.0, info={"threads": 4})
    _fake_run(tmp_path / "gpu", wall=50.0, cpu=48.0, info={"threads": 1, "cuda_device": "NVIDIA H200"})
    _fake_run(tmp_path / "old", wall=30.0)  # no CPU time recorded
    runs = [tmp_path / n for n in ("shared", "four", "gpu", "old")]
    assert run_seconds(runs) == [1720.0, 90.0, 50.0, 30.0]
    assert run_seconds(runs, gpu=False) == [1720.0, 90.0, 30.0] and run_seconds(runs, gpu=True) == [50.0]


def test_a_time_limit_is_the_estimate_with_its_margin(tmp_path):
    from highway_repro.runner.estimate import MARGIN, time_limit_min

    assert time_limit_min(3600.0) == 60 * (1 + MARGIN) + 5 and time_limit_min(7200.0, threads=2) == 80
    assert time_limit_min(None, default=30) == 30


def test_the_eta_follows_wall_time_and_ticks_keep_finished_runs(tmp_path, monkeypatch):
    """Before a run of this command finishes: the plan's wall time less the time gone; then the pace of the runs
    it finished (not of those done before it started)."""
    from highway_repro.runner import progress
    from highway_repro.runner.keep import keep

    sweep, kept = tmp_path / "sweep", tmp_path / "kept"
    _fake_run(sweep / "a", "done", wall=100.0)  # finished before this command: not its pace
    names = ["a", "b", "c", "d"]
    now = [1000.0]
    monkeypatch.setattr(progress.time, "time", lambda: now[0])
    p = progress.Progress("t", sweep, names, planned=600.0, on_tick=lambda: keep(sweep, kept))
    p.started = 1000.0
    now[0] = 1120.0
    assert "1/4 runs done, 3 to go; ETA 8.0 min" in p.line()
    now[0] = 1900.0
    assert "ETA 0 s" in p.line() or "ETA 0.0" in p.line(), p.line()
    _fake_run(sweep / "b", "done", wall=5.0)  # one run of this command in 900 s: 2 left, 30 min
    assert "2/4 runs done, 2 to go; ETA 30.0 min" in p.line(), p.line()
    p.on_tick()
    assert (kept / "a" / "metrics.json").exists() and (kept / "b" / "metrics.json").exists()
    assert "ETA unknown" in progress.Progress("t", sweep, names).line()
    single = progress.Progress("t", sweep / "b", ["run"], sweep=False)
    assert "1/1 runs done, 0 to go; finished" in single.line()


def test_a_queue_of_tables_has_one_line_for_all_their_runs(tmp_path):
    """Tables in one queue: the queue's line counts every table's runs and its ETA is the plans' wall time summed."""
    from types import SimpleNamespace

    from highway_repro.runner.progress import Progress, queue_line

    _fake_run(tmp_path / "a" / "x", "done", wall=100.0)
    plans = [SimpleNamespace(progress=Progress("a", tmp_path / "a", ["x", "y", "z"], planned=60.0)),
             SimpleNamespace(progress=Progress("b", tmp_path / "b", ["u", "v"], planned=120.0))]
    assert "[queue of 2 tables] 1/5 runs done, 4 to go; ETA 3.0 min" in queue_line(plans)


def test_wall_time_counts_rounds_of_jobs():
    from highway_repro.runner.estimate import wall_s

    assert wall_s([60.0] * 5, 2) == 180.0  # 3 rounds, not 2.5
    assert wall_s([100.0, 10.0, 10.0, 10.0], 2) == 100.0  # the short runs share the second job
    assert wall_s([30.0, 20.0], 1) == 50.0 and wall_s([30.0], 4) == 30.0 and wall_s([], 2) == 0.0


def _marker_cmd(folder, marker, seconds, rc=0):
    """A command that writes <marker>.start, sleeps, writes <marker>.end and exits with `rc`."""
    code = (f"import pathlib, sys, time; p = pathlib.Path({str(folder / marker)!r}); "
            f"p.with_suffix('.start').touch(); time.sleep({seconds}); p.with_suffix('.end').touch(); sys.exit({rc})")
    return [sys.executable, "-c", code]


def _plan(tmp_path, name, commands):
    from highway_repro.runner.table import TablePlan

    return TablePlan(name, tmp_path / "runs" / name, tmp_path / "kept" / name, False, False, f"make {name}",
                     commands=commands)


def test_the_queue_runs_the_next_table_while_the_last_runs_of_one_end(tmp_path):
    """`reproduce --all --jobs 2`: a job that frees up takes the next table's run (one table after another left a
    core idle at each table's odd last run); never more than `jobs` at once; a failed command stops nothing else;
    each table is kept and recorded when its last command ends, with its own first-start-to-last-end time."""
    from highway_repro.runner.queue import run_queue

    def t(m, end):
        return (tmp_path / f"{m}.{end}").stat().st_mtime

    a = _plan(tmp_path, "a", [_marker_cmd(tmp_path, "a1", 0.3), _marker_cmd(tmp_path, "a2", 0.3, rc=3),
                              _marker_cmd(tmp_path, "a3", 3)])
    b = _plan(tmp_path, "b", [_marker_cmd(tmp_path, "b1", 0.2)])
    ended = []
    assert run_queue([a, b], jobs=2, on_table_end=lambda p: ended.append(p.name)) == 3
    assert all((tmp_path / f"{m}.end").exists() for m in ("a1", "a2", "a3", "b1"))  # a2 failed: the rest ran
    assert t("b1", "start") < t("a3", "end")  # b ran beside a3
    assert t("a3", "start") >= min(t("a1", "end"), t("a2", "end"))  # a third one waited for a free job
    assert t("b1", "start") >= min(t("a1", "end"), t("a2", "end"))
    assert ended == ["b", "a"]
    rec_a, rec_b = (json.loads((tmp_path / "kept" / n / "reproduce.json").read_text()) for n in "ab")
    assert rec_a["commands"] == ["make a"] and rec_a["wall_s"] >= 3.0
    assert rec_b["wall_s"] < rec_a["wall_s"] - 1.0 and len(rec_b["intervals"]) == 1  # b's own start and end


def test_the_record_holds_the_time_so_far_while_a_table_runs(tmp_path):
    """A runner killed -9 (the machine goes away) runs no finish step: each progress tick writes the table's
    record with its time up to the tick, on top of the record the table had when it started (never adding the
    same interval twice); the end writes the final one."""
    from highway_repro.runner.progress import Progress
    from highway_repro.runner.table import tick
    from highway_repro.runner.queue import run_queue

    a = _plan(tmp_path, "a", [_marker_cmd(tmp_path, "a1", 2.0)])
    a.kept.mkdir(parents=True)
    (a.kept / "reproduce.json").write_text(json.dumps({"commands": ["make a"], "wall_s": 100.0,
                                                       "intervals": [[0.0, 100.0]]}))
    a.progress = Progress("a", a.sweep_dir, [], every=0.2, on_tick=lambda: tick(a))
    seen = []

    def read_while_it_runs():
        while not (tmp_path / "a1.end").exists():
            rec = json.loads((a.kept / "reproduce.json").read_text())
            if len(rec["intervals"]) == 2:
                seen.append(rec)
            time.sleep(0.1)

    reader = threading.Thread(target=read_while_it_runs, daemon=True)
    reader.start()
    assert run_queue([a], jobs=1) == 0
    reader.join()
    assert len(seen) >= 3  # the ticks of the 2 s run, each a whole record
    assert seen[-1]["wall_s"] > seen[0]["wall_s"] > 100.0 and seen[0]["intervals"][0] == [0.0, 100.0]
    final = json.loads((a.kept / "reproduce.json").read_text())
    assert len(final["intervals"]) == 2 and final["commands"] == ["make a"]
    start, end = final["intervals"][1]
    assert 2.0 <= end - start < 10 and abs(final["wall_s"] - 100.0 - (end - start)) < 0.2


def test_a_stopped_queue_stops_every_table_and_keeps_what_finished(tmp_path):
    """SIGTERM to the runner while two tables' commands run: both are stopped (their processes end before they
    write .end), nothing more starts, both tables are recorded, no table-end callback (no report), exit 143."""
    from highway_repro.runner.queue import run_queue

    a = _plan(tmp_path, "a", [_marker_cmd(tmp_path, "a1", 0.1), _marker_cmd(tmp_path, "a2", 30)])
    b = _plan(tmp_path, "b", [_marker_cmd(tmp_path, "b1", 30), _marker_cmd(tmp_path, "b2", 0.1)])
    c = _plan(tmp_path, "c", [_marker_cmd(tmp_path, "c1", 0.1)])

    def stop_when_both_run():
        while not ((tmp_path / "a2.start").exists() and (tmp_path / "b1.start").exists()):
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_when_both_run, daemon=True).start()
    ended, t0 = [], time.time()
    with pytest.raises(SystemExit) as e:
        run_queue([a, b, c], jobs=2, on_table_end=lambda p: ended.append(p.name))
    assert e.value.code == 143 and time.time() - t0 < 25
    assert not any((tmp_path / f"{m}.end").exists() for m in ("a2", "b1"))
    assert not any((tmp_path / f"{m}.start").exists() for m in ("b2", "c1"))  # nothing more started
    assert ended == []
    assert all((tmp_path / "kept" / n / "reproduce.json").exists() for n in "ab")
    assert not (tmp_path / "kept" / "c").exists()


def test_wall_time_of_overlapping_parts_counts_each_second_once():
    from highway_repro.runner.keep import wall_of

    recs = [{"wall_s": 10.0, "intervals": [[0.0, 10.0]]}, {"wall_s": 10.0, "intervals": [[8.0, 18.0]]},
            {"wall_s": 5.0}]  # a record from before intervals were kept
    assert wall_of(recs) == 18.0 + 5.0
    # one record of two commands that ran side by side (two checkouts, records merged): their union
    assert wall_of([{"wall_s": 20.0, "intervals": [[0.0, 10.0], [5.0, 15.0]]}]) == 15.0


def test_estimate_only_trains_nothing(tmp_path):
    r = subprocess.run([sys.executable, "-m", "highway_repro.runner", "ht_enwik8_l6", "--scale", "cpu",
                        "--estimate", "--runs", str(tmp_path / "runs"), "--results", str(tmp_path / "results")],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "34 runs, 0 finished" in r.stdout and "CPU-hours" in r.stdout
    assert not (tmp_path / "runs").exists()
    # every table, then the total: the sum of the tables' lines
    r = subprocess.run([sys.executable, "-m", "highway_repro.runner", "--all", "--scale", "cpu", "--jobs", "2",
                        "--estimate", "--runs", str(tmp_path / "runs"), "--results", str(tmp_path / "results")],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    cpu_h = [float(m) for m in re.findall(r"= ([0-9.]+) CPU-hours", r.stdout)]
    total = re.search(r"\[all\] scale=cpu: estimated ([0-9.]+) CPU-hours", r.stdout)
    assert len(cpu_h) >= 10 and total and abs(float(total.group(1)) - sum(cpu_h)) < 0.1 * len(cpu_h)
    # the cpu scale's budget: each table at most 8 h on 2 jobs, the whole set 40 h, from the scale files' step costs
    walls = {t: float(v) * (60 if u == "h" else 1) for t, v, u in
             re.findall(r"^\[(\w+)\] scale=cpu: \d+ runs.* ([0-9.]+) (h|min) wall with 2 job", r.stdout, re.M)}
    assert len(walls) == len(cpu_h) and max(walls.values()) <= 8 * 60, walls
    whole = re.search(r"\[all\] scale=cpu: .* ([0-9.]+) h wall with 2 job", r.stdout)
    assert whole and float(whole.group(1)) <= 40, r.stdout
    assert not (tmp_path / "runs").exists()  # the kept runs are counted, not copied into sweep folders
    # --fresh with --estimate prices the whole grid and deletes nothing
    (tmp_path / "runs" / "hn_table1-cpu").mkdir(parents=True)
    _fake_run(tmp_path / "runs" / "hn_table1-cpu" / "model.width=16,seed=0")
    r = subprocess.run([sys.executable, "-m", "highway_repro.runner", "hn_table1", "--scale", "cpu", "--fresh",
                        "--estimate", "--runs", str(tmp_path / "runs")], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "10 runs, 0 finished" in r.stdout, r.stdout + r.stderr[-2000:]
    assert (tmp_path / "runs" / "hn_table1-cpu" / "model.width=16,seed=0" / "metrics.json").exists()


def test_the_runner_takes_several_tables_and_names_a_wrong_one(tmp_path):
    base = [sys.executable, "-m", "highway_repro.runner", "--scale", "cpu", "--estimate", "--runs",
            str(tmp_path / "runs"), "--results", str(tmp_path / "results")]
    r = subprocess.run(base + ["hn_table1", "hn_cifar", "trainer.max_steps=10"], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "[hn_table1] scale=cpu: 10 runs" in r.stdout and "[hn_cifar] scale=cpu: 8 runs" in r.stdout
    assert "[queue] scale=cpu: estimated " in r.stdout
    r = subprocess.run(base + ["hn_tabel1"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "table='hn_tabel1' is not a table (valid: demo, hn_analysis" in r.stderr, r.stderr
    r = subprocess.run(base + ["hn_table1", "--jobs", "0"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--jobs=0: runs at once, at least 1" in r.stderr, r.stderr
    # a bad override for the whole table: one line before anything is planned (was: every job's traceback)
    r = subprocess.run(base + ["ht_char_ptb", "model.gate_kind=foo"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == (
        "error: model.gate_kind='foo' is not known (valid: none, sdu_sigmoid, sdu_tanh, highway, gated_attn)")
    assert "[ht_char_ptb] scale=cpu" not in r.stdout, r.stdout
    # a misspelt config choice: one line (Hydra's own message is a line per valid choice, and a traceback here)
    r = subprocess.run(base + ["ht_char_ptb", "optim=sgdd"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == \
        "error: optim=sgdd is not a config of configs/optim/ (valid: adam, plain_sgd, sgd)", r.stderr
    # gate options for a whole table whose rows are variants would override every row
    r = subprocess.run(base + ["ht_char_ptb", "model.gate_kind=sdu_tanh"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "error: [ht_char_ptb] model.gate_kind=sdu_tanh: the table's rows are variants" \
        in r.stderr, r.stderr
    # --list names the tables as this command takes them, beside their make targets
    r = subprocess.run(base[:3] + ["--list"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert "  ht_char_ptb          reproduce-ht-char-ptb " in r.stdout, r.stdout
    # a study named with the table it reuses: planned after it, the shared runs not trained twice; a part named
    # twice (alone and in its target) planned once
    r = subprocess.run(base + ["ht_zoo_enwik8_l6", "ht_enwik8_l6", "ht_gate_zoo", "--jobs", "2"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.index("[ht_enwik8_l6]") < r.stdout.index("[ht_zoo_enwik8_l6]")
    assert r.stdout.count("[ht_zoo_enwik8_l6] scale=cpu") == 1
    assert "24 runs, 22 finished (0 restored from" in r.stdout  # (12 of them seeds 2-4 of the table's rows)
    assert "22 to come from ht_enwik8_l6 before it in this queue), 2 to train" in r.stdout


def test_make_tables_builds_a_combined_report_before_its_parts():
    """In one pass of `make tables` on a clone with no claims files, a part of a combined report (the gate zoo's
    models) links its comparisons to the combined table, which holds them: so the combined one is built first; every
    other report keeps the order of TARGETS (paper tables before the studies that reuse their runs)."""
    from highway_repro.targets import REPORTS, TARGETS

    assert sorted(REPORTS) == sorted(n for n in TARGETS if n != "demo")
    for name, t in TARGETS.items():
        for part in t.parts:
            assert REPORTS.index(name) < REPORTS.index(part)
    alone = [n for n in REPORTS if not TARGETS[n].parts and not any(n in t.parts for t in TARGETS.values())]
    assert alone == [n for n in TARGETS if n in alone]


def test_make_help_lists_every_table():
    from highway_repro.targets import TARGETS

    out = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, timeout=60).stdout
    for name in TARGETS:
        if name != "demo":
            assert f"reproduce-{name.replace('_', '-')} " in out, name


@pytest.mark.slow
def test_every_kept_run_matches_the_recipe_of_its_table():
    """The committed runs under results/<paper>/runs/<table>-<scale>/ were made with the recipe the config files
    now give their job: a scale file changed without moving its old runs out of results/ fails here."""
    from highway_repro.report import load_runs
    from highway_repro.runner.keep import other_recipe
    from highway_repro.targets import TARGETS, runs_folder

    checked = 0
    for name, t in TARGETS.items():
        for scale in SCALES:
            kept = REPO / "results" / runs_folder(name, scale)
            if kept.is_dir() and t.sweep:
                runs = load_runs(kept)
                assert other_recipe(name, scale, [r.path for r in runs]) == {}, name
                checked += len(runs)
    assert checked >= 29  # Fig. 1 at the cpu scale: the runs of trials 0-3 kept so far


def older_char_ptb_runs(dest: Path) -> Path:
    """Three kept char-PTB runs as an older cpu recipe made them: batch 16 x 3,200 steps (today's: 32 x 3,000)."""
    from highway_repro.targets import runs_folder

    for name in ("seed=0,variant=baseline", "seed=0,variant=sdu_sigmoid", "seed=1,variant=baseline"):
        shutil.copytree(REPO / "results" / runs_folder("ht_char_ptb", "cpu") / name, dest / name)
        saved = dest / name / "config_resolved.yaml"
        text = saved.read_text()
        for old, new in (("\n  batch_size: 32\n", "\n  batch_size: 16\n"),
                         ("\n  max_steps: 3000\n", "\n  max_steps: 3200\n")):
            assert text.count(old) == 1, (saved, old)
            text = text.replace(old, new)
        saved.write_text(text)
    return dest


def test_a_kept_run_of_an_older_recipe_is_named_and_left_out(tmp_path):
    """Char-PTB runs of batch 16 x 3,200 steps are not runs of today's cpu recipe (batch 32 x 3,000)."""
    from highway_repro.report import load_runs
    from highway_repro.runner.keep import other_recipe

    runs = load_runs(older_char_ptb_runs(tmp_path / "ht_char_ptb-cpu"))
    other = other_recipe("ht_char_ptb", "cpu", [r.path for r in runs])
    assert sorted(other) == ["seed=0,variant=baseline", "seed=0,variant=sdu_sigmoid", "seed=1,variant=baseline"]
    assert all("data.batch_size: 16 there, 32 here" in v and "trainer.max_steps: 3200 there, 3000 here" in v
               for v in other.values())
    from highway_repro.report.header import header

    assert "**3 kept runs left out: made with another recipe" in header("t", [], {"other_recipe": other})


def test_a_sweep_refuses_kept_runs_of_an_older_recipe(tmp_path, capsys):
    """Kept runs of an older recipe would be counted as done (never trained again) and left out of the report:
    a hole in the table. The runner stops before training, naming the table, a run and the changed keys."""
    from highway_repro.errors import ConfigError
    from highway_repro.runner.cli import main
    from highway_repro.runner.table import plan_table
    from highway_repro.targets import runs_folder

    older_char_ptb_runs(tmp_path / "results" / runs_folder("ht_char_ptb", "cpu"))
    with pytest.raises(ConfigError, match=r"\[ht_char_ptb\] 3 finished run\(s\) .*seed=0,variant=baseline: "
                       r".*data.batch_size: 16 there, 32 here"):
        plan_table("ht_char_ptb", "cpu", 2, [], tmp_path / "runs", tmp_path / "results", estimate_only=True)
    assert main(["ht_char_ptb", "--estimate", "--runs", str(tmp_path / "runs"),
                           "--results", str(tmp_path / "results")]) == 2
    assert capsys.readouterr().err.startswith("error: [ht_char_ptb] 3 finished run(s)")
    assert plan_table("ht_char_ptb", "cpu", 2, [], tmp_path / "runs", tmp_path / "results", fresh=True,
                                estimate_only=True).todo  # --fresh ignores them


@pytest.mark.slow
@needs_mirror
def test_a_stopped_runner_stops_its_whole_sweep(tmp_path):
    """`kill <runner>` (SIGTERM) mid-sweep: every process of the running commands stops too (a launcher's workers
    used to outlive the runner and go on with their jobs, so a second runner would race them), the running
    trainers stop at a step with a checkpoint, the runner exits 143 without a report, and the same command later
    continues the sweep."""
    runs, results = tmp_path / "runs", tmp_path / "results"
    cmd = [sys.executable, "-m", "highway_repro.runner", "hn_fig1", "--scale", "smoke", "--jobs", "2",
           "--runs", str(runs), "--results", str(results), "trainer.max_steps=100000", "trainer.log_every=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    sweep, deadline = runs / "hn_fig1-smoke", time.time() + 180
    while not any('"step": 3,' in f.read_text() for f in sweep.glob("*/metrics.jsonl")):
        assert p.poll() is None and time.time() < deadline, "the sweep did not start"
        time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 143 and "stopped by signal 15" in err, err[-2000:]

    def sizes():
        return {f: f.stat().st_size for f in sweep.rglob("*") if f.is_file()}

    before = sizes()
    time.sleep(3)  # a live trainer writes a log line every step (trainer.log_every=1)
    assert sizes() == before  # no process of the sweep goes on writing
    status = [json.loads(m.read_text())["status"] for m in sweep.glob("*/metrics.json")]
    assert "interrupted" in status, status
    assert not (results / "highway_networks" / "fig1.md").exists()  # stopped: no report


def test_make_tables_skips_a_table_with_only_the_record_of_a_stopped_start(tmp_path):
    """A queue stopped before any run of a table ended leaves that table's record (its wall time) and no kept run:
    `make tables` (--all --report-only) reports only the tables that have kept runs, and does not fail on it."""
    kept = tmp_path / "results" / "highway_transformer" / "runs" / "ht_char_ptb_rt-cpu"
    kept.mkdir(parents=True)
    (kept / "reproduce.json").write_text(json.dumps({"commands": ["make reproduce-ht-char-ptb-rt SCALE=cpu"],
                                                     "wall_s": 60.0, "intervals": [[0.0, 60.0]]}))
    r = subprocess.run([sys.executable, "-m", "highway_repro.runner", "--all", "--report-only", "--scale", "cpu",
                        "--results", str(tmp_path / "results"), "--runs", str(tmp_path / "runs")],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "no runs under" not in r.stderr and (tmp_path / "results" / "summary.csv").exists()


def test_the_queue_holds_back_a_job_whose_memory_does_not_fit(tmp_path, monkeypatch, capsys):
    """Two paper-size runs of 14 GB do not fit in 20 GB: the second waits for the first to end, while a small run
    of another table fills the free job beside it (backfill); nothing ever runs beyond the budget."""
    from highway_repro.runner import queue

    monkeypatch.setattr(queue, "mem_available_gb", lambda: 20.0)
    big = _plan(tmp_path, "big", [_marker_cmd(tmp_path, "big1", 1.5), _marker_cmd(tmp_path, "big2", 0.2)])
    small = _plan(tmp_path, "small", [_marker_cmd(tmp_path, "small1", 0.2)])
    big.peak_gb, small.peak_gb = 14.0, 1.0
    assert queue.run_queue([big, small], jobs=2) == 0

    def t(m, end):
        return (tmp_path / f"{m}.{end}").stat().st_mtime

    assert t("big2", "start") >= t("big1", "end")  # held back until the first 14 GB run ended
    assert t("small1", "start") < t("big1", "end")  # the small run went ahead of it, beside the first
    assert "[big] held back: a run needs 14.0 GB at its peak, and 14.0 of the 20.0 GB available are reserved" \
        in capsys.readouterr().out


def test_peak_memory_comes_from_kept_cpu_runs_else_the_scale_file(tmp_path):
    from omegaconf import OmegaConf

    from highway_repro.runner.estimate import DEFAULT_PEAK_GB, peak_gb

    cfg = OmegaConf.create({"est_peak_gb": 14.0})
    assert peak_gb(cfg, tmp_path) == (14.0, "est_peak_gb")
    assert peak_gb(OmegaConf.create({}), None) == (DEFAULT_PEAK_GB, "default")
    for name, gb in (("seed=0", 12.5), ("seed=1", 13.3)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run_info.json").write_text(json.dumps({"peak_rss_gb": gb}))
    assert peak_gb(cfg, tmp_path) == (13.3, "largest of 2 kept runs")
    (tmp_path / "seed=2").mkdir()  # a run on a GPU: its host memory is not a CPU run's peak
    (tmp_path / "seed=2" / "run_info.json").write_text(json.dumps({"peak_rss_gb": 20.0, "cuda_device": "NVIDIA H200"}))
    assert peak_gb(cfg, tmp_path) == (13.3, "largest of 2 kept runs")


@pytest.mark.parametrize("oom", [True, False])
def test_a_job_killed_for_memory_is_named_as_such(tmp_path, monkeypatch, capsys, oom):
    """A job that dies of SIGKILL while the kernel's OOM kill count rises is reported as killed by the
    out-of-memory killer, in the runner's output and in its run's row; another SIGKILL is a plain failure."""
    from highway_repro.report.runs import load_run
    from highway_repro.runner import queue

    counts = iter([7, 8] if oom else [7, 7])
    monkeypatch.setattr(queue, "oom_kills", lambda: next(counts))
    ckpt = tmp_path / "runs" / "a" / "seed=0" / "ckpt"  # the run the job was training when it died
    a = _plan(tmp_path, "a", [[sys.executable, "-c", f"import os, pathlib, signal; pathlib.Path({str(ckpt)!r})"
                               ".mkdir(parents=True); os.kill(os.getpid(), signal.SIGKILL)"]])
    a.todo, a.peak_gb = ["seed=0"], 14.0
    assert queue.run_queue([a], jobs=1) == 137
    err = capsys.readouterr().err
    run = load_run(tmp_path / "runs" / "a" / "seed=0")
    if oom:
        assert "[a] a command was killed by the out-of-memory killer (the kernel's OOM kill count rose from 7 to 8" \
            in err and err.rstrip().endswith("run seed=0")
        assert run.error.startswith("killed by the out-of-memory killer") and "14.0 GB" in run.error
    else:
        assert "out-of-memory" not in err and "exited with status 137" in err
        assert run.error == "no metrics.json (job died or still running)"


def test_the_kernel_counts_oom_kills_here():
    """The counter the runner reads exists on this machine (Linux: /proc/vmstat has oom_kill since 4.13)."""
    from highway_repro.runner.queue import mem_available_gb, oom_kills

    if not Path("/proc/vmstat").exists():
        pytest.skip("no /proc/vmstat (not Linux)")
    assert isinstance(oom_kills(), int) and oom_kills() >= 0
    assert 0 < mem_available_gb() < 2**20


def test_the_plan_prices_a_run_alike_when_the_kept_runs_are_not_restored(tmp_path):
    """`seed=0` plans only seed 0, whose cells' other seeds stay kept and are not restored into the sweep folder, and
    --fresh restores nothing: the kept runs price each run all the same (width 16 at its kept runs' 30 s, width 32
    at est_step_s x max_steps, 2,520 s)."""
    from highway_repro.runner.table import plan_table

    results = tmp_path / "results"
    for seed in (1, 2, 3):
        _fake_run(results / "highway_networks" / "runs" / "hn_table1-cpu" / f"model.width=16,seed={seed}", wall=30.0)
    for extra, fresh in ((["seed=0"], False), ([], True)):
        p = plan_table("hn_table1", "cpu", 1, extra, tmp_path / "runs", results, fresh=fresh)
        assert sorted(set(p.secs)) == [30.0, 2520.0], p.secs
    # an override the run folder's name leaves out but that changes the cost: no kept run prices it
    p = plan_table("hn_table1", "cpu", 1, ["seed=0", "trainer.compile=default"], tmp_path / "runs", results)
    assert p.secs == [2520.0, 2520.0], p.secs


def test_runs_go_to_a_cpu_unless_a_gpu_is_asked_for_or_auto_finds_one(monkeypatch):
    from omegaconf import OmegaConf

    from highway_repro.runner import estimate

    def on(device):
        return estimate.on_cpu(OmegaConf.create({"trainer": {"device": device}}))

    assert on("auto") and on("cpu") and not on("cuda") and not on("cuda:1")
    monkeypatch.setattr(estimate, "gpu_ids", lambda: ["0"])  # the trainer sends auto to the GPU
    assert not on("auto") and on("cpu") and not estimate.on_cpu(OmegaConf.create({}))


def test_a_table_on_gpus_is_priced_in_gpu_hours_from_the_paper_scale_file(tmp_path, capsys):
    """ht_char_ptb at the paper scale on a GPU: 5 runs at est_step_s 0.0239 x 99,600 steps = 2,380 s (39.7 min)
    each, 3.3 GPU-hours, on 8 jobs the time of one run."""
    from highway_repro.runner.table import plan_table

    plan_table("ht_char_ptb", "paper", 8, ["trainer.device=cuda"], tmp_path / "runs", tmp_path / "results",
               estimate_only=True)
    out = capsys.readouterr().out
    assert "estimated 5 x 39.7 min = 3.3 GPU-hours, 39.7 min wall with 8 job(s)" in out, out


def test_the_cluster_page_holds_the_costs_the_estimate_gives_now():
    """docs/cluster.md's cost table is what `make readme` writes from the estimate today."""
    assert load_script("update_readme").cluster_costs(REPO) in (REPO / "docs" / "cluster.md").read_text(), \
        "run make readme"
