"""The kept-run store: finished runs' small files (`targets.KEPT_FILES`), committed, put back into the sweep folder
before a sweep starts (`resume=auto` skips them); one made with another recipe than its job's now is never done."""

from __future__ import annotations

import sys
from pathlib import Path

from highway_repro import files
from highway_repro.errors import ConfigError
from highway_repro.grids import REPEAT_KEYS, kept_folders, override_key
from highway_repro.runner.plan import compose_table
from highway_repro.targets import KEPT_FILES, TARGETS, runs_folder

FINISHED = ("done", "diverged")  # a diverged run is a result (a table cell), not a crash
SINGLE_RUN = "run"  # the kept folder of a single-run table's run


def run_object(path: Path) -> dict | None:
    """A run folder's JSON file (metrics.json, run_info.json) as a dict: {} when absent, None when damaged."""
    try:
        return files.read_json(path, path.parent.parent, kind=dict) or {}
    except files.KeptFileError:
        return None


def results_root(kept: Path) -> Path:
    """The results root of a kept-runs folder (`<results>/<paper>/runs/<table>-<scale>`): no link below it is read."""
    return Path(kept).parents[2]


def run_status(run: Path) -> str | None:
    return (run_object(run / "metrics.json") or {}).get("status")


def keep(sweep_dir: Path, kept: Path, single: bool = False, apart: Path | None = None,
         reused: frozenset = frozenset()) -> int:
    """Copy the small files of each finished run of the sweep folder into `kept` (a single run's as <kept>/run; one
    made on a GPU into `apart`), none of `reused` (a study's runs kept by its tables). Returns the files written."""
    n, root = 0, results_root(kept)
    for run in [sweep_dir] if single else sorted(p.parent for p in sweep_dir.glob("*/metrics.json")):
        if run_status(run) not in FINISHED or run.name in reused:
            continue
        gpu = apart is not None and (run_object(run / "run_info.json") or {}).get("cuda_device")
        dst = (apart if gpu else kept) / (SINGLE_RUN if single else run.name)
        for f in KEPT_FILES:
            if (run / f).exists() and _kept(dst / f, root) != files.read_bytes(run / f, sweep_dir.parent):
                files.copy_file(run / f, dst / f, sweep_dir.parent, root)
                n += 1
    return n


def _kept(path: Path, root: Path) -> bytes | None:
    """A kept file's bytes, None where absent or damaged (then written over; a link at its path removed first)."""
    try:
        return files.read_bytes(path, root)
    except files.KeptFileError:
        if path.is_symlink():
            path.unlink()
        return None


def restore(kept: Path, sweep_dir: Path, names: list[str] | None = None, dry: bool = False,
            single: bool = False) -> list[str]:
    """Put kept runs back where the sweep folder has no finished run of that name (`resume=auto` skips them); `names`:
    only these (a study reusing a table's runs); `dry`: copy nothing (an estimate); `single`: a single-run table
    (kept as <kept>/run, run in the sweep folder itself). Returns the folder names restored ("run": a single run)."""
    out, root = [], results_root(kept)
    for run in [kept / SINGLE_RUN] if single else sorted(p.parent for p in kept.glob("*/metrics.json")):
        dst = sweep_dir if single else sweep_dir / run.name
        if (names is not None and not single and run.name not in names) or run_status(run) not in FINISHED \
                or run_status(dst) in FINISHED:
            continue
        try:
            blobs = {f: files.read_bytes(run / f, root) for f in KEPT_FILES}
        except files.KeptFileError as e:  # not restored: trained again, and kept over it when it ends
            print(f"warning: the kept run {run} is damaged and is trained again: {e}", file=sys.stderr)
            continue
        for f in () if dry else [f for f, blob in blobs.items() if blob is not None]:
            files.copy_file(run / f, dst / f, root, sweep_dir.parent)
        out.append(run.name)
    return out


def read_record(kept: Path, fresh: bool) -> dict:
    """A table's record, `reproduce.json` in its kept folder (its commands, their wall time); empty when `fresh`."""
    record = None if fresh else files.read_json(kept / "reproduce.json", results_root(kept), kind=dict)
    if record is None:
        return {"commands": [], "wall_s": 0.0}
    commands, wall, spans = record.get("commands"), record.get("wall_s"), record.get("intervals", [])
    if not (isinstance(commands, list) and all(isinstance(c, str) for c in commands)
            and isinstance(wall, (int, float)) and not isinstance(wall, bool) and isinstance(spans, list)
            and all(isinstance(i, list) and len(i) == 2 and all(isinstance(t, (int, float)) for t in i)
                    for i in spans)):
        raise files.KeptFileError(f"{kept / 'reproduce.json'} is not a table's record (valid: commands, a list of "
                            "strings; wall_s, a number; intervals, [start, end] pairs of numbers)")
    return record


