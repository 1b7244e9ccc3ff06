"""Peak memory of training steps of one benchmark case, in a fresh process (CPU: resident set size).

    python -m bench.memory CASE [--steps 2] [--threads N]

Prints one JSON line: RSS after building model, batch and optimizer (`setup_kb`, freed memory
trimmed), the peak
RSS over the training steps (`peak_kb`) and their difference (`step_kb`: activations,
gradients, optimizer state and allocator slack of a step). The peak is the kernel's high-water
mark of this process's address space (VmHWM): getrusage's ru_maxrss would not do in a child,
it keeps the parent's RSS across fork + exec. On CUDA the same
figures come from torch.cuda.max_memory_allocated (`device: cuda`).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys


def rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def maxrss_kb() -> int:
    """Peak RSS of this address space (VmHWM, kB); ru_maxrss where /proc is missing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def trim() -> None:
    """Give freed heap memory back to the kernel (glibc malloc_trim), so that RSS counts live memory only."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    import gc

    import torch

    from bench import cases

    if args.threads:
        torch.set_num_threads(args.threads)
    case = cases.build(args.case)
    gc.collect()
    trim()  # building may run a forward pass (Transformer-XL fills its memory): its freed blocks are not setup
    setup, setup_max = rss_kb(), maxrss_kb()
    for _ in range(args.steps):
        case.step()
    peak = maxrss_kb()
    print(json.dumps({"case": args.case, "device": "cpu", "params": case.params, "setup_kb": setup,
                      "setup_maxrss_kb": setup_max, "peak_kb": peak, "step_kb": max(0, peak - setup)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
