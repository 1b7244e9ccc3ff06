"""Process settings for one run: torch's threads, the allocator, the seeds (`configure`, called by `train.run`).

Numbers depend on the seeds only: the thread count and the allocator change speed, not values.
"""

from __future__ import annotations

import os
import random


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