def table_runs(name: str, scale: str, runs_root: Path, results: Path) -> list:
    """The runs a table's report reads: `grids.kept_folders`, plus its sweep folder's runs that none of those has
    (failed, unfinished, not yet kept); its runs made on a GPU (kept apart) last: the report compares one device's."""
    from highway_repro.report import load_runs
    from highway_repro.report.runs import load_run

    sweep_dir, apart = runs_root / f"{name}-{scale}", results / runs_folder(name, scale, apart=True)
    folders = kept_folders(name, scale, results)
    kept = {f.name: load_run(f, results) for f in folders if f.parent != apart}
    local = load_runs(sweep_dir) if sweep_dir.is_dir() else []
    # a single run's is the sweep folder itself, kept as <kept>/run: the same job
    runs = {**{r.path.name if TARGETS[name].sweep else SINGLE_RUN: r for r in local}, **kept}
    return sorted(runs.values(), key=lambda r: r.path.name) + [load_run(f, results) for f in folders
                                                               if f.parent == apart]


def reused_names(name: str, scale: str, results: Path) -> frozenset:
    """The folder names of the finished runs study `name` takes from the tables it reuses (`keep` leaves them)."""
    reused = {results / runs_folder(o, scale) for o in TARGETS[name].reuse}
    return frozenset(f.name for f in kept_folders(name, scale, results)
                     if f.parent in reused and run_status(f) in FINISHED)


def other_recipe(part: str, scale: str, folders: list[Path]) -> dict[str, str]:
    """{folder name: the differing keys, or why} of the run folders of table `part` made with another recipe than
    the configs give their job now, or damaged, or that do not compose; one without saved config or overrides: none."""
    import yaml
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from highway_repro.train.recipe import in_recipe, recipe_diff
    from highway_repro.report.runs import read_overrides
    out, cells = {}, {}  # one composition per grid cell; a run's seed / trial is set on a copy of it
    for folder in folders:
        saved, ov = folder / "config_resolved.yaml", folder / ".hydra" / "overrides.yaml"
        if not (saved.exists() and ov.exists()):
            continue
        try:
            lines, there = read_overrides(ov), files.read_config(saved)
        except files.KeptFileError as e:  # a damaged run is no recipe's: never counted as done
            out[folder.name] = str(e)
            continue
        # without the overrides of keys outside the recipe (logger=wandb's ${hydra:...} names, threads, device)
        job = [o for o in lines or [] if override_key(o) not in ("experiment", "scale", "sweep")
               and not override_key(o).startswith("hydra") and in_recipe(override_key(o))]
        repeat = [o for o in job if override_key(o) in REPEAT_KEYS]
        cell = tuple(o for o in job if o not in repeat)
        try:  # a group choice or key the configs do not have; a seed the config cannot hold (a date, say)
            if cell not in cells:
                cfg = compose_table(TARGETS[part], scale, list(cell))
                cells[cell] = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
            cfg = cells[cell].copy()
            for o in repeat:
                key, value = o.split("=", 1)
                OmegaConf.update(cfg, key, yaml.safe_load(value))
            here = OmegaConf.to_container(cfg, resolve=True)
        except (HydraException, OmegaConfBaseException, ValueError) as e:
            out[folder.name] = f"its overrides do not compose ({type(e).__name__}: {' '.join(str(e).split())[:120]})"
            continue
        if diff := recipe_diff(there, here):
            out[folder.name] = "; ".join(diff)
    return out


def refuse_other_recipe(name: str, scale: str, done: list[str], sweep_dir: Path, results: Path) -> None:
    """ConfigError when a run that the table counts as done was made with another recipe than its job's now."""
    t = TARGETS[name]
    folders = [[sweep_dir / n if t.sweep else sweep_dir, results / runs_folder(name, scale) / n]
               + [results / runs_folder(o, scale) / n for o in t.reuse] for n in done]
    found = [next((d for d in ds if (d / "config_resolved.yaml").exists()), None) for ds in folders]
    if other := other_recipe(name, scale, [d for d in found if d is not None]):
        first, keys = next(iter(other.items()))
        raise ConfigError(f"[{name}] {len(other)} finished run(s) were made with another recipe than the config "
                          f"files now give (e.g. {first}: {keys}); move them out of results/ and "
                          f"{sweep_dir} and train the table again, or start the table anew with --fresh")


def wall_of(records: list[dict]) -> float:
    """The wall time of records that may overlap (a target's parts): their intervals' union, plus older records'."""
    spans = sorted(tuple(i) for r in records for i in r.get("intervals", []))
    total, end = 0.0, float("-inf")
    for a, b in spans:
        total += max(0.0, b - max(a, end))
        end = max(end, b)
    return total + sum(r["wall_s"] - sum(b - a for a, b in r.get("intervals", [])) for r in records)


