#!/usr/bin/env python3
"""`make gpu-check`: one prepared run that proves the paper-scale configs on one GPU.

    python scripts/gpu_check.py --prepare                  # on the CPU box: the data subset, the pure-Python
                                                           # dependencies and the peers' wheels to carry
                                                           # (data/gpu_mirror, data/gpu_cache, .gpu_deps, .gpu_peers)
    python scripts/gpu_check.py --data data/gpu_mirror     # on the GPU: about 6 min, hard stop at --budget-s
    python scripts/gpu_check.py --dry-run                  # on CPU at tiny sizes (< 1 min): the same code path
    make gpu-check [DRY=1]

Writes `<out>.md` and `<out>.csv` (default `results/gpu_check`), `<out>_curves.csv` and `<out>_curves.png`:

1. machine facts (GPU, memory, driver, CUDA, torch) and the matmul peak measured in the same run
   (bf16, TF32, fp32);
2. data: where the mirror is, what it holds, what is missing;
3. the NaN policy on CUDA: a NaN loss injected at one step is caught by the trainer's deferred check,
   the run stops as `diverged` at that step and keeps its last good checkpoint;
4. every paper-scale model (baseline and one gated variant), through the real configs, `train.run` and
   the Trainer: warm-up + timed steps in bf16 autocast and in fp32 with TF32 matmuls; step time, tokens
   or samples/s, MFU against the measured peak of that precision (FLOPs: torch.utils.flop_counter with
   the formulas of the project's counter), peak CUDA memory, the loss after the steps (finite, falling,
   bf16 against fp32) and the evaluation speed; beside Transformer-XL L6 and Transformer-L3, their peers (HF
   transformers' TransfoXLLMHeadModel, x-transformers) at the same size, ours / peer tokens/s (`peers.py`);
5. the learning curve: Transformer-XL 6 layers at the paper's size and hyperparameters, baseline and
   SDU tanh, 400 steps on the enwik8 prefix, validation bpc at step 400 beside the official logs;
6. `torchrun --nproc_per_node=1` with nccl (process group, DDP wrapper, collectives, checkpoint with
   the gathered memory): a run, and the same run stopped halfway and resumed, end equal;
7. the CUDA tests (`pytest -m cuda`);
8. the expected time of every paper table on this GPU: runs x steps x step time + evaluations.

Each measurement runs in its own try/except: an error goes into the report and the check goes on. The
report is rewritten after every phase; a phase that no longer fits into the time left is skipped (and
says so); a time guard writes the report and exits at --budget-s plus a short grace.

Needs torch and numpy, and hydra-core + omegaconf for the configs: when the interpreter lacks them,
the pure-Python copies that `--prepare` puts into `.gpu_deps/` are used. matplotlib only for the PNG
(`--plot` draws it later from the CSV).

The parts, one file per phase, in scripts/gpucheck/: `machine.py` (1), `data.py` (2 and `--prepare`), `nan.py`
(3), `throughput.py` (4), `curve.py` (5), `distributed.py` (6), `cuda_tests.py` (7), `tables.py` (8); around them
`cases.py` (the models measured), `peers.py` (the other libraries' models beside ours, in phases 4 and
`compiled`), `report.py` (the report), `phases.py` (the time checks and the guard),
`glue.py` (configs and runs of the project), `common.py` (paths, modules, clock, targets) and `cli.py` (the
options and the order of the phases).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the parts, scripts/gpucheck/, without an installed package

from gpucheck.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
