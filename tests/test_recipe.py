"""The recipe guard (`highway_repro.recipe`): a kept run counts as a job's run only when its saved config holds the
recipe the config files give that job now; renamed options are read under their new names."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from conftest import CONFIG_DIR, REPO
from highway_repro.options import RENAMED
from highway_repro.recipe import NOT_RECIPE, flat, recipe_diff

KEPT = sorted(p.parent for p in (REPO / "results").glob("*/runs/*/*/config_resolved.yaml"))
REPEAT = ("seed", "trial")  # a cell's repeats: set on a copy of the cell's composed config
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's where PyYAML has it: hundreds of files here


def test_a_renamed_option_is_compared_under_its_new_name():
    there = {"model": {"norm": "pre", "norm_style": "torch", "d_ff": 8}}
    here = {"model": {"norm_position": "post", "norm_impl": "torch", "d_ff": 8}}
    assert flat(there) == {"model.norm_position": "pre", "model.norm_impl": "torch", "model.d_ff": 8}
    assert recipe_diff(there, here) == ["model.norm_position: 'pre' there, 'post' here"]
    assert recipe_diff({"model": {"norm": "post"}}, {"model": {"norm_position": "post"}}) == []
    assert flat({"data": {"norm": 1}}) == {"data.norm": 1}  # only the model's options were renamed


def test_keys_of_not_recipe_and_keys_only_the_new_config_has_are_not_compared():
    there = {"threads": 1, "trainer": {"device": "cpu", "max_steps": 4}, "model": {"d_ff": 8}}
    here = {"threads": 2, "trainer": {"device": "cuda", "max_steps": 4, "tf32": True}, "model": {"d_ff": 8}}
    assert "threads" in NOT_RECIPE and "trainer.tf32" not in NOT_RECIPE
    assert recipe_diff(there, here) == []
    assert recipe_diff({**there, "trainer": {"tf32": False}}, here) == ["trainer.tf32: False there, True here"]


def test_a_key_only_the_saved_config_has_is_another_recipe():
    """A saved config is data: a key nothing here sets (a planted node with a `_target_`) is never waved through."""
    here = {"model": {"d_ff": 8}, "data": {"name": "mnist"}}
    there = {"model": {"d_ff": 8}, "data": {"name": "mnist", "x": {"_target_": "torch.load", "f": "p.pt"}}}
    assert recipe_diff(there, here) == ["data.x._target_: 'torch.load' there, absent here",
                                        "data.x.f: 'p.pt' there, absent here"]
    assert recipe_diff({**here, "threads": 1}, here) == []  # NOT_RECIPE keys still are not compared


def _job_configs(folders: list[Path]):
    """(folder, saved config, the config its job composes now) for each kept run: the job's overrides
    (.hydra/overrides.yaml) composed once per grid cell, its seed / trial set on a copy, a variant's gate options
    settled as `python -m highway_repro.train` does."""
    from hydra import compose, initialize_config_dir

    import highway_repro.train  # noqa: F401  (the `hp` resolver)
    from highway_repro.config import settle_variant

    cells = {}
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        for folder in folders:
            job = [o for o in yaml.load((folder / ".hydra" / "overrides.yaml").read_text(),
                                        Loader=LOADER)  # the grid file
                   if not o.startswith(("hydra", "sweep="))]  # sets only the sweeper (and the job names experiment=)
            cell = tuple(o for o in job if o.split("=", 1)[0] not in REPEAT)
            if cell not in cells:
                cfg = compose("train", overrides=list(cell))
                settle_variant(cfg, CONFIG_DIR, any(o.startswith("variant=") for o in cell))
                cells[cell] = cfg
            cfg = cells[cell].copy()
            for o in job:
                if o.split("=", 1)[0] in REPEAT:
                    OmegaConf.update(cfg, o.split("=", 1)[0], yaml.safe_load(o.split("=", 1)[1]))
            here = OmegaConf.to_container(cfg, resolve=True)
            here.pop("hydra", None)
            yield folder, yaml.load((folder / "config_resolved.yaml").read_text(), Loader=LOADER), here


def test_every_kept_run_of_the_old_option_names_passes_the_guard():
    """Every run kept under results/*/runs/ that was made before the norm options were renamed (its saved config
    says `norm` or `norm_style`) is the run its job would make now: no recipe key differs, and the renamed keys are
    among those compared (not skipped as keys of one side only). Every kept run against the runner's guard:
    test_grid.test_every_kept_run_matches_the_recipe_of_its_table."""
    assert len(KEPT) >= 400, len(KEPT)
    old_named = [f for f in KEPT if RENAMED.keys() & set(
        yaml.load((f / "config_resolved.yaml").read_text(), Loader=LOADER).get("model") or {})]
    assert len(old_named) >= 150, len(old_named)  # Transformer-XL (norm) and R-Transformer (norm_style) runs
    for folder, there, here in _job_configs(old_named):
        assert recipe_diff(there, here) == [], folder
        for k in RENAMED.keys() & there["model"].keys():
            assert f"model.{RENAMED[k]}" in flat(there).keys() & flat(here).keys(), folder


@pytest.mark.parametrize("key, value", [("norm", "pre"), ("norm_style", "torch")])
def test_a_kept_run_with_another_value_of_a_renamed_option_is_refused(key, value):
    """The same kept run with its old-named option changed is another recipe: the guard names the new key."""
    folder = next(f for f in KEPT if key in yaml.safe_load((f / "config_resolved.yaml").read_text())["model"])
    (_, there, here), = _job_configs([folder])
    there["model"][key] = value
    assert recipe_diff(there, here) == [f"model.{RENAMED[key]}: {value!r} there, {here['model'][RENAMED[key]]!r} here"]
