"""Phase 3, the NaN policy on the device: a NaN loss injected at one step is caught by the trainer's deferred
check, the run stops as `diverged` at that step and keeps its last good checkpoint."""

from __future__ import annotations

from .glue import compose, fresh_dir, read_jsonl, run_overrides, trainer_class
from .phases import Ctx
from .report import md_table


def nan_check(ctx: Ctx) -> dict:
    """A NaN loss at step 12 (0-based) of a 16-step run with checkpoints every 5 steps: the trainer must stop
    as diverged at step 12 and keep the checkpoint of step 10. On CUDA the trainer's deferred check does it
    (no host sync per step; checked before the step-15 log); on CPU (dry run) the deferred path is forced."""
    import torch

    from highway_repro.engine import checkpoint as ckpt_lib
    from highway_repro.engine.trainer import Trainer
    from highway_repro.train import run

    bad, every, steps = 12, 5, 16
    seen = {"deferred_detections": 0}

    class NanAt(Trainer):
        defer_nan_check = None if not ctx.dry else True  # None: the trainer's own choice (deferred on CUDA)

        def _forward(self, batch, mems, score_len):
            loss, sums, new_mems = super()._forward(batch, mems, score_len)
            if self.model.training and self.step == bad:
                loss = loss * float("nan")
            return loss, sums, new_mems

        def _check_finite(self):
            if self._first_bad is not None and int(self._first_bad) < self.cfg.max_steps:
                seen["deferred_detections"] += 1
            return super()._check_finite()

    if ctx.missing.get("txl6"):
        raise RuntimeError(f"data missing: {', '.join(ctx.missing['txl6'])}")
    out = fresh_dir(ctx.runs / "nan")
    cfg = compose(["experiment=ht_enwik8_l6", "data=enwik8_prefix", *run_overrides(ctx, "bf16", steps, every),
                   f"trainer.checkpoint_every={every}"])
    with trainer_class(NanAt):
        final = run(cfg, out)
    ck = ckpt_lib.load(out / "ckpt" / "last.pt")
    finite = all(bool(torch.isfinite(v).all()) for v in ck["model"].values() if torch.is_tensor(v))
    logged = [x.get("step") for x in read_jsonl(out / "metrics.jsonl")]
    res = {"status": final.get("status"), "step": final.get("step"), "error": final.get("error"),
           "ckpt_step": ck.get("step"), "ckpt_finite": finite, "last_logged_step": max(logged, default=None),
           "deferred": seen["deferred_detections"] > 0, "device": ctx.device}
    ok = (res["status"] == "diverged" and res["step"] == bad and res["ckpt_step"] == 10 and finite
          and res["deferred"] and (res["last_logged_step"] or 0) <= 10)
    for k, v in res.items():
        ctx.rep.row("nan", "txl6", "baseline", "bf16", k, v)
    ctx.rep.section("nan", "NaN policy on the device (deferred check)", [
        f"Transformer-XL 6 layers (`ht_enwik8_l6`, `scale={ctx.scale}`), bf16, {steps} steps, "
        f"checkpoints every {every}, "
        f"`trainer.nan_policy=stop`; the loss of step {bad} is multiplied by NaN (a Trainer subclass).", "",
        *md_table(["expected", "got"], [
            ["status diverged", res["status"]], [f"stopped at step {bad}", res["step"]],
            ["error names the step", res["error"]], ["ckpt/last.pt is step 10", res["ckpt_step"]],
            ["its weights finite", finite], ["nothing logged after step 10", res["last_logged_step"]],
            ["caught by the deferred check" + ("" if not ctx.dry else " (forced on CPU)"), res["deferred"]]]),
    ])
    ctx.rep.target("nan", f"NaN policy on {ctx.device}: injected NaN caught by the deferred check, stop with the "
                          "last good checkpoint",
                   f"{res['status']} at step {res['step']}, ckpt step {res['ckpt_step']}",
                   f"diverged at {bad}, ckpt 10", ok)
    return res
