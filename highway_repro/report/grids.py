"""A table's grids as its sweep files give them (`configs/sweep/<table>/<scale>*.yaml`, `hydra.sweeper.params`), each
value read by Hydra's own override parser (a number or name, a comma list, `range(a,b)`): the one reader of that
grammar in the reports."""

from __future__ import annotations

from pathlib import Path

SWEEP_DIR = Path(__file__).resolve().parents[2] / "configs" / "sweep"


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
