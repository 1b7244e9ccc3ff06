"""Schedules, tasks (metric formulas), checkpoints and loggers, against hand-computed values."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch

from highway_repro.engine import checkpoint as ck
from highway_repro.engine.loggers import JsonlLogger
from highway_repro.engine.schedules import build
from highway_repro.errors import HighwayError
from highway_repro.engine.tasks import Classification, LanguageModel


def _lrs(kind, steps, max_steps=None, **kw):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    s = build(opt, max_steps=max_steps or steps, kind=kind, **kw)
    out = []
    for _ in range(steps):
        out.append(s.lr())
        opt.step()
        s.step()
    return out, s


def test_step_schedule():
    lrs, _ = _lrs("step", 10, milestones=[4, 8], gamma=0.1)
    assert lrs[:4] == [1.0] * 4 and lrs[4:8] == pytest.approx([0.1] * 4) and lrs[8:] == pytest.approx([0.01] * 2)


def test_exponential_schedule():
    lrs, _ = _lrs("exponential", 7, gamma=0.5, every=3)
    assert lrs == pytest.approx([1, 1, 1, 0.5, 0.5, 0.5, 0.25])


def test_cosine_schedule_goes_to_zero():
    lrs, _ = _lrs("cosine", 101, max_steps=100)
    assert lrs[0] == 1.0 and lrs[50] == pytest.approx(0.5) and lrs[100] == pytest.approx(0.0, abs=1e-12)


def test_cosine_horizon_is_its_own_option():
    """A 400-step run with horizon 40,000 follows the first 400 steps of the 40,000-step cosine (the paper's
    Transformer-XL schedule), not a cosine squeezed into 400 steps."""
    lrs, _ = _lrs("cosine", 401, max_steps=400, horizon=40000)
    assert lrs[400] == pytest.approx(0.5 * (1 + math.cos(math.pi * 400 / 40000))) and lrs[400] > 0.999
    assert _lrs("cosine", 401, max_steps=400)[0][400] == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match=r"optim.scheduler.horizon=0 is not allowed \(valid: a positive integer"):
        _lrs("cosine", 2, horizon=0)


def test_plateau_schedule_divides_on_stall():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=2.0)
    s = build(opt, max_steps=10, kind="plateau", factor=0.5, patience=0)
    s.on_eval(1.0)
    s.on_eval(1.0)  # no improvement
    assert s.lr() == pytest.approx(1.0)
    state = s.state_dict()
    s2 = build(torch.optim.SGD([p], lr=1.0), max_steps=10, kind="plateau", factor=0.5, patience=0)
    s2.load_state_dict(state)
    assert s2.plateau.best == 1.0


def test_unknown_schedule_kind():
    with pytest.raises(ValueError, match="optim.scheduler.kind='warm' is not known"):
        _lrs("warm", 2)


def test_lm_metrics_formula():
    # two positions, vocab 2, hand-set logits: nll = -log softmax
    logits = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0]]])  # p(target)= 1/2, 3/4
    y = torch.tensor([[1, 0]])

    class M(torch.nn.Module):
        def forward(self, x, mems=None, score_len=None):  # the head on the last score_len positions
            return (logits if score_len is None else logits[:, -score_len:]), None

    loss, sums, _ = LanguageModel().forward(M(), (y, y))
    nats = (math.log(2) + math.log(4 / 3)) / 2
    m = LanguageModel.summarize(sums)
    assert loss.item() == pytest.approx(nats)
    assert m["bpc"] == pytest.approx(nats / math.log(2)) and m["ppl"] == pytest.approx(math.exp(nats))
    # scoring only the last position (R-Transformer protocol)
    _, sums, _ = LanguageModel().forward(M(), (y, y), score_len=1)
    assert LanguageModel.summarize(sums)["loss"] == pytest.approx(math.log(4 / 3))


def test_classification_metrics():
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]])

    _, sums, _ = Classification().forward(M(), (None, torch.tensor([0, 1, 1])))
    m = Classification.summarize(sums)
    assert m["acc"] == pytest.approx(2 / 3)


def test_checkpoint_roundtrip_corrupt_fallback_and_mismatch(tmp_path):
    model = torch.nn.Linear(3, 2)
    ck.save(tmp_path, "last", {"model": model.state_dict(), "step": 1})
    ck.save(tmp_path, "last", {"model": model.state_dict(), "step": 2})
    assert (tmp_path / "prev.pt").exists()
    assert ck.load_latest(tmp_path)["step"] == 2
    (tmp_path / "last.pt").write_bytes((tmp_path / "last.pt").read_bytes()[:100])  # truncated
    with pytest.raises(ck.CheckpointError, match="last.pt is corrupt or truncated"):
        ck.load(tmp_path / "last.pt")
    assert ck.load_latest(tmp_path)["step"] == 1  # falls back to the previous good one
    other = torch.nn.Linear(4, 2)
    with pytest.raises(ck.CheckpointError, match=r"shape mismatch: weight \(2, 3\) vs \(2, 4\)"):
        ck.load_model_state(other, model.state_dict())
    with pytest.raises(ck.CheckpointError, match="missing in checkpoint: bias"):
        ck.load_model_state(model, {"weight": model.weight.detach()})


def test_jsonl_truncate_after(tmp_path):
    lg = JsonlLogger(tmp_path)
    for s in (1, 2, 3):
        lg.log({"train/loss": float(s)}, s)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('[1]\n{"step": 4, "trai')  # a line no run writes; a line cut by a kill
    outside = tmp_path / "outside.txt"
    outside.write_text("kept\n")
    (tmp_path / "metrics.jsonl.tmp").symlink_to(outside)  # a planted link beside the history: never written through
    lg.truncate_after(2)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2] and outside.read_text() == "kept\n"


def test_the_w_and_b_files_of_a_resumed_run_are_read_through_no_link(tmp_path):
    """`wandb_last_step` reads a run folder's W&B run files as kept files: a link below `wandb/` is refused."""
    from highway_repro.engine.loggers import wandb_last_step
    from highway_repro.files import KeptFileError

    (tmp_path / "outside.wandb").write_bytes(b"elsewhere")
    segment = tmp_path / "wandb" / "offline-run-20260101_000000-abc"
    segment.mkdir(parents=True)
    (segment / "run-abc.wandb").symlink_to(tmp_path / "outside.wandb")
    with pytest.raises(KeptFileError, match="symbolic link"):
        wandb_last_step(tmp_path / "wandb", "abc")


