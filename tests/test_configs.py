"""Every experiment composes at every scale; models instantiate; the CLI behaves."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hydra.utils import instantiate

from conftest import CONFIG_DIR, EXPERIMENTS, REPO, SCALES, compose, n_params
from highway_repro.train.config import validate

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
        assert n_params(model) > 0


def test_gate_analyses_augment_mnist_only_at_the_cpu_scale():
    """The cpu scale's one change to the paper's Figs. 2-4 recipe (docs/discrepancies.md O8); the paper scale has
    none."""
    assert compose(["experiment=hn_analysis", "scale=cpu"]).data.augment is True
    paper = compose(["experiment=hn_analysis", "scale=paper"])
    assert paper.data.augment is False and paper.model.width == "paper" and paper.trainer.max_steps == 30000


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_smoke_is_smaller_than_paper(experiment):
    paper = compose([f"experiment={experiment}", "scale=paper"])
    smoke = compose([f"experiment={experiment}", "scale=smoke"])
    assert smoke.trainer.max_steps < paper.trainer.max_steps


SWEEPS = sorted(p.name for p in (REPO / "configs" / "sweep").iterdir() if p.is_dir())  # one folder per table


@pytest.mark.parametrize("sweep", SWEEPS)
def test_every_value_of_every_sweep_composes_and_validates(sweep):
    """A table's sweep files (`configs/sweep/<table>/<scale>*.yaml`, `hydra.sweeper.params`) choose the table's own
    experiment (highway_repro/targets.py); every value any of them sweeps is set on a key that exists (a config
    group is composed) and validates and resolves, one key at a time, on that experiment."""
    import yaml
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from highway_repro.targets import TARGETS

    assert sweep in TARGETS, f"configs/sweep/{sweep}/ is not a table of highway_repro/targets.py"
    parser, grid = OverridesParser.create(), {}
    for f in sorted((REPO / "configs" / "sweep" / sweep).glob("*.yaml")):
        doc = yaml.safe_load(f.read_text())
        assert doc["defaults"] == [{"override /experiment": TARGETS[sweep].experiment}], f
        for k, v in doc["hydra"]["sweeper"]["params"].items():
            o = parser.parse_override(f"{k}={v}")
            values = list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]
            grid[k] = list(dict.fromkeys(grid.get(k, []) + values))
    assert grid and all(grid.values()), sweep
    _sweep_rows_validate(TARGETS[sweep].experiment, f"{sweep}/smoke", grid)


def _sweep_rows_validate(exp: str, sweep: str, grid: dict) -> None:
    import copy

    from omegaconf import OmegaConf

    base = [f"experiment={exp}", f"sweep={sweep}", "scale=smoke"]
    cfg = compose(base)
    for key, values in grid.items():
        for v in values:
            if (REPO / "configs" / key).is_dir():  # a config group: Hydra composes the chosen file
                row = compose(base + [f"{key}={v}"])
            else:  # a value: set on the composed config; struct mode refuses a key that does not exist
                row = copy.deepcopy(cfg)
                OmegaConf.update(row, key, v, merge=False)
            validate(row)
            OmegaConf.to_container(row, resolve=True, throw_on_missing=True)


def test_every_trainer_option_and_word_ptb_option_is_in_its_config_file():
    """Each TrainerConfig field, and each word-PTB option docs/guide.md names (data.vocab_size with sentencepiece),
    can be set on the command line without Hydra's `+`: the config file lists it."""
    import dataclasses

    from highway_repro.engine.trainer import TrainerConfig

    cfg = compose(["trainer.peak_flops=1e12", "data=ptb_word", "data.tokenizer=sentencepiece",
                   "data.vocab_size=4000", "data.sp_model_type=bpe"])
    assert set(cfg.trainer) == {f.name for f in dataclasses.fields(TrainerConfig)}
    assert cfg.trainer.peak_flops == 1e12 and cfg.data.vocab_size == 4000


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


def test_unknown_config_group_value_is_one_line():
    r = _cli("model=nope")  # (more cases: test_errors.py::test_a_misspelt_config_choice_is_one_line_before_hydra)
    assert r.returncode == 2
    assert r.stderr.strip() == ("error: model=nope is not a config of configs/model/ (valid: cifar_convnet, mlp, "
                                "mnist_convnet, r_transformer, transformer_lm, transformer_xl)")


def test_bad_value_fails_fast_with_one_line(tmp_path):
    r = _cli("experiment=demo", "model.depth=0", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == ("error: model.depth=0 is not allowed "
                                                 "(valid: an integer >= 2 (1 plain input layer + depth - 1 layers))")
    assert "Traceback" not in r.stderr


def test_installed_versions_are_the_ones_pyproject_allows():
    """The environment the tests run in is one the project declares (pyproject.toml `dependencies` and the `test`
    extra), and the torch that `make setup` pins (Makefile TORCH_SPEC) is inside the declared range."""
    import re
    import tomllib
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement
    from packaging.version import Version

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    bad = []
    for spec in project["dependencies"] + project["optional-dependencies"]["test"]:
        req = Requirement(spec)
        try:
            installed = Version(version(req.name))
        except PackageNotFoundError:
            bad.append(f"{req.name} is not installed ({spec})")
            continue
        if not req.specifier.contains(installed, prereleases=True):
            bad.append(f"{req.name} {installed} is not in {spec}")
    assert not bad, "; ".join(bad)
    pinned = re.search(r"^TORCH_SPEC \?= torch==(\S+)$", (REPO / "Makefile").read_text(), re.M)
    torch_req = next(Requirement(s) for s in project["dependencies"] if Requirement(s).name == "torch")
    assert pinned and torch_req.specifier.contains(pinned.group(1)), (pinned, str(torch_req))


def test_gate_options_set_by_hand_file_the_run_under_what_it_trained():
    """Reports group Highway Transformer runs by `variant`: gate options set after the experiment's default row
    rename the run's variant and label to those options; given together with variant= they contradict."""
    from highway_repro.train.config import ConfigError, settle_variant

    cfg = compose(["experiment=ht_char_ptb", "scale=smoke", "model.gate_kind=sdu_tanh", "model.gate_layers=1-2"])
    settle_variant(cfg, CONFIG_DIR, given=False)
    assert (cfg.variant, cfg.variant_label) == ("gate_kind=sdu_tanh, gate_layers=1-2",) * 2
    same = compose(["experiment=ht_char_ptb", "scale=smoke", "variant=sdu_tanh", "model.gate_kind=sdu_tanh"])
    settle_variant(same, CONFIG_DIR, given=True)  # the row's own value: nothing to settle
    assert (same.variant, same.variant_label) == ("sdu_tanh", "SDU tanh, all layers")
    both = compose(["experiment=ht_char_ptb", "scale=smoke", "variant=baseline", "model.gate_kind=sdu_tanh"])
    with pytest.raises(ConfigError, match=r"^variant=baseline sets model.gate_kind=none, but "
                                          r"model.gate_kind=sdu_tanh was given as well"):
        settle_variant(both, CONFIG_DIR, given=True)
