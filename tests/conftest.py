"""Shared test helpers and fixtures (the only conftest): compose the real configs (shrunk by scale=smoke) and run
them in-process, the data mirror, parameter counts, fault injection through the config.

Markers (pyproject.toml, `--strict-markers`): `slow` (subprocess pipelines, multi-process and long runs; the default
`make test` deselects them) and `cuda` (needs a CUDA GPU; skipped without one).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import signal
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

# property tests assert behaviour, never speed: no per-example deadline, no "too slow" health check on a busy machine
settings.register_profile("repo", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("repo")

# The stop signals as an interactive shell hands them over. A suite started in the background by a non-interactive
# shell inherits SIGINT ignored, which the project honours (`runtime.on_stop_signals`): the tests that send SIGINT
# to a run (in this process or to a child, which inherits the ignoring) would then test nothing.
for _s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    if signal.getsignal(_s) is signal.SIG_IGN:
        signal.signal(_s, signal.default_int_handler if _s == signal.SIGINT else signal.SIG_DFL)

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO / "configs"
EXPERIMENTS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))
SCALES = tuple(sorted(p.stem for p in (CONFIG_DIR / "scale").glob("*.yaml")))  # configs/scale/<name>.yaml


def compose(overrides: list[str]):
    """The composed training config, as `python -m highway_repro.train <overrides>` would see it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from highway_repro.resolvers import register

    register()  # `${hp:...}`, as the app registers it
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return hydra_compose("train", overrides=overrides)


def load_script(name: str):
    """scripts/<name>.py as a module (the scripts are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_cli(monkeypatch, capsys, args: list[str]) -> tuple[int, list[str]]:
    """`python -m highway_repro.train <args>` in this process: (exit code, the lines on stderr)."""
    from highway_repro.train import cli

    monkeypatch.setattr(sys, "argv", ["highway-train", *args])
    handlers, level = logging.root.handlers[:], logging.root.level
    try:
        with pytest.raises(SystemExit) as e:
            cli()
    finally:  # Hydra's job logging writes to this test's captured stderr: later tests must not log into it
        logging.root.handlers[:], logging.root.level = handlers, level
    return e.value.code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def mirror() -> Path | None:
    """The offline data mirror named by $HIGHWAY_DATA_MIRROR, if it is one (it has a SHA256SUMS file)."""
    m = os.environ.get("HIGHWAY_DATA_MIRROR")
    if m and (Path(m) / "SHA256SUMS").is_file():
        return Path(m)
    return None


needs_mirror = pytest.mark.skipif(
    mirror() is None, reason="HIGHWAY_DATA_MIRROR is not set to the offline data mirror (e.g. ../shared/data)")


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def overfit_one_batch(model: torch.nn.Module, tokens: torch.Tensor, steps: int = 40, lr: float = 1e-2) -> list[float]:
    """Adam on one batch of tokens (B, T + 1), next-token cross-entropy of `model(tokens[:, :-1])[0]`
    (logits (B, T, V)); the loss before each step. A language model that works fits it within a few dozen steps."""
    x, y = tokens[:, :-1], tokens[:, 1:]
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        logits = model(x)[0]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("cuda"):
            item.add_marker(skip)


@pytest.fixture
def allow_nan_data(monkeypatch):
    """`conftest.nan_data` may stand as the data's `_target_` (config.TARGETS allows only the project's builders)."""
    from highway_repro.train import config

    monkeypatch.setitem(config.TARGETS, "data", (*config.TARGETS["data"], "conftest.nan_data"))


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """Tiny models run faster on one thread, and tests do not fight over the cores (module fixtures included)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def tmp_mirror(tmp_path, monkeypatch):
    """An empty mirror folder + an empty cache folder, and a copy of the registry `sources.FILES` that `write_sums`
    commits the test's files into; returns (mirror, cache)."""
    from highway_repro.data import sources

    mirror, cache = tmp_path / "mirror", tmp_path / "cache"
    mirror.mkdir()
    cache.mkdir()
    monkeypatch.setenv("HIGHWAY_DATA_MIRROR", str(mirror))
    monkeypatch.setattr(sources, "FILES", dict(sources.FILES))
    return mirror, cache


def write_mirror_sums(mirror: Path) -> None:
    """A SHA256SUMS file for every file of a test mirror (as the real mirror has); it commits nothing."""
    lines = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  ./{p.relative_to(mirror).as_posix()}"
             for p in sorted(mirror.rglob("*")) if p.is_file() and p.name != "SHA256SUMS"]
    (mirror / "SHA256SUMS").write_text("\n".join(lines) + "\n")


def write_sums(mirror: Path) -> None:
    """The test mirror's SHA256SUMS, and its sha256s committed for this test in the copy of the registry
    `sources.FILES` that `tmp_mirror` gives each test: the test's files are the committed version (they are not the
    real data, so their published checksums are dropped)."""
    from highway_repro.data import sources

    write_mirror_sums(mirror)
    for p in sorted(mirror.rglob("*")):
        rel = p.relative_to(mirror).as_posix()
        if rel in sources.FILES and p.is_file():
            sources.FILES[rel] = dataclasses.replace(sources.FILES[rel], check=None,
                                                     sha256=hashlib.sha256(p.read_bytes()).hexdigest())


def nan_data(nan_steps=(), **kwargs):
    """Fault injection through the config, not through hooks in production code (`data._target_=conftest.nan_data`):
    `highway_repro.data.build(**kwargs)`, with x = NaN in the training batches of the steps in `nan_steps`."""
    from highway_repro import data as data_lib

    d = data_lib.build(**kwargs)
    clean = d.train_batch
    bad = {int(s) for s in nan_steps}

    def train_batch(step):
        x, y = clean(step)
        return (torch.full_like(x, float("nan")), y) if int(step) in bad else (x, y)

    d.train_batch = train_batch
    return d


@pytest.fixture(autouse=True)
def _no_gpu(monkeypatch):
    """Estimates in tests are the same on every machine: trainer.device=auto goes to the CPU (`estimate.on_cpu`)."""
    from highway_repro.runner import estimate, queue  # noqa: F401 (the queue binds the real gpu_ids before the patch)

    monkeypatch.setattr(estimate, "gpu_ids", lambda: [])
