"""The device tests: each runs on CPU in the fast suite and on CUDA (marker `cuda`, skipped without a GPU;
`make gpu-check` runs `pytest -m cuda`), so a change that breaks the CUDA path fails here on any machine.

They check: the Transformer-XL attention kernel equals the plain formulas (fp64) and stays close to fp32
under bf16 autocast; every experiment's model trains a step under bf16 autocast with finite fp32 gradients;
the deferred NaN check (the CUDA default) stops a run exactly as the per-step check; a checkpoint written on
the device (memory included) resumes the run; a group of runs with dropout trains there, each member drawing from
the device's generator.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from conftest import EXPERIMENTS, compose, needs_mirror
from highway_repro.engine import checkpoint as ckpt_lib
from highway_repro.models.transformer_xl import TransformerXL

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]  # conftest skips `cuda` without a GPU
# data meta of the image sets (what the data layer passes to the model); language models get a vocabulary
IMAGE_META = {"mnist": {"num_classes": 10, "input_shape": (1, 28, 28)},
              "cifar10": {"num_classes": 10, "input_shape": (3, 32, 32)},
              "cifar100": {"num_classes": 100, "input_shape": (3, 32, 32)}}
VOCAB = 50


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kw", [{}, {"clamp_len": 3}, {"same_length": True},
                                {"norm_position": "pre", "gate_kind": "sdu_tanh"}])
def test_transformer_xl_core_equals_explicit_attention(kw, device):
    """The hand-written training kernel (_RelAttnCore: strided rel-shift view, un-shift in backward) against the
    plain formulas, the same weights in both (`fused` builds the same parameters from the same seed)."""
    models = []
    for fused in (True, False):
        torch.manual_seed(0)
        m = TransformerXL(13, n_layers=2, d_model=16, n_heads=2, d_head=8, d_ff=32, dropout=0.0, tgt_len=6,
                          mem_len=5, fused=fused, **kw).double().to(device)
        with torch.no_grad():
            m.r_w_bias.copy_(torch.linspace(-1, 1, 16).view(2, 8))  # make u, v matter
            m.r_r_bias.copy_(torch.linspace(1, -1, 16).view(2, 8))
        models.append(m)
    x = torch.randint(0, 13, (2, 6), device=device)
    mems = [torch.randn(2, 5, 16, dtype=torch.float64, device=device) for _ in range(2)]
    results = []
    for m in models:
        logits, _ = m(x, mems=mems)
        logits.pow(2).sum().backward()
        results.append((logits.detach(), [p.grad.clone() for p in m.parameters()]))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-12, rtol=0)
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_transformer_xl_bf16_autocast_close_to_fp32(device):
    """Full memory, training path: the bf16 loss within 1% of fp32, gradients fp32, finite, same direction."""
    torch.manual_seed(0)
    V = 204
    m = TransformerXL(V, n_layers=2, d_model=128, n_heads=4, d_head=32, d_ff=256, dropout=0.0, tgt_len=64,
                      mem_len=64).to(device)
    x = torch.randint(0, V, (4, 64), device=device)
    y = torch.randint(0, V, (4, 64), device=device)
    with torch.no_grad():
        _, mems = m(x)
    out = {}
    for bf16 in (False, True):
        m.zero_grad()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            logits, _ = m(x, mems=mems)
        loss = F.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1))
        loss.backward()
        out[bf16] = (loss.item(), torch.cat([p.grad.flatten() for p in m.parameters()]),
                     {p.grad.dtype for p in m.parameters()})
    assert abs(out[True][0] - out[False][0]) / out[False][0] < 1e-2
    assert out[True][2] == {torch.float32} and torch.isfinite(out[True][1]).all()
    assert F.cosine_similarity(out[True][1], out[False][1], dim=0) > 0.99


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_model_trains_a_bf16_step(experiment, device):
    """Each experiment's model (smoke size) through its task under bf16 autocast on the device (cuDNN RNNs too)."""
    from hydra.utils import instantiate

    from highway_repro.engine.tasks import build_task

    cfg = compose([f"experiment={experiment}", "scale=smoke"])
    meta = IMAGE_META.get(str(cfg.data.name), {"vocab_size": VOCAB})
    torch.manual_seed(0)
    model = instantiate(cfg.model, _convert_="all", **meta).to(device).train()
    if "vocab_size" in meta:
        shape = (int(cfg.data.batch_size), int(cfg.data.seq_len))
        batch = (torch.randint(0, VOCAB, shape, device=device), torch.randint(0, VOCAB, shape, device=device))
        task = build_task("lm")
    else:
        batch = (torch.randn(8, *meta["input_shape"], device=device),
                 torch.randint(0, meta["num_classes"], (8,), device=device))
        task = build_task("classification")
    with torch.autocast(device, dtype=torch.bfloat16):
        loss, sums, _ = task.forward(model, batch)
    loss.backward()
    assert torch.isfinite(loss)
    grads = [(n, p.grad) for n, p in model.named_parameters() if p.requires_grad]
    assert all(g is not None for _, g in grads), [n for n, g in grads if g is None]
    assert all(g.dtype == torch.float32 and torch.isfinite(g).all() for _, g in grads)


