"""A table's grids as its sweep files give them (`configs/sweep/<table>/<scale>*.yaml`), each value read by Hydra's
own override parser (the one reader of that grammar in the reports); the job folder names of a grid (`cells`) and
the kept run folders a table's report reads (`kept_folders`: the one rule of the ledger, the runner and the W&B
export)."""

from __future__ import annotations

import itertools
from pathlib import Path

from highway_repro.targets import CONFIG_DIR, TARGETS, runs_folder

SWEEP_DIR = CONFIG_DIR / "sweep"


def params_of(text: str) -> dict:
    """A sweep file's grid: `hydra.sweeper.params` (read as plain data)."""
    import yaml

    return yaml.safe_load(text)["hydra"]["sweeper"]["params"]


def swept(spec, key: str = "key") -> list[str]:
    """The values a swept `key=spec` takes, as Hydra's basic sweeper expands them; a value that no run's own value
    can equal (a list, a dict, a bool) is a ValueError naming it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    override = OverridesParser.create().parse_override(f"{key}={spec}")
    values = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
    if any(isinstance(v, bool) or not isinstance(v, (int, float, str)) for v in values):
        raise ValueError(f"{key}={spec!r} is not a grid value (valid: a number or name, a comma list, range(a,b), "
                         "choice(...))")
    return list(override.sweep_string_iterator()) if override.is_sweep_override() else [
        override.get_value_element_as_str()]


def grid_of(path: Path) -> dict[str, list[str]]:
    """Each swept key of a sweep file and the values it takes (a ValueError names the file and the value)."""
    try:
        return {str(k): swept(v, str(k)) for k, v in params_of(path.read_text()).items()}
    except ValueError as e:
        raise ValueError(f"{path.name}: {e}") from None


def sweep_files(table: str, scale: str) -> list[Path]:
    """The sweep files of `table` at `scale`: `<scale>.yaml` and each `<scale>-<part>.yaml` (their union: the grid)."""
    folder = SWEEP_DIR / table
    return sorted(f for f in folder.glob(f"{scale}*.yaml") if f.stem == scale or f.stem.startswith(f"{scale}-"))


def cells(table: str, scale: str) -> set[str]:
    """The job folder names of `table`'s grid at `scale`: each Cartesian product of its sweep files, named as Hydra's
    `override_dirname` names a job (its `key=value` overrides sorted, joined by commas)."""
    out = set()
    for f in sweep_files(table, scale):
        grid = grid_of(f)
        items = ([f"{k}={v}" for v in vs] for k, vs in grid.items())
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
