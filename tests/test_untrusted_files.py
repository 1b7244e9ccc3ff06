"""No file the project reads runs code: a run folder's YAML is data, whatever it holds.

Each payload below would run code if a reader handed the folder's config to `hydra.utils.instantiate` or to an
unsafe YAML loader: `torch.load` and `numpy.load` of a pickle, `pickle.loads` of `!!binary` bytes, and a
`!!python/object/apply` tag. The pickle makes a marker folder when it is loaded. Every reader of run folders (the
gate analyses, the report, the runner's recipe check of kept runs, resume=auto) gets each payload in three places
(a nested node, in place of the model's target, a node of its own) and must leave no marker and, where it refuses,
refuse in one line with exit code 2. The same commands as subprocesses, `make reproduce-<table>` included, are the
slow test at the end.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, compose

KEPT = REPO / "results" / "highway_networks" / "runs" / "hn_analysis-cpu" / "run"  # a finished hn_analysis run


class MakeMarker:
    """Unpickling this calls os.makedirs(marker): the proof that a file ran code."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.makedirs, (self.marker,)


def payloads(tmp: Path) -> dict[str, tuple[dict | None, str | None]]:
    """name -> (a node with a `_target_`, or None; or raw YAML text with a tag, or None)."""
    import torch

    marker, blob, pt = tmp / "MARKER", tmp / "payload.pkl", tmp / "payload.pt"
    blob.write_bytes(pickle.dumps(MakeMarker(marker)))
    torch.save(MakeMarker(marker), pt)
    return {
        "torch.load": ({"_target_": "torch.load", "f": str(pt), "weights_only": False}, None),
        "numpy.load": ({"_target_": "numpy.load", "file": str(blob), "allow_pickle": True}, None),
        "pickle": ({"_target_": "pickle.loads", "data": pickle.dumps(MakeMarker(marker))}, None),
        "python tag": (None, f"!!python/object/apply:os.makedirs [{str(marker)!r}]"),
    }


def planted(tmp: Path, name: str, where: str) -> Path:
    """A copy of the kept hn_analysis run whose config_resolved.yaml carries payload `name` at `where`: nested in
    `data`, as the model's `_target_`, or as a top-level node."""
    run = tmp / f"run-{name.replace(' ', '_').replace('.', '_')}-{where}"
    shutil.copytree(KEPT, run)
    cfg = yaml.safe_load((run / "config_resolved.yaml").read_text())
    node, tag = payloads(tmp)[name]
    text = yaml.safe_dump(cfg)
    if node is not None:
        if where == "nested":
            cfg["data"]["extra"] = node
        elif where == "model":
            cfg["model"] = {**cfg["model"], **node}
        else:
            cfg["payload"] = node
        text = yaml.dump(cfg)  # bytes become !!binary: a tag the safe loader reads as data
    else:
        key = {"nested": "  extra: ", "model": "  _target_: ", "top": "payload: "}[where]
        section = {"nested": "data:\n", "model": "model:\n", "top": ""}[where]
        text = text.replace(section, section + key + tag + "\n", 1) if section else text + key + tag + "\n"
    (run / "config_resolved.yaml").write_text(text)
    return run


CASES = [(n, w) for n in ("torch.load", "numpy.load", "pickle", "python tag") for w in ("nested", "model", "top")]


def one_line(err: str) -> bool:
    lines = [line for line in err.splitlines() if line.strip()]
    return len(lines) == 1 and lines[0].startswith("error: ")


@pytest.mark.parametrize("name,where", CASES)
def test_the_gate_analyses_refuse_a_planted_config_in_one_line(tmp_path, capsys, name, where):
    from highway_repro.analysis.run import main

    run = planted(tmp_path, name, where)
    assert main([str(run), "--out", str(tmp_path / "out" / "analysis")]) == 2
    err = capsys.readouterr().err
    assert one_line(err) and str(run / "config_resolved.yaml") in err, err
    assert not (tmp_path / "MARKER").exists()


@pytest.mark.parametrize("name,where", CASES)
def test_the_report_reads_a_planted_config_as_data(tmp_path, capsys, name, where):
    """The report never builds anything: a `_target_` is a string to it; a tag that builds an object is refused."""
    from highway_repro.report.generic import main

    run = planted(tmp_path, name, where)
    try:
        rc = main([str(run), "--metrics", "train/loss"])
    except SystemExit as e:  # the one run is damaged: argparse's one-line error
        rc = e.code
    err = capsys.readouterr().err
    if name == "python tag":
        assert rc == 2 and one_line(err), err
    else:
        assert rc == 0, err
    assert not (tmp_path / "MARKER").exists()


