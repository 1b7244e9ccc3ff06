"""A table's grid: its sweep files (`configs/sweep/<table>/<scale>.yaml` and each `<scale>-<part>.yaml`, one
Cartesian product each, the table the union of its files), their `hydra.sweeper.params` expanded as Hydra's basic
sweeper does, by Hydra's own override parser. The one reader of that grammar: the runner's plan, the reports, the
ledger and the W&B export. A job is named as Hydra's `override_dirname` names it; `kept_folders`: the kept runs a
table's report reads."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from highway_repro.targets import CONFIG_DIR, TARGETS, runs_folder

SWEEP_DIR = CONFIG_DIR / "sweep"
REPEAT_KEYS = ("seed", "trial")  # the keys that repeat one cell of a grid (its rows are the other keys)


def override_key(o: str) -> str:
    """The key of a Hydra override: `+model.x=1` -> `model.x`."""
    return o.split("=", 1)[0].lstrip("+~")


def hydra_key(o: str) -> bool:
    """Whether an override is Hydra's own (`hydra/launcher=...`, `hydra.launcher.x=...`): no part of a run's name."""
    key = override_key(o)
    return key == "hydra" or key.startswith(("hydra/", "hydra."))


def dirname(job: list[str], exclude: list[str]) -> str:
    """The job's folder name: Hydra's `override_dirname` (sorted, excluded keys and Hydra's own left out)."""
    return ",".join(sorted(o for o in job if override_key(o) not in exclude and not hydra_key(o)))


def dirname_items(name: str) -> list[str]:
    """A job folder's overrides, `dirname` read back: a comma starts an item only before a `key=`."""
    return [i for i in re.split(r",(?=[+~]?[A-Za-z_][\w.@/-]*=)", name) if i]


def cell_of(name: str) -> str:
    """A job folder's name without its repeat keys, the grid cell it repeats: `seed=1,variant=x` -> `variant=x`."""
    return ",".join(i for i in dirname_items(name) if override_key(i) not in REPEAT_KEYS)


def sweep_files(table: str, scale: str) -> list[Path]:
    """The sweep files of `table` at `scale` that exist: `<scale>.yaml` first, then each `<scale>-<part>.yaml`."""
    folder = SWEEP_DIR / table
    return [p for p in [folder / f"{scale}.yaml"] if p.exists()] + sorted(folder.glob(f"{scale}-*.yaml"))


def params_of(path: Path) -> dict:
    """A sweep file's grid, `hydra.sweeper.params`, as Hydra loads it (OmegaConf's YAML)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(path).hydra.sweeper.params)


def _expand(overrides: list[str], strict: bool) -> dict[str, list[str]]:
    """Each key of `overrides` and the values it takes (a later override of a key takes its place); an interval is a
    ValueError naming the key and, `strict`, a value no run's own value can equal (a list, a dict, a bool)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    out = {}
    for o in OverridesParser.create().parse_overrides(overrides):
        key, sweep = o.get_key_element(), o.is_sweep_override()
        if sweep and not o.is_discrete_sweep():
            raise ValueError(f"{key}: an interval sweep is not a grid (valid: a comma list, range(a,b), choice(...))")
        typed = list(o.sweep_iterator()) if sweep else [o.value()]
        if strict and any(isinstance(v, bool) or not isinstance(v, (int, float, str)) for v in typed):
            raise ValueError(f"{o.input_line} is not a grid value (valid: a number or name, a comma list, "
                             "range(a,b), choice(...))")
        out[key] = list(o.sweep_string_iterator()) if sweep else [o.get_value_element_as_str()]
    return out


def jobs_of(grid: list[str]) -> list[list[str]]:
    """Every job (key=value overrides) of one grid of overrides, in the basic sweeper's order."""
    axes = [[f"{k}={v}" for v in vs] for k, vs in _expand(grid, strict=False).items()]
    return [list(job) for job in itertools.product(*axes)]


def named_jobs(fgs: list[tuple[str | None, list[str]]], exclude: list[str], sweep: bool = True) -> dict[str, list[str]]:
    """{folder name: overrides (`sweep=<file>` first)} of the jobs of grids `fgs` ([(sweep file, grid overrides)]; a
    single run's grid: its overrides), in order, each name once (its first job); `exclude`: the keys that name none."""
    out = {}
    for f, g in fgs:
        for j in jobs_of(g) if sweep else [g]:
            out.setdefault(dirname(j, exclude), [f"sweep={f}"] * bool(f) + j)
    return out


def values_of(params: dict) -> dict[str, list[str]]:
    """Each swept key of a sweep file's params and the values it takes (a ValueError names a value no run has)."""
    return _expand([f"{k}={v}" for k, v in params.items()], strict=True)


def grid_of(path: Path) -> dict[str, list[str]]:
    """Each swept key of a sweep file and the values it takes (a ValueError names the file and the value)."""
    try:
        return values_of(params_of(path))
    except ValueError as e:
        raise ValueError(f"{path.name}: {e}") from None


def cells(table: str, scale: str) -> set[str]:
    """The job folder names of `table`'s grid at `scale`: each Cartesian product of its sweep files, named as Hydra's
    `override_dirname` names a job (its `key=value` overrides sorted, joined by commas)."""
    out = set()
    for f in sweep_files(table, scale):
        items = ([f"{k}={v}" for v in vs] for k, vs in grid_of(f).items())
        out.update(",".join(sorted(c)) for c in itertools.product(*items))
    return out


def kept_folders(table: str, scale: str, results: Path) -> list[Path]:
    """The kept run folders that `table`'s report reads at `scale`: its own, the cells of its grid that the tables it
    reuses hold (`Target.reuse`; its own folder of the same name first), and its runs made on a GPU (kept apart,
    `targets.runs_folder`); for a target made of parts, its parts'. Finished or not: each with a metrics.json."""
    t = TARGETS[table]
    if t.parts:
        return [f for part in t.parts for f in kept_folders(part, scale, results)]

    def found(name: str, apart: bool = False) -> list[Path]:
        return sorted(p.parent for p in (results / runs_folder(name, scale, apart)).glob("*/metrics.json"))
    own = found(table)
    names, grid = {f.name for f in own}, cells(table, scale) if t.reuse else set()
    reused = [f for other in t.reuse for f in found(other) if f.name in grid and f.name not in names]
    return own + reused + found(table, apart=True)
