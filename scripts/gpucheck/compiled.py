"""Phase `compiled`: the language models at the paper's sizes, eager against `trainer.compile=default` (inductor)
and `trainer.compile=reduce-overhead` (inductor with CUDA graphs), each through `train.run` as the speed runs of
phase 4 (`throughput`), in bf16 and in fp32 with TF32 matmuls: step time, tokens/s, MFU, peak memory, and the
last training loss against eager's (the same seed and batches; inductor draws its dropout masks from its own
generator, so the losses differ by dropout noise, as two seeds' would: a check that nothing broke, not of equality,
which the slow tests check on CPU with dropout off). The first compiled call is step 2 (step 1, the FLOP-counted
one, runs the module's own forward), inside the warm-up on a GPU (10 steps).

On a GPU this phase alone fills a call (each compiled run compiles for about a minute), so `make gpu-check` leaves
it out and `make gpu-check-compiled` runs it with the matmul peak only (for the MFU; `--compiled`, the other phases
skipped, results in results/gpu_check_compiled.md); the dry run (`DRY=1`) runs it with the rest.

Dry run (CPU, smoke sizes): the same code path; inductor compiles for the CPU and `reduce-overhead` has no graphs
to capture there."""

from __future__ import annotations

from .cases import CASE_BY_KEY
from .phases import Ctx, phase
from .report import fmt, md_table, pct
from .throughput import throughput

CASES = ("txl6", "tlm3", "rt_char")  # Transformer-XL L6, Transformer-L3, R-Transformer-L3
MODES = ("eager", "default", "reduce-overhead")
PRECISIONS = ("bf16", "fp32")
NEED_S = {"eager": 15, "default": 75, "reduce-overhead": 90}  # per run on the GPU: compiling dominates
NEED_DRY_S = {"eager": 8, "default": 45, "reduce-overhead": 45}


def label(variant: str, mode: str) -> str:
    """The run's name in the report: the eager run keeps the variant's name (phase 4's rows are reused)."""
    return variant if mode == "eager" else f"{variant}+compile-{mode}"


def run_compiled(ctx: Ctx, cases=CASES, modes=MODES, precisions=PRECISIONS) -> None:
    """Each case's baseline in every mode, eager first (taken from phase 4 when it ran there); bf16 for every case
    before fp32 (TF32), so that the time guard leaves out the fp32 rows first."""
    for precision in precisions:
        for key in cases:
            if ctx.args.cases and key not in ctx.args.cases:
                continue
            case = CASE_BY_KEY[key]
            variant, overrides = case.variants[0]
            for mode in modes:
                name = label(variant, mode)
                if (key, name, precision) in ctx.results:
                    continue
                extra = () if mode == "eager" else (f"trainer.compile={mode}",)
                need = (NEED_DRY_S if ctx.dry else NEED_S)[mode]
                phase(ctx, f"compiled {key} {mode} {precision}", need, throughput, case, name,
                      (*overrides, *extra), precision, False)  # no evaluation pass: it would compile again
    compiled_section(ctx, cases, modes, precisions)


def compiled_section(ctx: Ctx, cases=CASES, modes=MODES, precisions=PRECISIONS) -> None:
    rows = []
    for key in cases:
        case = CASE_BY_KEY[key]
        variant = case.variants[0][0]
        for precision in precisions:
            eager = ctx.results.get((key, variant, precision))
            for mode in modes:
                r = ctx.results.get((key, label(variant, mode), precision))
                if r is None:
                    continue
                speedup = eager["step_s"] / r["step_s"] if eager else None
                loss_diff = r["loss_last"] - eager["loss_last"] if eager and mode != "eager" else None
                if speedup is not None and mode != "eager":
                    ctx.rep.row("compiled", key, variant, precision, f"speedup_{mode}", speedup)
                rows.append([case.label, ctx.fp32_name if precision == "fp32" else precision, mode,
                             f"{r['step_s'] * 1e3:.1f}", f"{r['rate']:,.0f} {r['unit']}/s",
                             fmt(speedup, 2) if speedup is not None else "", pct(r["mfu"]),
                             fmt(r["mem"], 2, "B") if r["mem"] is not None else "n/a",
                             f"{loss_diff:+.2e}" if loss_diff is not None else ""])
    lines = [f"Each row: the baseline at `scale={ctx.scale}` through `train.run`, {ctx.warmup} warm-up steps (they "
             f"hold the compilation) + {ctx.steps} timed ones, as phase 4 measures them; `default` = "
             "`trainer.compile=default` (inductor), `reduce-overhead` = inductor with CUDA graphs. speedup = eager "
             "step time / this one; last loss − eager's: the training loss of the last log interval, the same seed "
             "and batches (compiled dropout draws other masks: a difference of the size of dropout noise).", "",
             *md_table(["model", "precision", "mode", "step ms", "throughput", "speedup", "MFU", "peak mem",
                        "last loss − eager"], rows, "---|---|---|---:|---:|---:|---:|---:|---:")]
    ctx.rep.section("compiled", "The compiled step: eager vs inductor vs CUDA graphs at the paper's sizes", lines)

