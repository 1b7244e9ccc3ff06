"""Transformer-XL's relative attention through FlexAttention (`model.flex_attention`, `kernels.rel_attention_flex`)
against the hand-written core (`fused=True`), the parity reference, itself tied to the plain formulas
(test_fast_paths.py, test_cuda.py).

Torch 2.13's FlexAttention has no backward on a CPU: there the outputs are compared (with and without memory, the
training and the evaluation settings, under no_grad) and a CPU training step is refused in one line; on CUDA
(marker `cuda`, which `make gpu-check` runs) the gradients are compared too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from highway_repro.errors import ConfigError
from highway_repro.models.transformer_xl import TransformerXL

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]  # conftest skips `cuda` without a GPU


def _pair(device: str, **kw) -> list[TransformerXL]:
    """The same model (same seed, same weights) with the core and with flex, in float64 on `device`."""
    models = []
    for flex in (False, True):
        torch.manual_seed(0)
        m = TransformerXL(13, n_layers=2, d_model=16, n_heads=2, d_head=8, d_ff=32, dropout=0.0, tgt_len=6,
                          mem_len=5, fused=True, flex_attention=flex, **kw).double().to(device)
        with torch.no_grad():
            m.r_w_bias.copy_(torch.linspace(-1, 1, 16).view(2, 8))  # make u and v matter
            m.r_r_bias.copy_(torch.linspace(1, -1, 16).view(2, 8))
        models.append(m)
    return models


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kw", [{}, {"same_length": True}, {"clamp_len": 3}])
def test_flex_attention_equals_the_core(kw, device):
    core, flex = _pair(device, **kw)
    x = torch.randint(0, 13, (2, 6), device=device)
    mems = [torch.randn(2, 5, 16, dtype=torch.float64, device=device) for _ in range(2)]
    with torch.no_grad():
        for train in (True, False):  # the training path (the core's own autograd kernel) and the inference one
            for m in (core, flex):
                m.train(train)
            for mem in (mems, None):
                (a, a_mems), (b, b_mems) = core(x, mems=mem), flex(x, mems=mem)
                torch.testing.assert_close(b, a, atol=1e-12, rtol=0)
                for p, q in zip(b_mems, a_mems):
                    torch.testing.assert_close(p, q, atol=1e-12, rtol=0)
    if device == "cpu":
        return  # no FlexAttention backward on a CPU
    results = []
    for m in (core, flex):
        m.train()
        logits, _ = m(x, mems=mems)
        logits.pow(2).sum().backward()
        results.append([p.grad for p in m.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(b, a, atol=1e-10, rtol=0)


def test_flex_attention_refuses_to_train_on_a_cpu_and_attention_dropout():
    _, flex = _pair("cpu")
    flex.train()
    with pytest.raises(ConfigError, match=r"^model.flex_attention=True cannot train on a CPU .*\(valid: false on a "):
        flex(torch.randint(0, 13, (2, 6)))
    with pytest.raises(ConfigError, match="model.attn_dropout=0.1 .* model.flex_attention=True"):
        TransformerXL(13, n_layers=1, d_model=16, n_heads=2, d_head=8, d_ff=32, attn_dropout=0.1, flex_attention=True)


def test_flex_attention_is_how_a_run_computes_not_its_recipe():
    """A run made with flex is the run made with the core: the same folder name and, for the recipe guard, the same
    recipe (so the default can follow the faster kernel without orphaning kept runs)."""
    import yaml

    from highway_repro.train.recipe import recipe_diff

    train = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "train.yaml").read_text())
    assert "model.flex_attention" in train["hydra"]["job"]["config"]["override_dirname"]["exclude_keys"]
    core, flex = {"model": {"fused": True, "flex_attention": False}}, {"model": {"fused": True, "flex_attention": True}}
    assert recipe_diff(flex, core) == [] and recipe_diff({"model": {"fused": False}}, core) != []

