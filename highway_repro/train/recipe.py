"""The recipe guard: is a run folder's run the run that a config would make now? (`recipe_diff`: a planted
`_target_` only the saved config has is never waved through; a key only the new config has is an option added since,
whose default keeps the old behaviour.)"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from highway_repro.errors import ConfigError
from highway_repro.options import RENAMED
from highway_repro.files import read_config

# Keys that do not change what a run computes: speed, logging, cost estimates, the checkpoint and log cadence
# (resume is bit-exact at any step), the kernel of the same function (`model.flex_attention`, `trainer.compile`).
# `trainer.tf32` and `trainer.precision` change the numbers: they are recipe.
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


def recipe_diff(there: dict, here: dict) -> list[str]:
    """'key: value there, value here' for each recipe key that a run folder's config_resolved.yaml (`there`) and the
    config about to run (`here`) differ in, `absent here` for a key only `there` has; with `match_params`,
    model.d_ff is not compared (the saved config holds the widened width)."""
    a, b = flat(there if isinstance(there, dict) else {}), flat(here)
    compared = [k for k in sorted(a) if in_recipe(k) and not (k == "model.d_ff" and here.get("match_params"))]
    moved = {f"model.{old}": f" (now model.{new}: python scripts/migrate_kept_runs.py <folder> rewrites it)"
             for old, new in RENAMED.items()}  # an old option name only the saved config has: its migration
    return [f"{k}: {a[k]!r} there, {repr(b[k]) if k in b else 'absent'} here{'' if k in b else moved.get(k, '')}"
            for k in compared if k not in b or a[k] != b[k]]


def check_same_recipe(cfg: DictConfig, out_dir: Path) -> None:
    """With resume=auto, a run folder that holds a run must hold this recipe (else another recipe's result would be
    taken, or continued under another schedule): ConfigError naming the keys."""
    saved = out_dir / "config_resolved.yaml"
    if cfg.get("resume") != "auto" or not saved.exists():
        return
    diff = recipe_diff(read_config(saved), OmegaConf.to_container(cfg, resolve=True))
    if diff:
        more = f"; and {len(diff) - 3} more" if len(diff) > 3 else ""
        raise ConfigError(f"resume=auto: the run folder {out_dir} holds a run of another recipe ({'; '.join(diff[:3])}"
                          f"{more}) (valid: the same recipe; move that folder away or pick another hydra.run.dir / "
                          f"the runner's --fresh; resume=<checkpoint path> continues it on purpose)")
