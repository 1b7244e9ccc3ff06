"""Every experiment composes at every scale; models instantiate; the CLI behaves."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hydra.utils import instantiate

from conftest import EXPERIMENTS, REPO, SCALES, compose
from highway_repro.config import validate

# data meta without loading data: what each data set hands the model at call time
META = {"mnist": {"num_classes": 10, "input_shape": (1, 28, 28)},
        "cifar10": {"num_classes": 10, "input_shape": (3, 32, 32)},
        "cifar100": {"num_classes": 100, "input_shape": (3, 32, 32)}}


def test_there_are_experiments():
    assert {"demo", "hn_fig1", "hn_table1", "hn_cifar", "hn_analysis"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_composes(experiment, scale):
    cfg = compose([f"experiment={experiment}", f"scale={scale}"])
    assert cfg.name == experiment
    assert cfg.scale_name == scale
    validate(cfg)
    # every value resolves (hp resolver, interpolations)
    from omegaconf import OmegaConf

    OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    if scale == "smoke":
        meta = META.get(cfg.data.name, {"vocab_size": 50})
        model = instantiate(cfg.model, _convert_="all", **meta)
        assert sum(p.numel() for p in model.parameters()) > 0


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_smoke_is_smaller_than_paper(experiment):
    paper = compose([f"experiment={experiment}", "scale=paper"])
    smoke = compose([f"experiment={experiment}", "scale=smoke"])
    assert smoke.trainer.max_steps < paper.trainer.max_steps


def test_sweep_params_are_in_files():
    cfg = compose(["experiment=hn_fig1", "sweep=hn_fig1"])
    params = cfg.hydra.sweeper.params if "hydra" in cfg else None
    # the sweep file is versioned with the code; compose() drops the hydra node, so read the file
    text = (REPO / "configs" / "sweep" / "hn_fig1.yaml").read_text()
    assert "model.depth: 10,20,50,100" in text and "trial: range(0,4)" in text
    del params


def test_hp_resolver_is_seeded_per_trial():
    a = compose(["experiment=hn_fig1", "trial=3"])
    b = compose(["experiment=hn_fig1", "trial=3"])
    c = compose(["experiment=hn_fig1", "trial=4"])
    assert a.optim.optimizer.lr == b.optim.optimizer.lr
    assert a.optim.optimizer.lr != c.optim.optimizer.lr
    assert 0.001 <= a.optim.optimizer.lr <= 0.3
    assert -10 <= a.model.gate_bias <= -1
    assert a.model.activation in ("relu", "tanh")


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "highway_repro.train", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def test_cli_help_and_cfg_job():
    r = _cli("--help")
    assert r.returncode == 0 and "experiment" in r.stdout and "model" in r.stdout
    r = _cli("experiment=hn_table1", "--cfg", "job")
    assert r.returncode == 0, r.stderr
    assert "MnistHighwayNet" in r.stdout and "caffe" in r.stdout


def test_unknown_config_group_value_gives_hydras_message():
    r = _cli("model=nope")
    assert r.returncode != 0
    assert "Could not find 'model/nope'" in r.stderr
    assert "highway_repro" not in r.stderr  # no traceback from our code


def test_bad_value_fails_fast_with_one_line(tmp_path):
    r = _cli("experiment=demo", "model.depth=0", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == ("error: model.depth=0 is not allowed "
                                                 "(valid: an integer >= 2 (1 plain input layer + depth - 1 layers))")
    assert "Traceback" not in r.stderr


def test_torch_is_cpu_build_or_cuda_available():
    assert torch.__version__.startswith("2.")
