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

Transformer-XL also runs with its relative attention through FlexAttention (`model.flex_attention=true`,
`kernels.rel_attention_flex`), compiled with `default` right after its own rows of each precision: the row that
decides whether flex or the hand-written core is the faster one (flex is made to be compiled; eager it is torch's
unfused reference).

After our rows of each precision, the peers (peers.py: HF's Transformer-XL, x-transformers) eager and compiled with
`default`, so that ours / peer is read compiled against compiled too (table "Ours beside the peers").

Dry run (CPU, smoke sizes): the same code path; inductor compiles for the CPU and `reduce-overhead` has no graphs
to capture there. The flex rows are left out of it and named in the section: torch 2.13's FlexAttention has no
CPU backward (tests/test_flex_attention.py compares its outputs with the core's on a CPU, its gradients on CUDA)."""

from __future__ import annotations

from .cases import CASE_BY_KEY, label
from .peers import MODES as PEER_MODES
from .peers import run_peers
from .phases import Ctx, phase
from .report import fmt, md_table, pct
from .throughput import throughput

CASES = ("txl6", "tlm3", "rt_char")  # Transformer-XL L6, Transformer-L3, R-Transformer-L3
MODES = ("eager", "default", "reduce-overhead")
PRECISIONS = ("bf16", "fp32")
NEED_S = {"eager": 15, "default": 75, "reduce-overhead": 90}  # per run on the GPU: compiling dominates
NEED_DRY_S = {"eager": 8, "default": 45, "reduce-overhead": 45}
FLEX_CASES = ("txl6",)  # the model with relative attention
FLEX_MODE = "default"
FLEX = "model.flex_attention=true"


def runs_of(key: str, modes, dry: bool) -> list[tuple[str, bool]]:
    """(mode, flex) of one case's runs in order: every mode, then flex compiled (a case with relative attention,
    not in a dry run: no CPU backward)."""
    flex = key in FLEX_CASES and FLEX_MODE in modes and not dry
    return [(m, False) for m in modes] + ([(FLEX_MODE, True)] if flex else [])


def run_compiled(ctx: Ctx, cases=CASES, modes=MODES, precisions=PRECISIONS) -> None:
    """Each case's baseline in every mode, eager first (taken from phase 4 when it ran there); bf16 for every case
    before fp32 (TF32), so that the time guard leaves out the fp32 rows first."""
    for precision in precisions:
        for key in cases:
            if ctx.args.cases and key not in ctx.args.cases:
                continue
            case = CASE_BY_KEY[key]
            variant, overrides = case.variants[0]
            for mode, flex in runs_of(key, modes, ctx.dry):
                name = label(variant, mode, flex)
                if (key, name, precision) in ctx.results:
                    continue
                extra = (() if mode == "eager" else (f"trainer.compile={mode}",)) + ((FLEX,) if flex else ())
                need = (NEED_DRY_S if ctx.dry else NEED_S)[mode]
                phase(ctx, f"compiled {key} {mode}{' flex' if flex else ''} {precision}", need, throughput, case,
                      name, (*overrides, *extra), precision, False)  # no evaluation pass: it would compile again
        if "peers" not in ctx.args.skip:
            run_peers(ctx, PEER_MODES, (precision,))  # after our rows of the precision: theirs
    compiled_section(ctx, cases, modes, precisions)


def compiled_section(ctx: Ctx, cases=CASES, modes=MODES, precisions=PRECISIONS) -> None:
    rows = []
    for key in cases:
        case = CASE_BY_KEY[key]
        variant = case.variants[0][0]
        for precision in precisions:
            eager = ctx.results.get((key, variant, precision))
            for mode, flex in runs_of(key, modes, False):
                r = ctx.results.get((key, label(variant, mode, flex), precision))
                if r is None:
                    continue
                speedup = eager["step_s"] / r["step_s"] if eager else None
                loss_diff = r["loss_last"] - eager["loss_last"] if eager and mode != "eager" else None
                if speedup is not None and mode != "eager":
                    ctx.rep.row("compiled", key, variant, precision, f"speedup_{mode}{'_flex' if flex else ''}",
                                speedup)
                core = ctx.results.get((key, label(variant, mode), precision)) if flex else None
                if core is not None:  # flex against the core, both compiled alike: the row that decides
                    ctx.rep.row("compiled", key, variant, precision, f"flex_vs_core_{mode}",
                                core["step_s"] / r["step_s"])
                rows.append([case.label, ctx.fp32_name if precision == "fp32" else precision,
                             f"{mode}, flex attention" if flex else mode,
                             f"{r['step_s'] * 1e3:.1f}", f"{r['rate']:,.0f} {r['unit']}/s",
                             fmt(speedup, 2) if speedup is not None else "", pct(r["mfu"]),
                             fmt(r["mem"], 2, "B") if r["mem"] is not None else "n/a",
                             f"{loss_diff:+.2e}" if loss_diff is not None else ""])
    lines = [f"Each row: the baseline at `scale={ctx.scale}` through `train.run`, {ctx.warmup} warm-up steps (they "
             f"hold the compilation) + {ctx.steps} timed ones, as phase 4 measures them; `default` = "
             "`trainer.compile=default` (inductor), `reduce-overhead` = inductor with CUDA graphs. speedup = eager "
             "step time / this one; last loss − eager's: the training loss of the last log interval, the same seed "
             "and batches (compiled dropout draws other masks: a difference of the size of dropout noise). "
             f"`{FLEX_MODE}, flex attention`: Transformer-XL with `{FLEX}` (its relative attention through "
             "FlexAttention), compiled alike; flex / core step time ratio in the CSV (`flex_vs_core_*`)"
             + (" (left out of a dry run: torch's FlexAttention has no CPU backward)." if ctx.dry else "."), "",
             *md_table(["model", "precision", "mode", "step ms", "throughput", "speedup", "MFU", "peak mem",
                        "last loss − eager"], rows, "---|---|---|---:|---:|---:|---:|---:|---:")]
    ctx.rep.section("compiled", "The compiled step: eager vs inductor vs CUDA graphs at the paper's sizes", lines)

