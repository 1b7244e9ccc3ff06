"""Rewrite run folders' saved configs to the current option names (`options.RENAMED`: `model.norm` ->
`model.norm_position`, `model.norm_style` -> `model.norm_impl`), so that the recipe guard compares them as they are.

    python scripts/migrate_kept_runs.py            # every kept run under results/ (its result is committed)
    python scripts/migrate_kept_runs.py runs/x     # the run folders under a folder of your own

Each `config_resolved.yaml` is read as data and written back as OmegaConf writes a run's config (the same bytes but
for the renamed keys, each in its place); a file that needs nothing is left untouched. Running it twice changes
nothing the second time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from highway_repro.options import RENAMED  # noqa: E402


def migrated(config: dict) -> dict | None:
    """The config with its model's old option names replaced in place, or None when it holds none."""
    model = config.get("model")
    if not isinstance(model, dict) or not RENAMED.keys() & model.keys():
        return None
    return {**config, "model": {RENAMED.get(k, k): v for k, v in model.items()}}


def migrate(folder: Path) -> list[Path]:
    """Rewrite every config_resolved.yaml under `folder` that holds an old name; the files rewritten."""
    done = []
    for path in sorted(folder.rglob("config_resolved.yaml")):
        new = migrated(OmegaConf.to_container(OmegaConf.load(path)))  # OmegaConf's safe loader, its value types
        if new is not None:
            path.write_text(OmegaConf.to_yaml(OmegaConf.create(new)))
            done.append(path)
    return done


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="*", type=Path, default=[ROOT / "results"])
    args = ap.parse_args(argv)
    for folder in args.folders:
        done = migrate(folder)
        print(f"{folder}: {len(done)} saved config(s) rewritten to the current option names")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
