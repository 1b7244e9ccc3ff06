"""A table's plan from its sweep files (`highway_repro.grids`): its composed config, each file's grid as overrides
(`sweep=<table>/<file>` runs that file as it is) and the runs they name (Hydra's `override_dirname`)."""

from __future__ import annotations

import functools

from highway_repro.errors import ConfigError
from highway_repro.grids import SWEEP_DIR, named_jobs, override_key, params_of, sweep_files
from highway_repro.targets import CONFIG_DIR, TARGETS, Target


def table_files(name: str, scale: str) -> list[str]:
    """The sweep files of table `name` at `scale` as `sweep=` choices, `<name>/<scale>` first; [] for a single run."""
    if not TARGETS[name].sweep:
        return []
    folder, files = SWEEP_DIR / name, sweep_files(name, scale)
    if not files or files[0].stem != scale:
        raise ConfigError(f"sweep={name}/{scale}: no file {(folder / f'{scale}.yaml').relative_to(CONFIG_DIR.parent)} "
                          f"(valid: {', '.join(sorted(p.stem for p in folder.glob('*.yaml'))) or 'none'})")
    return [f"{name}/{p.stem}" for p in files]


def compose_table(t: Target, scale: str, plain: list[str], sweep: str | None = None):
    """The composed config of the table at `scale` (hydra node included); `sweep`: the sweep file it composes."""
    from hydra import compose, initialize_config_dir

    from highway_repro.resolvers import register

    register()
    overrides = [f"experiment={t.experiment}", f"scale={scale}"] + ([f"sweep={sweep}"] if sweep else [])
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose("train", overrides=overrides + plain, return_hydra_config=True)


def plan_grids(name: str, scale: str, extra: list[str]) -> tuple[object, list[tuple[str | None, list[str]]]]:
    """(the composed config of the first sweep file, [(sweep file, grid overrides)]; a single run's grid: `extra`);
    rows given by hand (`variant=a,b`) replace the first file's rows and cut the later files' to those."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    t, parsed = TARGETS[name], OverridesParser.create().parse_overrides(extra)
    plain = [o for o, p in zip(extra, parsed) if not p.is_sweep_override()]  # not a sweep such as seed=0,1
    files = table_files(name, scale)
    cfg = compose_table(t, scale, plain, files[0] if files else None)
    if not files:
        return cfg, [(None, list(extra))]
    given = [o for o in extra if override_key(o) == "variant"]
    rows = given[-1].split("=", 1)[1].split(",") if given else None
    extra = [o for o in extra if o not in given]
    out = []
    for i, f in enumerate(files):
        grid = {str(k): str(v) for k, v in params_of(SWEEP_DIR / f"{f}.yaml").items()}
        if rows is not None and i == 0:  # the rows chosen by hand, in the grid's own place
            grid["variant"] = ",".join(rows)
        elif rows is not None and "variant" in grid:  # a later file's rows: cut to those chosen
            grid["variant"] = ",".join(v for v in grid["variant"].split(",") if v in rows)
            if not grid["variant"]:
                continue
        out.append((f, [f"{k}={v}" for k, v in grid.items()] + extra))
    return cfg, out


def plan(name: str, scale: str, extra: list[str]) -> tuple[object, list[list[str]], list[str]]:
    """(composed config, grids, job folder names in order, without duplicates) of table `name`."""
    cfg, fgs = plan_grids(name, scale, extra)
    return cfg, [g for _, g in fgs], list(named_jobs(fgs, excluded(cfg), TARGETS[name].sweep))


def job_names(cfg, gs: list[list[str]], sweep: bool = True) -> list[str]:
    """The folder names of the jobs of grids `gs` (a single run's: its overrides), in order, without duplicates."""
    return list(named_jobs([(None, g) for g in gs], excluded(cfg), sweep))


def excluded(cfg) -> list[str]:
    """The keys that name no run (`hydra.job.config.override_dirname.exclude_keys` of the composed config)."""
    return list(cfg.hydra.job.config.override_dirname.exclude_keys)


@functools.lru_cache(maxsize=None)
def grid_names(name: str, scale: str) -> tuple[str, ...]:
    """The job folder names of table `name`'s grid at `scale` (`plan` without overrides), once per process."""
    return tuple(plan(name, scale, [])[2])
