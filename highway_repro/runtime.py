"""Process settings for one run: torch's threads, the allocator, the seeds (`configure`, called by `train.run`), and
the stop signals (`on_stop_signals`, `stopped`).

Numbers depend on the seeds only: the thread count and the allocator change speed, not values.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def configure(threads: int, seed: int, deterministic: bool) -> None:
    """torch's intra-op threads (0: torch's default), freed memory kept in the process, then every seed."""
    import torch

    if threads:
        torch.set_num_threads(int(threads))
    keep_freed_memory()
    seed_everything(seed, deterministic)


def seed_everything(seed: int, deterministic: bool) -> None:
    """Python's, NumPy's and torch's generators from `seed`; `deterministic` also asks torch for deterministic
    kernels (and cuBLAS for a fixed workspace)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False


def keep_freed_memory() -> bool:
    """Speed on CPU, numbers unchanged: ask glibc's malloc to keep freed memory in the process (no mmap per large
    block: M_MMAP_MAX 0; no trimming of the heap top below 1 GiB: M_TRIM_THRESHOLD), as the GPU caching
    allocators do. By default a freed tensor of more than the mmap threshold (128 KiB, adapting up to 32 MiB) or at
    the top of the heap goes back to the kernel, and the next one faults in every 4 KiB page on first touch: a
    cpu-scale Transformer-L3 step took 2,500-7,500 page faults, and 1.04x the time (measured in
    configs/experiment_scale/ht_char_ptb/cpu.yaml). Peak memory stays resident. Returns False (nothing changed)
    where the C library has no mallopt (not glibc)."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # glibc's malloc.h
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 1 << 30))


def on_stop_signals(handler) -> dict:
    """`handler` for each stop signal (SIGINT, SIGTERM, SIGHUP) this process listens to; returns the handlers to put
    back. A signal the process was started ignoring stays ignored, as Python leaves an ignored SIGINT: `nohup`'s
    SIGHUP, the SIGINT of a job that a non-interactive shell started in the background. Main thread only (Python
    runs handlers there): elsewhere nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.signal(s, handler) for s in STOP_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN}


@contextlib.contextmanager
def stopped():
    """A stop signal outside the trainer's `fit` (which saves a checkpoint and writes metrics.json `interrupted`
    itself): start-up (importing torch, composing, building the data) or the last writes. The command ends at once
    with one line and exit code 128 + signal, never a traceback. Ended, not raised: an exception raised at an
    arbitrary point of an import can cross C++ code (torch's pybind11 modules abort the process) or be swallowed
    there (the run then goes on). What the run folder holds is whole (every file is written through a rename; a
    lock is a flock, dropped with the process), and the same command starts the run again (resume=auto)."""
    def stop(signum, frame):
        os.write(2, f"error: stopped by {signal.Signals(signum).name} outside training (start-up or the last writes); "
                    "nothing is half-written, and the same command continues the run\n".encode())
        os._exit(128 + signum)

    old = on_stop_signals(stop)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