# ----------------------------------------------------------------------------- the loop: throughput, FLOPs, gates

class _Images:
    """Four fixed batches of B random d-dim inputs and K classes (the data interface of docs/DESIGN.md)."""

    kind, splits, steps_per_epoch = "classification", ("test",), 4

    def __init__(self, B=8, d=5, K=3):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(4, B, d, generator=g), torch.randint(0, K, (4, B), generator=g)

    def train_batch(self, step):
        return self.x[step % 4], self.y[step % 4]

    def eval_batches(self, split):
        yield self.x[0], self.y[0]


def _fit(tmp_path, model, max_steps=4, gate_recorder=None, **cfg):
    from highway_repro.engine.trainer import Trainer, TrainerConfig

    tmp_path.mkdir(exist_ok=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer_cfg = TrainerConfig(**{"max_steps": max_steps, "log_every": 2, "eval_every": 0, "checkpoint_every": 0,
                                   "progress": False, "device": "cpu", **cfg})
    trainer = Trainer(model, _Images(), Classification(), opt, build(opt, max_steps=max_steps), tmp_path,
                      JsonlLogger(tmp_path), trainer_cfg, gate_recorder=gate_recorder)
    final = trainer.fit()
    return final, [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]


class _ImagesWithVal(_Images):
    splits = ("val", "test")


def test_best_checkpoint_is_chosen_on_the_evaluation_subset_at_every_step(tmp_path):
    """trainer.final_eval=best with capped intermediate evaluations (eval_max_batches): the last step is judged on
    that same subset, not on the full pass that gives the final numbers (a full val pass is not comparable with a
    third of it: the first third may be harder or easier). Scripted losses: subset 2.0 at step 2; at step 4 the
    subset says 2.5 (worse) while the full pass says 1.0, so the step-2 weights must stay the best."""
    from highway_repro.engine import checkpoint as ck
    from highway_repro.engine.trainer import Trainer, TrainerConfig

    model = torch.nn.Linear(5, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cfg = TrainerConfig(max_steps=4, log_every=2, eval_every=2, eval_max_batches=1, checkpoint_every=0,
                        progress=False, device="cpu", final_eval="best")
    trainer = Trainer(model, _ImagesWithVal(), Classification(), opt, build(opt, max_steps=4), tmp_path,
                      JsonlLogger(tmp_path), cfg)
    scripted = {(2, 1): 2.0, (4, 1): 2.5, (4, None): 1.0}  # (step, max_batches) -> val loss
    seen = {}  # split -> the weights of its last evaluation

    def evaluate(split, max_batches=None):
        seen[split] = model.weight.detach().clone()
        return {f"{split}/loss": scripted.get((trainer.step, max_batches), 9.0)}

    trainer.evaluate = evaluate
    final = trainer.fit()
    best, last = (ck.load(tmp_path / "ckpt" / f"{n}.pt") for n in ("best", "last"))
    assert best["step"] == 2 and final["val/best_loss"] == 2.0
    # the final val/test numbers come from the step-2 weights; last.pt keeps the last step's (trained on from there)
    assert torch.equal(seen["test"], best["model"]["weight"]) and torch.equal(seen["val"], best["model"]["weight"])
    assert not torch.equal(best["model"]["weight"], last["model"]["weight"])
    assert torch.equal(model.weight, last["model"]["weight"])
    # uncapped intermediate evaluations: the final full pass is the same measurement and may win
    trainer.cfg = TrainerConfig(**{**cfg.__dict__, "eval_max_batches": None, "max_steps": 6})
    scripted.update({(6, None): 1.5})
    assert trainer.fit()["val/best_loss"] == 1.5 and ck.load(tmp_path / "ckpt" / "best.pt")["step"] == 6


def test_run_times_include_the_final_evaluation(tmp_path):
    """time/wall_s and time/cpu_s of a finished run cover its final val/test passes: a final evaluation that
    burns 0.3 CPU-seconds shows in both, and in time/final_eval_s."""
    from highway_repro.engine.trainer import Trainer, TrainerConfig

    model = torch.nn.Linear(5, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(model, _Images(), Classification(), opt, build(opt, max_steps=2), tmp_path,
                      JsonlLogger(tmp_path), TrainerConfig(max_steps=2, log_every=1, eval_every=0, checkpoint_every=0,
                                                           progress=False, device="cpu"))

    def busy_evaluate(split, max_batches=None):
        t0 = time.process_time()
        while time.process_time() - t0 < 0.3:
            pass
        return {f"{split}/loss": 1.0}

    trainer.evaluate = busy_evaluate
    final = trainer.fit()
    assert final["time/final_eval_s"] >= 0.3 and final["time/wall_s"] >= final["time/final_eval_s"]
    assert final["time/cpu_s"] >= 0.3


def test_step_flops_of_a_linear_layer():
    """forward x W^T: 2*B*d*K; backward: the weight gradient 2*B*d*K (the input needs none); bias adds are free."""
    from highway_repro.engine.flops import StepFlops

    B, d, K = 8, 5, 3
    model, x = torch.nn.Linear(d, K), torch.randn(B, d)
    counter = StepFlops()
    with counter.count(x) as step:
        model(x).sum().backward()
    assert step.mode is not None and step.flops == 4 * B * d * K
    with counter.count(torch.randn(B, d)) as again:  # the same shape: not counted again, same figure
        model(x).sum().backward()
    assert again.mode is None and again.flops == 4 * B * d * K
    with counter.count(torch.randn(2 * B, d)) as skipped:  # a new shape whose step is skipped: no count kept
        model(torch.randn(2 * B, d))
        skipped.cancel()
    assert skipped.flops == 0 and len(counter.by_shape) == 1


def test_training_logs_throughput_flops_and_mfu(tmp_path):
    d, K = 5, 3
    _, lines = _fit(tmp_path, torch.nn.Linear(d, K), peak_flops=1e9)
    logged = [x for x in lines if "train/loss" in x]
    assert [x["step"] for x in logged] == [2, 4]
    for x in logged:  # FLOPs per sample of a linear classifier: 4 * d * K (see above)
        assert x["perf/flops_per_s"] / x["perf/samples_per_s"] == pytest.approx(4 * d * K)
        assert x["perf/mfu"] == pytest.approx(x["perf/flops_per_s"] / 1e9)
    # (a run's CPU and wall time: test_run_times_include_the_final_evaluation)
    _, lines = _fit(tmp_path / "no_peak", torch.nn.Linear(d, K))  # CPU: no datasheet peak, no MFU
    assert not any("perf/mfu" in x for x in lines) and any("perf/flops_per_s" in x for x in lines)


def test_gate_recorder_is_injected_and_records_only_the_chosen_steps(tmp_path):
    """The engine gets the recorder from its caller (`highway_repro.train` passes models.probe.GateRecorder): a
    context manager around the forward pass of every gate_stats_every-th step, whose stats() are logged under gates/."""
    entered = []

    class Recorder:
        def __init__(self, model):
            self.model = model

        def __enter__(self):
            entered.append(self.model.training)
            return self

        def __exit__(self, *exc):
            pass

        def stats(self):
            return {"layer": {"mean": 0.25}}

    model = torch.nn.Linear(5, 3)
    _, lines = _fit(tmp_path, model, max_steps=6, gate_recorder=Recorder, gate_stats_every=3)
    assert entered == [True, True]  # steps 3 and 6, in training mode
    assert [x["step"] for x in lines if "gates/layer/mean" in x] == [3, 6]
    assert all(x["gates/layer/mean"] == 0.25 for x in lines if "gates/layer/mean" in x)


def test_final_train_split_is_a_full_pass_of_the_final_weights(tmp_path):
    # splits [train] (Fig. 1's "final training loss"): an evaluation pass with the final weights, not the running
    # mean of the last log interval; _Images.eval_batches yields its batch 0
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    final, _ = _fit(tmp_path, model, splits=["train"])
    x, y = _Images().x[0], _Images().y[0]
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(model(x), y).item()
    assert final["train/loss"] == pytest.approx(expected, rel=1e-6)
    assert final["train/acc"] == pytest.approx((model(x).argmax(-1) == y).float().mean().item())


class _Pictures(_Images):
    """_Images as 2 x 4 x 4 pictures (N C H W)."""

    def __init__(self):
        super().__init__(B=8, d=32, K=3)
        self.x = self.x.reshape(4, 8, 2, 4, 4)


def test_channels_last_trains_the_same_numbers_in_the_other_layout(tmp_path):
    from highway_repro.engine.trainer import Trainer, TrainerConfig

    def fit(fmt):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                    torch.nn.Linear(64, 3))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        cfg = TrainerConfig(max_steps=6, log_every=2, eval_every=0, checkpoint_every=0, progress=False,
                            device="cpu", memory_format=fmt, splits=["test"])
        out = tmp_path / fmt
        out.mkdir()
        final = Trainer(model, _Pictures(), Classification(), opt, build(opt, max_steps=6), out, JsonlLogger(out),
                        cfg).fit()
        return final, model[0].weight

    plain, w_plain = fit("contiguous")
    last, w_last = fit("channels_last")
    assert w_last.is_contiguous(memory_format=torch.channels_last) and not w_plain.is_contiguous(
        memory_format=torch.channels_last)
    assert last["test/loss"] == pytest.approx(plain["test/loss"], rel=1e-5)
    torch.testing.assert_close(w_last, w_plain, atol=1e-6, rtol=0)
    with pytest.raises(Exception, match="memory_format='nhwc' is not allowed"):
        TrainerConfig(max_steps=1, memory_format="nhwc")


@pytest.mark.parametrize("tf32", [False, True])
def test_tf32_switch_holds_during_fit_and_is_restored(tmp_path, monkeypatch, tf32):
    """trainer.tf32=true: CUDA matrix products and cuDNN in TF32 for the training and the final evaluation, torch's
    switches as they were afterwards; false leaves the switches alone (here a caller's 'high' matmul precision)."""
    from highway_repro.engine.trainer import Trainer

    seen = []
    forward = Trainer._forward

    def spy(self, *a, **k):
        seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
        return forward(self, *a, **k)

    monkeypatch.setattr(Trainer, "_forward", spy)
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("high")  # the caller's own choice: TF32 matmuls, cuDNN unchanged
    try:
        torch.backends.cudnn.allow_tf32 = False
        _fit(tmp_path, torch.nn.Linear(5, 3), tf32=tf32)
        assert seen and set(seen) == ({(True, True)} if tf32 else {(True, False)})  # 4 steps and the final eval
        assert (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32) == ("high", False)
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]


@pytest.mark.parametrize("kind", ["transformer_lm", "transformer_xl"])
def test_stacked_evaluation_scores_what_batch_1_scores(tmp_path, kind):
    """char-PTB's protocol evaluates one window at a time (eval_batch_size 1); trainer.eval_stack=8 puts up to 8
    windows of one shape through a model without memory as one batch: the same loss (to float rounding) in fewer
    forward passes. A model with memory (Transformer-XL) keeps its windows one by one, in order: the same numbers."""
    import numpy as np

    from highway_repro.data.text import LMData
    from highway_repro.engine.tasks import LanguageModel
    from highway_repro.engine.trainer import Trainer, TrainerConfig
    from highway_repro.models.transformer_lm import TransformerLM
    from highway_repro.models.transformer_xl import TransformerXL

    class Tok:
        kind, vocab_size = "fake", 11

    rng = np.random.default_rng(0)
    data = LMData("toy", {s: rng.integers(0, 11, 300) for s in ("train", "val", "test")}, Tok(), batch_size=2,
                  seq_len=12, eval_batch_size=1, eval_seq_len=12, eval_score_len=4)
    out = {}
    for stack in (1, 8):
        torch.manual_seed(0)
        small = {"vocab_size": 11, "n_layers": 1, "d_model": 8, "n_heads": 2, "d_ff": 16, "dropout": 0.0}
        model = TransformerLM(**small) if kind == "transformer_lm" else TransformerXL(**small, d_head=4, tgt_len=12,
                                                                                      mem_len=12)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        cfg = TrainerConfig(max_steps=1, eval_every=0, checkpoint_every=0, progress=False, device="cpu",
                            eval_stack=stack)
        t = Trainer(model, data, LanguageModel(), opt, build(opt, max_steps=1), tmp_path / str(stack),
                    JsonlLogger(tmp_path), cfg)
        calls = []
        forward = t._forward
        t._forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
        out[stack] = (t.evaluate("test")["test/loss"], len(calls))
    windows = len(data.eval_windows("test"))
    assert out[1][1] == windows
    if kind == "transformer_lm":
        assert out[8][1] < windows / 4 and math.isclose(out[8][0], out[1][0], rel_tol=1e-6)
    else:
        assert out[8] == out[1]


COMPILED_GRAPHS: list = []  # the graphs the `counting` backend was given


def _counting(gm, inputs):
    """A torch.compile backend that runs the captured graph as it is, and keeps it."""
    COMPILED_GRAPHS.append(gm)
    return gm.forward


@pytest.mark.parametrize("backend", ["counting", pytest.param("inductor", marks=pytest.mark.slow)])
def test_a_compiled_model_trains_as_the_eager_one(tmp_path, backend):
    """trainer.compile=default (torch.compile, static shapes): the same losses as eager within float tolerance, the
    checkpoint of the module itself. `counting` runs the captured graphs as they are and counts them (fast);
    inductor generates code (20-70 s a model here: slow)."""
    import torch._dynamo

    from highway_repro.engine.checkpoint import load

    if "counting" not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(_counting, name="counting")
    runs = {}
    for mode in ("off", "default"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
        final, lines = _fit(tmp_path / mode, model, max_steps=6, log_every=1, compile=mode, compile_backend=backend,
                            checkpoint_every=3)
        runs[mode] = [x["train/loss"] for x in lines if "train/loss" in x]
        assert final["status"] == "done"
        assert set(load(tmp_path / mode / "ckpt" / "last.pt")["model"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert len(runs["off"]) == 6 and all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(runs["off"], runs["default"]))
    assert COMPILED_GRAPHS or backend != "counting"  # it did compile: the forward went through the backend


def test_an_unknown_compile_backend_is_one_line(tmp_path):
    with pytest.raises(HighwayError, match=r"trainer.compile_backend='nope' is not known \(valid: .*inductor"):
        _fit(tmp_path, torch.nn.Linear(5, 3), compile="default", compile_backend="nope")


@pytest.mark.slow
@pytest.mark.parametrize("family", ["mlp", "mnist_conv", "transformer_l3", "transformer_xl", "r_transformer"])
def test_every_model_compiled_trains_as_eager(tmp_path, family):
    """trainer.compile=default (inductor) against eager, every model family at a tiny size (fused kernels on, as
    the configs build them; dropout 0, so both see the same numbers): the same losses over 4 steps within 1e-4."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_group import FAMILIES, _run

    losses = {}
    for mode in ("off", "default"):
        t = _run(tmp_path / mode, family, 0, 4)
        for module in t.raw_model.modules():  # no dropout: eager and compiled draw their masks differently
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
            if hasattr(module, "attn_dropout"):
                module.attn_dropout = 0.0
        t.cfg.compile = mode
        if mode != "off":
            from highway_repro.engine.trainer import compiled

            t.model = compiled(t.raw_model, t.cfg)
        t.fit()
        losses[mode] = [json.loads(x)["train/loss"] for x in (t.out_dir / "metrics.jsonl").read_text().splitlines()
                        if "train/loss" in x]
    assert FAMILIES[family] and len(losses["off"]) == 4
    assert all(math.isclose(a, b, rel_tol=1e-4) for a, b in zip(losses["off"], losses["default"])), losses
