"""options.py is the one source of the option rules: it covers every constructor argument, its choices are the
models' choices, the constructors and the early validator give the same one-line message, and it needs no torch."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
from omegaconf import open_dict

from conftest import REPO, compose
from highway_repro import options
from highway_repro.train.config import validate
from highway_repro.errors import ConfigError, HighwayError
from highway_repro.models import convnets, gates, highway, kernels, mlp, r_transformer, transformer_lm, transformer_xl

CLASSES = {"TransformerLM": transformer_lm.TransformerLM, "RTransformer": r_transformer.RTransformer,
           "TransformerXL": transformer_xl.TransformerXL, "MLP": mlp.MLP, "MnistHighwayNet": convnets.MnistHighwayNet,
           "CifarHighwayNet": convnets.CifarHighwayNet}


def test_error_classes():
    assert issubclass(ConfigError, HighwayError) and issubclass(HighwayError, ValueError)
    from highway_repro.train import config

    assert config.ConfigError is ConfigError  # the entry point imports it from config


@pytest.mark.parametrize("name", sorted(options.MODELS))
def test_each_table_lists_exactly_the_constructor_arguments(name):
    params = set(inspect.signature(CLASSES[name]).parameters)
    assert set(options.MODELS[name]) == params


def test_torch_side_maps_use_the_choices_of_options():
    assert tuple(r_transformer.RNNS) == options.RNNS
    assert {type(r_transformer.make_norm(n, 4, False)).__name__ for n in options.NORM_IMPLS} == \
        {"OfficialLayerNorm", "LayerNorm"}  # each name its own LayerNorm
    assert tuple(highway.ACTIVATIONS) == options.ACTIVATIONS
    assert set(mlp.PAPER_WIDTH) == set(options.MLP_KINDS)
    for kind in gates.GATE_KINDS:
        cls = gates.gate_class(kind)
        assert cls is None or cls.fused_term in kernels.GATE_TERMS


def test_the_option_modules_need_no_torch():
    """Importing the validators, and validating a whole composed config (the trainer's options included), loads no
    torch: a bad value fails before torch's seconds of import."""
    code = ("import sys; import highway_repro.train.config, highway_repro.options, highway_repro.errors, "
            "highway_repro.models.placement, highway_repro.resolvers; "
            "from hydra import compose, initialize_config_dir; from pathlib import Path; "
            "initialize_config_dir(config_dir=str(Path('configs').resolve()), version_base='1.3'); "
            "highway_repro.train.config.validate(compose('train', overrides=['experiment=ht_char_ptb', 'scale=cpu'])); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("model,data,key,value,expected", [
    ("transformer_lm", "ptb_char", "d_ff", 0, "model.d_ff=0 is not allowed (valid: a positive integer)"),
    ("r_transformer", "ptb_word", "norm_impl", "nn", "model.norm_impl='nn' is not allowed (valid: official, torch)"),
    ("transformer_xl", "enwik8_prefix", "clamp_len", 0,
     "model.clamp_len=0 is not allowed (valid: -1 (no clamping) or a positive integer)"),
    ("transformer_xl", "enwik8_prefix", "fused", "yes", "model.fused='yes' is not allowed (valid: true or false)"),
    ("transformer_lm", "ptb_char", "n_heads", 3, "model.n_heads=3 does not divide model.d_model=512 "
                                                 "(valid: a divisor of 512)"),
    ("transformer_lm", "ptb_char", "mem_len", 8, "model.mem_len=8 is not allowed: TransformerLM has no option "
                                                 "mem_len (valid only for TransformerXL; remove it)"),
    ("transformer_xl", "enwik8_prefix", "d_inner", 8, "model.d_inner=8 is not allowed: TransformerXL has no "
                                                      "option d_inner (valid: "),
    ("mlp", "mnist", "width", "wide", "model.width='wide' is not allowed (valid: a positive integer, paper or match)"),
    ("transformer_lm", "ptb_char", "gate_kind", "sdu", "model.gate_kind='sdu' is not known (valid: none, "),
    ("transformer_xl", "enwik8_prefix", "norm", "pre", "model.norm='pre' is not allowed: the option is now called "
                                                       "norm_position (valid: model.norm_position, one of post, pre)"),
    ("r_transformer", "ptb_word", "norm_style", "torch", "model.norm_style='torch' is not allowed: the option is now "
                                                         "called norm_impl (valid: model.norm_impl, one of official, "
                                                         "torch)"),
])
def test_constructor_and_validator_give_the_same_message(model, data, key, value, expected):
    cfg = compose([f"model={model}", f"data={data}", "scale=smoke"])
    with open_dict(cfg):
        cfg.model[key] = value
    with pytest.raises(ConfigError) as early:
        validate(cfg)
    assert str(early.value).startswith(expected), str(early.value)
    cls = CLASSES[cfg.model._target_.rsplit(".", 1)[-1]]
    if key not in inspect.signature(cls).parameters:
        return  # an unknown key: Python itself refuses the keyword (TypeError); the validator names it
    kwargs = {k: v for k, v in cfg.model.items() if not k.startswith("_")}
    meta = {"num_classes": 10, "input_shape": (1, 28, 28)} if model == "mlp" else {"vocab_size": 50}
    with pytest.raises(ConfigError) as late:
        cls(**kwargs, **meta)
    assert str(late.value) == str(early.value)


def test_an_old_option_name_on_the_command_line_names_the_new_one(tmp_path):
    """`model.norm=pre` (renamed norm_position) is not a key of the composed model: one line naming the new name."""
    r = subprocess.run([sys.executable, "-m", "highway_repro.train", "experiment=ht_enwik8_l6", "scale=smoke",
                        "model.norm=pre", f"hydra.run.dir={tmp_path}"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stderr == ("error: model.norm='pre' is not allowed: the option is now called "
                                              "norm_position (valid: model.norm_position, one of post, pre)\n")


def test_trainer_types_come_from_trainer_config():
    cfg = compose(["experiment=demo", "scale=smoke"])
    for key, value, expected in (("max_steps", "many", "trainer.max_steps='many' is not allowed (valid: an integer)"),
                                 ("max_steps", 0, "trainer.max_steps=0 is not allowed (valid: >= 1)"),
                                 ("eval_train", 1, "trainer.eval_train=1 is not allowed (valid: true or false)"),
                                 ("tf32", 1, "trainer.tf32=1 is not allowed (valid: true or false)"),
                                 ("max_bad_steps", -1, "trainer.max_bad_steps=-1 is not allowed (valid: an integer")):
        bad = cfg.copy()
        bad.trainer[key] = value
        with pytest.raises(ConfigError, match="^" + expected.replace("(", r"\(").replace(")", r"\)")):
            validate(bad)


def test_annotation_rules():
    assert options.annotation_rule("int").valid == "an integer"
    assert options.annotation_rule("float | None").ok(None) and not options.annotation_rule("float | None").ok("x")
    assert options.annotation_rule("dict[str, int]") is None
