"""Shared test helpers: compose the real configs (shrunk by scale=smoke) and run them in-process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO / "configs"
EXPERIMENTS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))
SCALES = ("paper", "cpu", "smoke")


def compose(overrides: list[str]):
    """The composed training config, as `python -m highway_repro.train <overrides>` would see it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    import highway_repro.train  # noqa: F401  (registers the `hp` resolver)

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return hydra_compose("train", overrides=overrides)


def mirror() -> Path | None:
    m = os.environ.get("HIGHWAY_DATA_MIRROR")
    if m and Path(m).is_dir():
        return Path(m)
    return None


needs_mirror = pytest.mark.skipif(mirror() is None, reason="HIGHWAY_DATA_MIRROR is not set to the offline data mirror")


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run faster on one thread, and tests do not fight over the two cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def tmp_mirror(tmp_path, monkeypatch):
    """An empty mirror folder + an empty cache folder; returns (mirror, cache)."""
    mirror, cache = tmp_path / "mirror", tmp_path / "cache"
    mirror.mkdir()
    cache.mkdir()
    monkeypatch.setenv("HIGHWAY_DATA_MIRROR", str(mirror))
    return mirror, cache


def write_sums(mirror: Path) -> None:
    """A SHA256SUMS file for every file of a test mirror (as the real mirror has)."""
    import hashlib

    lines = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  ./{p.relative_to(mirror).as_posix()}"
             for p in sorted(mirror.rglob("*")) if p.is_file() and p.name != "SHA256SUMS"]
    (mirror / "SHA256SUMS").write_text("\n".join(lines) + "\n")