def _run(cfg, out):
    from highway_repro.train import run

    out.mkdir(parents=True)
    final = run(cfg, out)
    lines = [{k: v for k, v in json.loads(x).items() if not k.startswith("perf/")}
             for x in (out / "metrics.jsonl").read_text().splitlines()]
    ckpt = ckpt_lib.load(out / "ckpt" / "last.pt")
    return {k: v for k, v in final.items() if not k.startswith("time/")}, lines, ckpt


def _close(a: dict, b: dict, rel: float) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        if isinstance(a[k], float) and isinstance(b[k], float):
            if abs(a[k] - b[k]) > rel * max(abs(a[k]), abs(b[k]), 1e-12):
                return False
        elif a[k] != b[k]:
            return False
    return True


@needs_mirror
@pytest.mark.parametrize("device", DEVICES)
def test_deferred_nan_check_stops_like_the_per_step_check(tmp_path, monkeypatch, device):
    """On CUDA the trainer defers the check (no host sync per step; on CPU it is asked for here): same stop step,
    error, checkpoint and log as the per-step check, and the deferred path is the one that caught it."""
    from highway_repro.engine.trainer import Trainer

    forward, check = Trainer._forward, Trainer._check_finite
    caught = []

    def nan_from_step_5(self, batch, mems, score_len):
        loss, sums, new_mems = forward(self, batch, mems, score_len)
        if self.model.training and self.step >= 5:
            loss = loss * float("nan")
        return loss, sums, new_mems

    def spy(self):
        if self._first_bad is not None and int(self._first_bad) < self.cfg.max_steps:
            caught.append(int(self._first_bad))
        return check(self)

    monkeypatch.setattr(Trainer, "_forward", nan_from_step_5)
    monkeypatch.setattr(Trainer, "_check_finite", spy)
    cfg = compose(["experiment=demo", "scale=smoke", "model.depth=3", "trainer.max_steps=12", "trainer.log_every=4",
                   "trainer.checkpoint_every=4", "trainer.eval_every=0", f"trainer.device={device}", "logger=jsonl"])
    outs = {}
    deferred = None if device == "cuda" else True  # None: the trainer's choice, deferred on CUDA
    for defer in (deferred, False):
        monkeypatch.setattr(Trainer, "defer_nan_check", defer)
        outs[defer] = _run(cfg, tmp_path / str(defer))
    final, lines, ckpt = outs[deferred]
    assert final["status"] == "diverged" and final["step"] == 5 and "at step 5" in final["error"]
    assert ckpt["step"] == 4 and all(torch.isfinite(v).all() for v in ckpt["model"].values())
    assert caught == [5]  # the deferred check found it (the per-step run never leaves a pending step)
    assert final == outs[False][0] and ckpt["step"] == outs[False][2]["step"]
    assert [x["step"] for x in lines] == [x["step"] for x in outs[False][1]]
    assert all(_close(a, b, 1e-5) for a, b in zip(lines, outs[False][1]))


