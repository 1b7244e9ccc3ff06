"""What our models are measured against: the peak of a large fp32 matmul (for MFU), HF transformers' Transformer-XL in
a worker process of its own venv, and the installed x-transformers."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import torch

from bench import cases, timing
from bench.report import REPO

HF_PYTHON_DEFAULT = REPO / ".venv-bench-hf" / "bin" / "python"
HF_VERSION = "4.36.2"


# ----------------------------------------------------------------------------- peak matmul

class PeakMatmul:
    """The reference peak: a large square fp32 matmul (n x n @ n x n, `reps` times per call)."""

    def __init__(self, n: int = 2048, reps: int = 4):
        g = torch.Generator().manual_seed(0)
        self.n, self.reps = n, reps
        self.a, self.b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
        self.c = torch.empty(n, n)
        self.flops = 2.0 * n ** 3 * reps

    def step(self) -> None:
        for _ in range(self.reps):
            torch.mm(self.a, self.b, out=self.c)


# ----------------------------------------------------------------------------- HF worker

class PeerAbsent(RuntimeError):
    """The peer's packages do not import in that Python (the reason is the message)."""


class HFWorker:
    """HF TransfoXLLMHeadModel in a subprocess (its own venv, or `env` with the carried packages first on its path),
    driven line by line; `size` and `init` as in bench/hf_txl_worker.py (default: the benchmark's size, fp32, CPU).
    Raises PeerAbsent where transformers does not import there."""

    def __init__(self, python: Path, threads: int, size: dict | None = None, env: dict | None = None,
                 stderr=None, **init):
        script = Path(__file__).with_name("hf_txl_worker.py")
        self.proc = subprocess.Popen([str(python), str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL if stderr is None else stderr, text=True, bufsize=1,
                                     env=env, start_new_session=True)  # a group of its own: killed as one
        size = size or {**cases.TXL, **cases.TXL_DATA}
        self.info = self.call({"cmd": "init", "threads": threads, "clock": timing.clock_name(), "size": size, **init})
        if "absent" in self.info:
            self.proc.wait(timeout=30)
            raise PeerAbsent(self.info["absent"])

    def call(self, msg: dict) -> dict:
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the HF worker died (run bench/hf_txl_worker.py by hand to see why)")
        return json.loads(line)

    def step(self) -> float:
        return self.call({"cmd": "step"})["s"]

    def close(self) -> None:
        try:
            self.call({"cmd": "quit"})
        except Exception:
            pass
        self.proc.wait(timeout=30)


def hf_python(arg: str | None) -> Path | None:
    cand = arg or os.environ.get("HIGHWAY_BENCH_HF_PYTHON") or str(HF_PYTHON_DEFAULT)
    return Path(cand) if Path(cand).exists() else None


def cases_version() -> str:
    try:
        from importlib.metadata import version

        return version("x-transformers")
    except Exception:
        return ""
