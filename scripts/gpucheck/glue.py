"""What the phases borrow from the project: its composed configs, `train.run` with a Trainer subclass, the
matmul precision, and the run folders and their metrics."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

from .common import REPO
from .phases import Ctx


def compose(overrides) -> "DictConfig":  # noqa: F821
    """The composed training config, as `python -m highway_repro.train <overrides>` sees it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from highway_repro.resolvers import register

    register()

    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return hydra_compose("train", overrides=list(overrides))


@contextlib.contextmanager
def trainer_class(cls):
    """`train.run` builds `cls` (a Trainer subclass) instead of the Trainer (run imports the name when called)."""
    from highway_repro.engine import trainer as trainer_mod

    old = trainer_mod.Trainer
    trainer_mod.Trainer = cls
    try:
        yield cls
    finally:
        trainer_mod.Trainer = old


def recording_trainer():
    """A Trainer subclass that keeps the instances `train.run` builds (model, data and memory for the FLOP count)."""
    from highway_repro.engine.trainer import Trainer

    class Recording(Trainer):
        built: list = []

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            Recording.built.append(self)

    return Recording


@contextlib.contextmanager
def matmul_precision(tf32: bool):
    """fp32 matmuls in TF32 ("high") or in full fp32 ("highest"), restored afterwards."""
    import torch

    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def run_overrides(ctx: Ctx, precision: str, max_steps: int, log_every: int) -> list[str]:
    return [f"scale={ctx.scale}", f"trainer.device={ctx.device}", f"trainer.precision={precision}",
            f"trainer.max_steps={max_steps}", f"trainer.log_every={log_every}", "trainer.eval_every=0",
            "trainer.checkpoint_every=0", "trainer.eval_max_batches=null", "trainer.final_max_batches=1",
            "trainer.gate_stats_every=0", "trainer.progress=false", "trainer.splits=[val]", "logger=jsonl",
            "resume=null"]


def fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path
