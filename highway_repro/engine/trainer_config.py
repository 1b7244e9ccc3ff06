"""The trainer's settings and the small pieces of its loop that know nothing of a run: `TrainerConfig` (the
`trainer:` config group, checked on construction), the device, the TF32 switch, the process's CPU time, and the two
ways a run ends early (`Diverged`, `Interrupted`). No torch at import: the config check (`config.py`) reads
`TrainerConfig` before torch is loaded."""

from __future__ import annotations

import resource
from contextlib import contextmanager
from dataclasses import dataclass, field

from highway_repro.errors import HighwayError

MEMORY_FORMATS = ("contiguous", "channels_last")
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")


def memory_format(name: str):
    """torch's memory format of `trainer.memory_format`."""
    import torch

    return {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}[name]


@dataclass
class TrainerConfig:
    max_steps: int = 1000
    log_every: int = 50
    eval_every: int = 500  # 0 = only at the end
    eval_max_batches: int | None = None  # cap for intermediate evaluations
    final_max_batches: int | None = None  # cap for the final evaluation (smoke tests only; null = full)
    eval_train: bool = False  # also evaluate the training set without augmentation at each evaluation
    eval_stack: int = 1  # evaluate up to N batches of one shape as one (a model without memory)
    checkpoint_every: int = 500  # 0 = only at the end
    grad_clip: float | None = None
    precision: str = "fp32"  # fp32 | bf16 (autocast)
    tf32: bool = False  # CUDA float32 matrix products and cuDNN in TF32 during fit (`tf32`); false: torch's settings
    memory_format: str = "contiguous"  # contiguous | channels_last: 4-D weights and inputs (the conv nets: faster
    #                                    on CPU)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    compile: str = "off"  # off | default | reduce-overhead (CUDA graphs on a GPU) | max-autotune: torch.compile's mode
    compile_backend: str = "inductor"  # torch.compile's backend (aot_eager: the graphs without generated code)
    gate_stats_every: int = 0  # 0 = off; else record gate statistics on every n-th step
    nan_policy: str = "stop"  # stop | skip
    max_bad_steps: int = 10  # with nan_policy=skip: stop after this many skipped steps
    final_eval: str = "last"  # last | best: which weights give the final val/test numbers
    peak_flops: float | None = None  # the device's peak FLOP/s for perf/mfu; null = a known GPU's datasheet value
    progress: bool = True
    splits: list = field(default_factory=lambda: ["val", "test"])

    def __post_init__(self):
        checks = [
            ("max_steps", self.max_steps >= 1, ">= 1"), ("log_every", self.log_every >= 1, ">= 1"),
            ("eval_every", self.eval_every >= 0, ">= 0"), ("checkpoint_every", self.checkpoint_every >= 0, ">= 0"),
            ("eval_stack", self.eval_stack >= 1, ">= 1"),
            ("precision", self.precision in ("fp32", "bf16"), "'fp32' or 'bf16'"),
            ("memory_format", self.memory_format in MEMORY_FORMATS, "'contiguous' or 'channels_last'"),
            ("nan_policy", self.nan_policy in ("stop", "skip"), "'stop' or 'skip'"),
            ("final_eval", self.final_eval in ("last", "best"), "'last' or 'best'"),
            ("compile", self.compile in COMPILE_MODES, ", ".join(COMPILE_MODES)),
            ("grad_clip", self.grad_clip is None or self.grad_clip > 0, "> 0 or null"),
            ("peak_flops", self.peak_flops is None or self.peak_flops > 0, "> 0 or null"),
        ]
        for name, ok, valid in checks:
            if not ok:
                raise HighwayError(f"trainer.{name}={getattr(self, name)!r} is not allowed (valid: {valid})")


def resolve_device(name: str):
    """The torch.device of `trainer.device`."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise HighwayError(f"trainer.device={name!r} but CUDA is not available (valid here: auto, cpu)")
    return dev


def cpu_seconds() -> float:
    """User + system CPU time of this process so far (all its threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Diverged(RuntimeError):
    pass


class Interrupted(Exception):
    """A stop signal during the final evaluation (raised by `Trainer.evaluate` and `_stop_point`, caught in `fit`)."""


@contextmanager
def tf32(on: bool):
    """`trainer.tf32`: CUDA float32 matrix products and cuDNN convolutions / RNNs in TF32 (10-bit mantissa: faster,
    about 1e-3 relative error per product), the process's switches restored afterwards. Off, torch's switches stay
    as they are: its defaults are full fp32 matrix products (and TF32 in cuDNN); a caller may have set its own
    (`torch.set_float32_matmul_precision`). No effect on CPU."""
    if not on:
        yield
        return
    import torch

    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
