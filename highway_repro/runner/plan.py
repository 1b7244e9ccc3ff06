"""A table's grid, from its sweep files, to the runs it plans: one folder name (Hydra's `override_dirname`) per run.

The grid at a scale is the union of `configs/sweep/<table>/<scale>.yaml` and any `<scale>-<more>.yaml` (Hydra's
basic sweeper takes Cartesian products only); each is a whole grid that `python -m highway_repro.train -m
sweep=<table>/<file>` runs as it is.
"""

from __future__ import annotations

import functools
import itertools

from highway_repro.targets import CONFIG_DIR, TARGETS, Target

REPEAT_KEYS = ("seed", "trial")  # the keys that repeat one cell of a grid (its rows are the other keys)
HYDRA_VERSION = "1.3"  # the version_base of the configs' composition


def split_sweep(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(plain overrides, sweep overrides such as seed=0,1 or trial=range(0,4))."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    plain = [o for o, p in zip(overrides, parsed) if not p.is_sweep_override()]
    return plain, [o for o in overrides if o not in plain]


def sweep_files(name: str, scale: str) -> list[str]:
    """The sweep files of table `name` at `scale` as `sweep=` choices, `<name>/<scale>` first; [] for a single run."""
    if not TARGETS[name].sweep:
        return []
    folder = CONFIG_DIR / "sweep" / name
    main = folder / f"{scale}.yaml"
    if not main.exists():
        from highway_repro.errors import ConfigError

        raise ConfigError(f"sweep={name}/{scale}: no file {main.relative_to(CONFIG_DIR.parent)} "
                          f"(valid: {', '.join(sorted(p.stem for p in folder.glob('*.yaml'))) or 'none'})")
    return [f"{name}/{p.stem}" for p in [main, *sorted(folder.glob(f"{scale}-*.yaml"))]]


def compose_table(t: Target, scale: str, plain: list[str], sweep: str | None = None):
    """The composed config of the table at `scale` (hydra node included); `sweep`: the sweep file it composes."""
    from hydra import compose, initialize_config_dir

    from highway_repro.resolvers import register

    register()

    overrides = [f"experiment={t.experiment}", f"scale={scale}"] + ([f"sweep={sweep}"] if sweep else [])
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=HYDRA_VERSION):
        return compose("train", overrides=overrides + plain, return_hydra_config=True)


def override_key(o: str) -> str:
    """The key of a Hydra override: `+model.x=1` -> `model.x`."""
    return o.split("=", 1)[0].lstrip("+~")


def grid_of(cfg, extra: list[str], rows: list[str] | None = None) -> list[str] | None:
    """One sweep file's grid as overrides (`hydra.sweeper.params`), then `extra`; `rows`: the variants chosen by
    hand, which cut the file's rows to those (None when none is left)."""
    grid = {str(k): str(v) for k, v in (cfg.hydra.sweeper.params or {}).items()}
    if rows is not None and "variant" in grid:
        grid["variant"] = ",".join(v for v in grid["variant"].split(",") if v in rows)
        if not grid["variant"]:
            return None
    return [f"{k}={v}" for k, v in grid.items()] + extra


def jobs_of(grid: list[str]) -> list[list[str]]:
    """Every job (key=value overrides) of one grid as Hydra's basic sweeper expands it (Hydra's override parser; a
    later override of a key takes its place); an interval sweep is a ValueError naming the key."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices: dict[str, list[str]] = {}
    for o in OverridesParser.create().parse_overrides(grid):
        key = o.get_key_element()
        if o.is_sweep_override() and not o.is_discrete_sweep():
            raise ValueError(f"{key}: an interval sweep is not a grid (valid: a comma list, range(a,b), choice(...))")
        values = o.sweep_string_iterator() if o.is_sweep_override() else [o.get_value_element_as_str()]
        choices[key] = [f"{key}={v}" for v in values]
    return [list(job) for job in itertools.product(*choices.values())]


def hydra_key(o: str) -> bool:
    """Whether an override is Hydra's own (`hydra/launcher=...`, `hydra.launcher.x=...`): no part of a run's name."""
    key = override_key(o)
    return key == "hydra" or key.startswith(("hydra/", "hydra."))


def dirname(job: list[str], exclude: list[str]) -> str:
    """The job's folder name: Hydra's `override_dirname` (sorted, excluded keys and Hydra's own left out)."""
    return ",".join(sorted(o for o in job if override_key(o) not in exclude and not hydra_key(o)))


def plan_grids(name: str, scale: str, extra: list[str]) -> tuple[object, list[tuple[str | None, list[str]]]]:
    """(the composed config of the first sweep file, [(sweep file, grid overrides)] of every file); a single-run
    table's one grid is `extra` itself. Rows given by hand (`variant=a,b`) replace the first file's rows and cut the
    later files' to those."""
    t = TARGETS[name]
    plain, _ = split_sweep(extra)
    files = sweep_files(name, scale)
    if not files:
        return compose_table(t, scale, plain), [(None, list(extra))]
    given = [o for o in extra if override_key(o) == "variant"]
    rows = given[-1].split("=", 1)[1].split(",") if given else None
    extra = [o for o in extra if o not in given]
    cfgs = [compose_table(t, scale, plain, f) for f in files]
    out = []
    for i, (f, cfg) in enumerate(zip(files, cfgs)):
        g = grid_of(cfg, extra, rows if i else None)
        if i == 0 and rows is not None:  # the rows chosen by hand, in the grid's own place
            chosen = f"variant={','.join(rows)}"
            g = [chosen if override_key(o) == "variant" else o for o in g]
            g += [] if chosen in g else [chosen]
        if g is not None:
            out.append((f, g))
    return cfgs[0], out


def plan(name: str | Target, scale: str, extra: list[str]) -> tuple[object, list[list[str]], list[str]]:
    """(composed config, grids, job folder names in order, without duplicates) of table `name` (or its Target)."""
    name = name if isinstance(name, str) else next(n for n, t in TARGETS.items() if t is name)
    cfg, fgs = plan_grids(name, scale, extra)
    gs = [g for _, g in fgs]
    return cfg, gs, job_names(cfg, gs, TARGETS[name].sweep)


def job_names(cfg, gs: list[list[str]], sweep: bool = True) -> list[str]:
    """The folder names of the jobs of grids `gs` (a single run's: its overrides), in order, without duplicates."""
    exclude = list(cfg.hydra.job.config.override_dirname.exclude_keys)
    return list(dict.fromkeys(dirname(j, exclude) for g in gs for j in (jobs_of(g) if sweep else [g])))


@functools.lru_cache(maxsize=None)
def grid_names(name: str, scale: str) -> tuple[str, ...]:
    """The job folder names of table `name`'s grid at `scale` (`plan` without overrides), once per process."""
    return tuple(plan(name, scale, [])[2])
