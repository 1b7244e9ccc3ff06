"""Rewrite run folders to the current formats: saved configs to the current option names (`options.RENAMED`:
`model.norm` -> `model.norm_position`, `model.norm_style` -> `model.norm_impl`), so that the recipe guard compares
them as they are; checkpoints whose numpy RNG state is an array (older checkpoints) to that state as plain data, so
that `checkpoint.load` reads them with no allowlist; a table's record (`reproduce.json`) to the runner's command as it
is now (`python -m highway_repro.runner`, once `python -m highway_repro.reproduce`).

    python scripts/migrate_kept_runs.py            # every kept run under results/ (its result is committed)
    python scripts/migrate_kept_runs.py runs/x     # the run folders under a folder of your own
    python scripts/migrate_kept_runs.py x/last.pt  # one checkpoint file

Each `config_resolved.yaml` is read as data and written back as OmegaConf writes a run's config (the same bytes but
for the renamed keys, each in its place); each `ckpt/*.pt` that `checkpoint.load` names as the older format is read
with exactly the old numpy state's globals allowed (`checkpoint.load_old_format`) and written back with that state as
`checkpoint.rng_state` writes it (the same generator state). A file that needs nothing is left untouched; running it
twice changes nothing the second time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from highway_repro import files  # noqa: E402
from highway_repro.engine import checkpoint as ck  # noqa: E402
from highway_repro.engine.loggers import write_json_atomic  # noqa: E402
from highway_repro.options import RENAMED  # noqa: E402


def migrated(config: dict) -> dict | None:
    """The config with its model's old option names replaced in place, or None when it holds none."""
    model = config.get("model")
    if not isinstance(model, dict) or not RENAMED.keys() & model.keys():
        return None
    return {**config, "model": {RENAMED.get(k, k): v for k, v in model.items()}}


def plain_numpy_state(state) -> dict:
    """np.random.get_state()'s tuple (key a uint32 array) as `checkpoint.rng_state` stores it."""
    import torch

    name, key, pos, has_gauss, cached_gaussian = state
    return {"bit_generator": str(name), "key": torch.from_numpy(key.astype("int64")), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)}


def migrate_checkpoint(path: Path) -> bool:
    """Rewrite one checkpoint of the old numpy RNG format; False when it is in the current format (or not one)."""
    if not ck.old_format(path):  # the current format, or not a checkpoint this migration reads: left as it is
        return False
    c = ck.load_old_format(path)
    c["rng"]["numpy"] = plain_numpy_state(c["rng"]["numpy"])
    ck.atomic_torch_save(c, path)
    return True


OLD_RUNNER, RUNNER = "python -m highway_repro.reproduce ", "python -m highway_repro.runner "


def migrate_record(path: Path) -> bool:
    """Rewrite a table record's commands of the runner's old module name; False when it holds none."""
    record = json.loads(path.read_text())
    commands = [c.replace(OLD_RUNNER, RUNNER) if c.startswith(OLD_RUNNER) else c for c in record.get("commands", [])]
    if commands == record.get("commands", []):
        return False
    write_json_atomic(path, {**record, "commands": commands})  # as the runner writes it
    return True


def migrate(folder: Path) -> list[Path]:
    """Rewrite every config_resolved.yaml under `folder` that holds an old name and every checkpoint of the old
    numpy RNG format, and every reproduce.json naming the runner's old module; the files rewritten."""
    done = []
    for path in sorted(folder.rglob("config_resolved.yaml")):
        files.read_yaml(path, folder, inert=False)  # a kept file: no link, alias or `${` (KeptFileError), then
        new = migrated(OmegaConf.to_container(OmegaConf.load(path)))  # OmegaConf's safe loader, its value types
        if new is not None:
            files.write_atomic(path, OmegaConf.to_yaml(OmegaConf.create(new)), folder)
            done.append(path)
    done += [p for p in sorted(folder.rglob("reproduce.json")) if migrate_record(p)]
    return done + [p for p in sorted(folder.rglob("ckpt/*.pt")) if migrate_checkpoint(p)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="*", type=Path, default=[ROOT / "results"])
    args = ap.parse_args(argv)
    for folder in args.folders:
        done = ([folder] if migrate_checkpoint(folder) else []) if folder.is_file() else migrate(folder)
        print(f"{folder}: {len(done)} file(s) rewritten to the current formats")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