@needs_mirror
@pytest.mark.parametrize("device", DEVICES)
def test_checkpoint_on_the_device_resumes_the_run(tmp_path, device):
    """Transformer-XL (memory, dropout RNG of the device in the checkpoint): 4 steps straight vs 2 + resume=auto
    (the optimizer state follows the model onto the device)."""
    base = ["experiment=ht_enwik8_l6", "scale=smoke", f"trainer.device={device}", "trainer.log_every=2",
            "trainer.checkpoint_every=2", "trainer.eval_every=2", "trainer.eval_max_batches=2",
            "trainer.final_max_batches=2", "trainer.splits=[val]", "optim.scheduler.kind=constant", "logger=jsonl"]
    whole, lines, _ = _run(compose(base + ["trainer.max_steps=4"]), tmp_path / "whole")
    part = tmp_path / "part"
    _, _, ckpt = _run(compose(base + ["trainer.max_steps=2"]), part)
    assert ckpt["step"] == 2 and len(ckpt["mems"]) == 6 and ckpt["mems"][0].shape[1] == 16
    assert ("cuda" in ckpt["rng"]) == torch.cuda.is_available()
    from highway_repro.train import run

    resumed = run(compose(base + ["trainer.max_steps=4", "resume=auto"]), part)
    resumed = {k: v for k, v in resumed.items() if not k.startswith("time/")}
    assert resumed["status"] == "done" and resumed["step"] == 4
    assert _close(resumed, whole, 1e-3), (resumed, whole)


@needs_mirror
def test_the_model_is_on_its_device_before_a_checkpoint_is_loaded(tmp_path, monkeypatch):
    """Optimizer.load_state_dict puts the saved state on the parameters' device: a model moved to the GPU after the
    load leaves Adam's moments on the CPU, and the first step fails ('Expected all tensors to be on the same
    device'). On CPU the order is what can be seen: every load comes after the model's one move to the device."""
    from highway_repro.train import run

    base = ["experiment=demo", "scale=smoke", "model.depth=3", "trainer.log_every=2", "trainer.checkpoint_every=2",
            "trainer.eval_every=0", "logger=jsonl"]
    out = tmp_path / "run"
    out.mkdir()
    run(compose(base + ["trainer.max_steps=2"]), out)
    events = []
    move, load = torch.nn.Module.to, torch.optim.Optimizer.load_state_dict
    monkeypatch.setattr(torch.nn.Module, "to", lambda self, *a, **k: events.append("to") or move(self, *a, **k))
    monkeypatch.setattr(torch.optim.Optimizer, "load_state_dict",
                        lambda self, state: events.append("load") or load(self, state))
    final = run(compose(base + ["trainer.max_steps=4", "resume=auto"]), out)
    assert final["status"] == "done" and final["step"] == 4
    assert "load" in events and "to" in events[:events.index("load")], events
    assert events.count("to") == 1, events  # moved once, by the trainer's constructor (fit moves nothing)


@pytest.mark.parametrize("device", DEVICES)
def test_a_group_with_dropout_trains_on_the_device(tmp_path, device):
    """A group of two MNIST conv nets (dropout) on the device: each member's masks from its own generator there,
    checkpoints holding that generator where a lone run keeps the device's, both done and resumable."""
    from highway_repro.engine.group import Group, Member
    from highway_repro.engine.loggers import JsonlLogger
    from highway_repro.engine.schedules import build
    from highway_repro.engine.tasks import Classification
    from highway_repro.engine.trainer import TrainerConfig
    from highway_repro.models.convnets import MnistHighwayNet
    from highway_repro.models.dropout import member_generators

    class Images:
        kind, splits, steps_per_epoch = "classification", ("test",), 4

        def __init__(self, seed):
            g = torch.Generator().manual_seed(seed)
            self.x, self.y = torch.randn(4, 2, 1, 28, 28, generator=g), torch.randint(0, 10, (4, 2), generator=g)

        def train_batch(self, step):
            return self.x[step % 4], self.y[step % 4]

        def eval_batches(self, split):
            yield self.x[0], self.y[0]

    members = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = MnistHighwayNet(width=3)
        opt = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
        cfg = TrainerConfig(max_steps=4, log_every=1, eval_every=0, checkpoint_every=2, progress=False,
                            device=device, splits=["test"])
        out = tmp_path / str(seed)
        out.mkdir()
        members.append(Member(model, Images(seed), Classification(), opt, build(opt, max_steps=4), out,
                              JsonlLogger(out), cfg))
    finals = Group(members, draws=member_generators).fit()
    assert [f["status"] for f in finals] == ["done", "done"]
    for m in members:
        ckpt = ckpt_lib.load(m.ckpt_dir / "last.pt")
        saved = ckpt["rng"]["cuda"][m._cuda_index()] if device == "cuda" else ckpt["rng"]["torch"]
        assert torch.equal(saved, m.gen.get_state())