@pytest.mark.parametrize("name,where", CASES)
def test_resume_and_the_runner_refuse_a_planted_config(tmp_path, capsys, name, where):
    """resume=auto (`cli.run_job`: the recipe guard) and the runner's check of kept runs (`keep.other_recipe`) both
    read the folder's config: a key only it has, or a target of its own, is another recipe; nothing is trained."""
    from highway_repro.train import run_job
    from highway_repro.errors import HighwayError
    from highway_repro.runner.keep import other_recipe

    run = planted(tmp_path, name, where)
    cfg = compose(["experiment=hn_analysis", "scale=cpu", "resume=auto"])
    with pytest.raises(SystemExit) as e:
        run_job(cfg, run, False, lambda *a, **k: pytest.fail("trained a run whose folder holds another recipe"))
    err = capsys.readouterr().err
    assert e.value.code == 2 and one_line(err), err
    try:
        assert other_recipe("hn_analysis", "cpu", [run]) != {}
    except HighwayError as refused:  # the tag: not plain YAML, named in one line
        assert str(run / "config_resolved.yaml") in str(refused)
    assert not (tmp_path / "MARKER").exists()


def test_the_kept_run_itself_passes_every_reader(tmp_path):
    """The unplanted copy: resume=auto's guard and the runner take it as the same recipe."""
    from highway_repro.train.recipe import check_same_recipe
    from highway_repro.runner.keep import other_recipe

    run = tmp_path / "run"
    shutil.copytree(KEPT, run)
    check_same_recipe(compose(["experiment=hn_analysis", "scale=cpu", "resume=auto"]), run)
    assert other_recipe("hn_analysis", "cpu", [run]) == {}


def test_a_target_outside_the_allow_list_is_refused_on_the_command_line_too():
    from highway_repro.train.config import ConfigError, check_targets

    check_targets(compose(["experiment=hn_fig1", "scale=smoke"]))
    for override in ("model._target_=torch.load", "+data.x._target_=os.system", "optim.optimizer._target_=os.system"):
        with pytest.raises(ConfigError, match=r"_target_=\S+ is not allowed in the config \(valid: "):
            check_targets(compose(["experiment=hn_fig1", "scale=smoke", override]))


def test_experimental_rerun_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    from highway_repro.train import cli

    blob = tmp_path / "config.pickle"
    blob.write_bytes(pickle.dumps(MakeMarker(tmp_path / "MARKER")))
    monkeypatch.setattr(sys, "argv", ["highway-train", "--experimental-rerun", str(blob)])
    with pytest.raises(SystemExit) as e:
        cli()
    assert e.value.code == 2 and one_line(capsys.readouterr().err)
    assert not (tmp_path / "MARKER").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["torch.load", "python tag"])
def test_every_command_that_reads_run_folders_refuses_a_planted_kept_run(tmp_path, name):
    """As subprocesses: the analysis, the report, `make tables`-style --report-only and resume of a planted folder,
    and `make reproduce-hn-analysis`'s runner over a results/ folder whose kept run was planted."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HIGHWAY_DATA_OFFLINE": "1"}
    py = [sys.executable, "-m"]
    run = planted(tmp_path, name, "nested")
    results = tmp_path / "results"
    kept = results / "highway_networks" / "runs" / "hn_analysis-cpu" / "run"
    shutil.copytree(run, kept)
    commands = [
        py + ["highway_repro.analysis.run", str(run), "--out", str(tmp_path / "a" / "analysis")],
        py + ["highway_repro.train", "experiment=hn_analysis", "scale=cpu", "resume=auto", f"hydra.run.dir={run}"],
        py + ["highway_repro.runner", "hn_analysis", "--scale", "cpu", "--results", str(results),
              "--runs", str(tmp_path / "sweeps")],
    ] + ([py + ["highway_repro.report", str(run)],
          py + ["highway_repro.runner", "--all", "--report-only", "--results", str(results)]]
         if name == "python tag" else [])
    for cmd in commands:
        p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        errors = [line for line in p.stderr.splitlines() if line.startswith("error: ")]  # progress lines aside
        code = 1 if "--report-only" in cmd else 2  # make tables: the run is damaged, named, the tables rebuilt
        assert p.returncode == code and len(errors) == 1 and "Traceback" not in p.stderr, \
            (cmd, p.returncode, p.stderr[-2000:])
        assert not (tmp_path / "MARKER").exists(), cmd
