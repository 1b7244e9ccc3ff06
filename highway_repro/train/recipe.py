"""The recipe guard: is a run folder's run the run that a config would make now?

A finished run is reused (resume=auto, the table runner's kept runs) only when its config_resolved.yaml holds the
same recipe as the config about to run. `recipe_diff` names the keys whose values differ and the keys only the
saved config has (a file is read as data, and a key nothing here would set, a planted `_target_` say, is never
waved through), leaving out the keys of `NOT_RECIPE` and the keys only the config about to run has (an option added
since, whose default keeps the old behaviour). A saved config that still holds a renamed model option
(`options.RENAMED`, e.g. `norm` -> `norm_position`) is another recipe, its line naming the migration that rewrites it
(`scripts/migrate_kept_runs.py`; the kept runs of the repository are migrated).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from highway_repro.errors import ConfigError
from highway_repro.options import RENAMED
from highway_repro.files import read_config

# Keys that do not change what a run computes (speed, logging, bookkeeping): a run folder written with other values
# of these is the same run. The run-folder name's exclude_keys (configs/train.yaml), plus the device, the scale
# file's cost estimate and extra grids (which runs a table has, not how one trains) and the checkpoint / log cadence
# (resume is bit-exact at any checkpoint step; the log cadence changes only what the logged running mean of the
# training loss averages over, not the weights), and the kernel that computes Transformer-XL's attention
# (`model.flex_attention`: the same function, tied to the core by tests/test_flex_attention.py, as a compiled step is
# to the eager one). `trainer.tf32` is not among them: like `trainer.precision`, it changes the numbers (of CUDA
# matrix products).
NOT_RECIPE = ("resume", "threads", "logger", "est_step_s", "est_peak_gb", "extra_grids", "trainer.progress",
              "trainer.device", "trainer.log_every", "trainer.checkpoint_every", "trainer.eval_stack",
              "trainer.compile", "trainer.compile_backend", "model.flex_attention")


def in_recipe(key: str) -> bool:
    """Whether a config key (or an override's key: `logger.tags`, `trainer.device`) is part of a run's recipe: not a
    key of NOT_RECIPE nor below one."""
    return not any(key == s or key.startswith(s + ".") for s in NOT_RECIPE)


def flat(d: dict, prefix: str = "") -> dict:
    """{"model": {"d_ff": 512}} -> {"model.d_ff": 512}."""
    out = {}
    for k, v in d.items():
        out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _absent(key: str) -> str:
    """What the line of a key only the saved config has adds: for an old option name, its new name and the
    migration that rewrites it."""
    old = key.removeprefix("model.")
    if key.startswith("model.") and old in RENAMED:
        return f" (now model.{RENAMED[old]}: python scripts/migrate_kept_runs.py <folder> rewrites it)"
    return ""


def recipe_diff(there: dict, here: dict) -> list[str]:
    """The recipe keys whose values differ between a run folder's config_resolved.yaml (`there`) and the config
    about to run (`here`), as 'key: value there, value here', and the keys only `there` has ('key: value there,
    absent here'). Keys of NOT_RECIPE, and keys only `here` has, are not compared; with `match_params` set, neither
    is model.d_ff (the saved config holds the widened width)."""
    a, b = flat(there if isinstance(there, dict) else {}), flat(here)
    compared = [k for k in sorted(a) if in_recipe(k) and not (k == "model.d_ff" and here.get("match_params"))]
    return [f"{k}: {a[k]!r} there, {repr(b[k]) if k in b else 'absent'} here{'' if k in b else _absent(k)}"
            for k in compared if k not in b or a[k] != b[k]]


def check_same_recipe(cfg: DictConfig, out_dir: Path) -> None:
    """With resume=auto, a run folder that already holds a run (config_resolved.yaml) must hold this recipe:
    otherwise a finished run of another recipe would be taken as this one's result, or a half-run one continued
    under another schedule (e.g. a kept run restored after the scale file changed). ConfigError naming the keys."""
    saved = out_dir / "config_resolved.yaml"
    if cfg.get("resume") != "auto" or not saved.exists():
        return
    diff = recipe_diff(read_config(saved), OmegaConf.to_container(cfg, resolve=True))
    if diff:
        more = f"; and {len(diff) - 3} more" if len(diff) > 3 else ""
        raise ConfigError(f"resume=auto: the run folder {out_dir} holds a run of another recipe ({'; '.join(diff[:3])}"
                          f"{more}) (valid: the same recipe; move that folder away or pick another hydra.run.dir / "
                          f"reproduce --fresh; resume=<checkpoint path> continues it on purpose)")
