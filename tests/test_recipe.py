"""The recipe guard (`highway_repro.train.recipe`): a kept run counts as a job's run only when its saved config holds
the recipe the config files give that job now; a saved config with a renamed option is another recipe until the
migration (scripts/migrate_kept_runs.py) rewrites it, and the kept runs are migrated."""

from __future__ import annotations

import yaml
from omegaconf import OmegaConf

from conftest import REPO
from highway_repro.options import RENAMED
from highway_repro.train.recipe import NOT_RECIPE, recipe_diff

KEPT = sorted(p.parent for p in (REPO / "results").glob("*/runs/*/*/config_resolved.yaml"))
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's where PyYAML has it: hundreds of files here


def test_a_saved_config_with_an_old_option_name_is_another_recipe_naming_the_migration(tmp_path):
    """A run folder saved before `norm` became `norm_position` is refused by the guard, its line naming the new name and
    the migration; the migration rewrites just those keys, in place, and the run then passes; a second run of it
    changes nothing."""
    from conftest import load_script

    there = {"model": {"norm": "post", "norm_style": "torch", "d_ff": 8}, "data": {"norm": 1}}
    here = {"model": {"norm_position": "post", "norm_impl": "torch", "d_ff": 8}, "data": {"norm": 1}}
    assert recipe_diff(there, here) == [
        "model.norm: 'post' there, absent here (now model.norm_position: python scripts/migrate_kept_runs.py "
        "<folder> rewrites it)",
        "model.norm_style: 'torch' there, absent here (now model.norm_impl: python scripts/migrate_kept_runs.py "
        "<folder> rewrites it)"]
    saved = tmp_path / "run" / "config_resolved.yaml"
    saved.parent.mkdir()
    saved.write_text(OmegaConf.to_yaml(OmegaConf.create(there)))
    migrate = load_script("migrate_kept_runs")
    assert migrate.migrate(tmp_path) == [saved]
    assert saved.read_text() == OmegaConf.to_yaml(OmegaConf.create(
        {"model": {"norm_position": "post", "norm_impl": "torch", "d_ff": 8}, "data": {"norm": 1}}))
    assert recipe_diff(yaml.safe_load(saved.read_text()), here) == [] and migrate.migrate(tmp_path) == []


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


def test_no_kept_run_holds_an_old_option_name():
    """The kept runs were migrated (scripts/migrate_kept_runs.py): no saved config under results/*/runs/ holds a
    renamed option, among them the Transformer-XL (`norm_position`) and R-Transformer (`norm_impl`) runs. Every kept
    run against the runner's guard: test_grid.test_every_kept_run_matches_the_recipe_of_its_table."""
    assert len(KEPT) >= 400, len(KEPT)
    models = [yaml.load((f / "config_resolved.yaml").read_text(), Loader=LOADER).get("model") or {} for f in KEPT]
    assert not [f for f, m in zip(KEPT, models) if RENAMED.keys() & m.keys()]
    assert sum(set(RENAMED.values()) & m.keys() != set() for m in models) >= 150


def test_the_migration_rewrites_a_table_record_to_the_runners_module_and_no_kept_record_names_the_old_one(tmp_path):
    """A table's record (`reproduce.json`) names its commands; the migration rewrites the runner's old module name
    (`highway_repro.reproduce`) to `highway_repro.runner`, leaves every other command and field as it is, and a
    second run changes nothing. No kept record still names the old module, whose command no longer runs."""
    import json

    from conftest import load_script

    migrate = load_script("migrate_kept_runs")
    record = tmp_path / "t-cpu" / "reproduce.json"
    record.parent.mkdir()
    old = {"commands": ["python -m highway_repro.reproduce t --scale cpu seed=0", "make reproduce-t SCALE=cpu"],
           "intervals": [[1.0, 2.0]]}
    record.write_text(json.dumps(old))
    assert migrate.migrate(tmp_path) == [record] and migrate.migrate(tmp_path) == []
    assert json.loads(record.read_text()) == {**old, "commands": ["python -m highway_repro.runner t --scale cpu seed=0",
                                                                 "make reproduce-t SCALE=cpu"]}
    kept = sorted((REPO / "results").glob("*/runs/*/reproduce.json"))
    assert len(kept) > 5 and not [p for p in kept if "highway_repro.reproduce" in p.read_text()]


def test_a_run_trained_with_the_wandb_logger_is_its_table_s_recipe(tmp_path):
    """A kept run's folder as `logger=wandb` leaves it (the logger override, its `${hydra:...}` names resolved in the
    saved config): the runner's guard takes it as its job's run, so the report reads it; an override that changes the
    recipe is still seen."""
    import shutil

    from highway_repro.runner.keep import other_recipe

    kept = REPO / "results" / "highway_transformer" / "runs" / "ht_char_ptb-cpu" / "seed=0,variant=baseline"
    run = tmp_path / kept.name
    shutil.copytree(kept, run)
    config = yaml.safe_load((run / "config_resolved.yaml").read_text())
    config["logger"] = {"kind": "wandb", "project": "highway-repro", "group": "ht_char_ptb", "name": kept.name,
                        "tags": ["ht_char_ptb", "cpu"], "mode": "offline"}
    (run / "config_resolved.yaml").write_text(yaml.safe_dump(config))
    overrides = run / ".hydra" / "overrides.yaml"
    lines = yaml.safe_load(overrides.read_text())
    overrides.write_text(yaml.safe_dump(lines + ["logger=wandb", "logger.mode=offline", "threads=1"]))
    assert other_recipe("ht_char_ptb", "cpu", [run]) == {}
    overrides.write_text(yaml.safe_dump(lines + ["logger=wandb", "trainer.max_steps=7"]))
    assert other_recipe("ht_char_ptb", "cpu", [run])[kept.name].startswith("trainer.max_steps: ")
