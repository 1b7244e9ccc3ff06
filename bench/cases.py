"""Benchmark cases: a model, a fixed batch, an optimizer and one training step, by name.

Every case is rebuilt from its name alone (`build(name)`), so the memory and compile
measurements can run it in a fresh subprocess. A training step is forward + backward +
optimizer step (Adam, fused where torch has it, for the language models; SGD with
momentum for the image nets), on a fixed random batch; dropout is 0 in every case, so
the figures measure compute, not random masks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from highway_repro.models.placement import GATE_KINDS as _REGISTRY

GATE_KINDS = tuple(k for k, target in _REGISTRY.items() if target is not None)  # every kind with a gate module

# the benchmark sizes: Transformer-L3 at d 512 (char vocabulary) and Transformer-XL at d 512 (enwik8 bytes)
TLM = {"n_layers": 3, "d_model": 512, "n_heads": 8, "d_ff": 2048}
TLM_DATA = {"batch": 8, "seq": 256, "vocab": 50}
# the cpu scale the tables spend their hours on (configs/experiment_scale/ht_char_ptb/cpu.yaml), 1 thread
TLM_CPU = {"n_layers": 3, "d_model": 128, "n_heads": 4, "d_ff": 512}
TLM_CPU_DATA = {"batch": 32, "seq": 160, "vocab": 50}
TXL = {"n_layers": 3, "d_model": 512, "n_heads": 8, "d_head": 64, "d_ff": 2048, "tgt_len": 256, "mem_len": 256}
TXL_DATA = {"batch": 8, "vocab": 204}
RT = {"n_layers": 3, "d_model": 128, "n_heads": 8, "d_ff": 512, "rnn": "lstm", "window": 9}  # configs/model default
RT_DATA = {"batch": 8, "seq": 256, "vocab": 50}
GATE_BATCH = 4


@dataclass
class Case:
    """One benchmark contender. `loss(fwd)` runs the forward pass through `fwd` (the model, or its compiled form)."""

    name: str
    label: str
    model: nn.Module
    loss: Callable[[Callable], torch.Tensor]
    items: int  # tokens or samples per step
    unit: str  # "tokens" or "samples"
    make_opt: Callable[[list], torch.optim.Optimizer]
    fwd: Callable = None
    opt: torch.optim.Optimizer = None
    notes: dict = field(default_factory=dict)

    def __post_init__(self):
        self.fwd = self.fwd or self.model
        self.opt = self.make_opt([p for p in self.model.parameters() if p.requires_grad])

    @property
    def params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        self.loss(self.fwd).backward()
        self.opt.step()

    def flops(self) -> int:
        """FLOPs of forward + backward (torch.utils.flop_counter: matmuls, convolutions, attention, RNNs)."""
        from torch.utils.flop_counter import FlopCounterMode

        from highway_repro.engine import flops

        flops.register()

        with FlopCounterMode(display=False) as fc:
            self.loss(self.model).backward()
        self.opt.zero_grad(set_to_none=True)
        return int(fc.get_total_flops())

    def compile(self, **kwargs) -> None:
        self.fwd = torch.compile(self.model, **kwargs)


def adam(params):
    try:
        return torch.optim.Adam(params, lr=1e-4, fused=True)
    except (RuntimeError, TypeError, ValueError):  # a torch without fused Adam on this device
        return torch.optim.Adam(params, lr=1e-4)


def sgd(params):
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


def _tokens(batch: int, seq: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, vocab, (batch, seq), generator=g), torch.randint(0, vocab, (batch, seq), generator=g))


def _lm_loss(x, y, vocab: int, returns_tuple: bool = True):
    def loss(fwd):
        out = fwd(x)
        logits = out[0] if returns_tuple else out
        return F.cross_entropy(logits.reshape(-1, vocab).float(), y.reshape(-1))
    return loss


# ----------------------------------------------------------------------------- language models

def ours_tlm(gate: str = "none", xt_match: bool = False, batch: int | None = None, cpu_scale: bool = False) -> Case:
    """Transformer-L3 of this repo. xt_match: configured like the x-transformers decoder (pre-LN, learned
    positions, tied embeddings, no biases); else as the experiments use it (post-LN, sinusoids, biases).
    cpu_scale: at the size of TLM_CPU / TLM_CPU_DATA instead of TLM / TLM_DATA."""
    from highway_repro.models.transformer_lm import TransformerLM

    torch.manual_seed(0)
    size, data = (TLM_CPU, TLM_CPU_DATA) if cpu_scale else (TLM, TLM_DATA)
    d = {**data, "batch": batch or data["batch"]}
    extra = {"norm_position": "pre", "pos": "learned", "max_len": d["seq"], "bias": False} if xt_match else {}
    model = TransformerLM(d["vocab"], **size, dropout=0.0, gate_kind=gate, fused=True, **extra)
    x, y = _tokens(d["batch"], d["seq"], d["vocab"])
    name = ("ours_tlm_xt" if xt_match else f"tlm-{gate}") + ("_cpu" if cpu_scale else "")
    return Case(name, "transformer_lm" + (" (pre-LN, no bias)" if xt_match else f" gate={gate}"), model,
                _lm_loss(x, y, d["vocab"]), d["batch"] * d["seq"], "tokens", adam)


def xt_decoder(cpu_scale: bool = False, size: dict | None = None, data: dict | None = None, dropout: float = 0.0,
               attn_dropout: float = 0.0, device: str = "cpu", make_opt=None) -> Case:
    """x-transformers TransformerWrapper(Decoder) at the size of `ours_tlm(xt_match=True, cpu_scale=...)`:
    pre-LN, learned absolute positions, tied embeddings, ReLU FFN without biases, flash (SDPA) attention.
    `size` ({n_layers, d_model, n_heads, d_ff}) and `data` ({batch, seq, vocab}) give another size (the GPU check's:
    a config's), `dropout` (FFN and embedding) and `attn_dropout` its dropout, `make_opt` its optimizer (default
    fused Adam), `device` where the model and the batch live."""
    from x_transformers import Decoder, TransformerWrapper

    torch.manual_seed(0)
    size = size or (TLM_CPU if cpu_scale else TLM)
    d = data or (TLM_CPU_DATA if cpu_scale else TLM_DATA)
    model = TransformerWrapper(
        num_tokens=d["vocab"], max_seq_len=d["seq"], tie_embedding=True, emb_dropout=dropout,
        attn_layers=Decoder(dim=size["d_model"], depth=size["n_layers"], heads=size["n_heads"],
                            attn_dim_head=size["d_model"] // size["n_heads"], ff_mult=size["d_ff"] / size["d_model"],
                            ff_no_bias=True, ff_custom_activation=nn.ReLU(), attn_flash=True, ff_dropout=dropout,
                            attn_dropout=attn_dropout)).to(device)
    x, y = (t.to(device) for t in _tokens(d["batch"], d["seq"], d["vocab"]))
    return Case("xt_cpu" if cpu_scale else "xt", "x-transformers Decoder", model,
                _lm_loss(x, y, d["vocab"], returns_tuple=False),
                d["batch"] * d["seq"], "tokens", make_opt or adam)


def ours_txl(gate: str = "none", batch: int | None = None) -> Case:
    from highway_repro.models.transformer_xl import TransformerXL

    torch.manual_seed(0)
    d = {**TXL_DATA, "batch": batch or TXL_DATA["batch"]}
    model = TransformerXL(d["vocab"], **TXL, dropout=0.0, gate_kind=gate, fused=True)
    x, y = _tokens(d["batch"], TXL["tgt_len"], d["vocab"])
    with torch.no_grad():  # steady state from the first step: full memory (mem_len) for timing and FLOP counts
        state = {"mems": model(x)[1]}

    def loss(fwd):  # segment recurrence as in training: the memory of the previous step, detached
        logits, mems = fwd(x, mems=state["mems"])
        state["mems"] = [m.detach() for m in mems]
        return F.cross_entropy(logits.reshape(-1, d["vocab"]).float(), y.reshape(-1))

    return Case(f"txl-{gate}", f"transformer_xl gate={gate}", model, loss, d["batch"] * TXL["tgt_len"], "tokens",
                adam, notes={"batch": d["batch"]})


def ours_rt(gate: str = "none") -> Case:
    from highway_repro.models.r_transformer import RTransformer

    torch.manual_seed(0)
    d = RT_DATA
    model = RTransformer(d["vocab"], **RT, dropout=0.0, emb_dropout=0.0, gate_kind=gate, fused=True)
    x, y = _tokens(d["batch"], d["seq"], d["vocab"])
    return Case(f"rt-{gate}", f"r_transformer gate={gate}", model, _lm_loss(x, y, d["vocab"]),
                d["batch"] * d["seq"], "tokens", adam)


# ----------------------------------------------------------------------------- highway networks

def _images(batch: int, shape, classes: int):
    g = torch.Generator().manual_seed(0)
    return torch.rand((batch, *shape), generator=g), torch.randint(0, classes, (batch,), generator=g)


def _cls_case(name, label, model, x, y) -> Case:
    def loss(fwd):
        return F.cross_entropy(fwd(x).float(), y)
    return Case(name, label, model, loss, x.shape[0], "samples", sgd)


def mlp(kind: str) -> Case:
    from highway_repro.models.mlp import MLP

    torch.manual_seed(0)
    x, y = _images(100, (1, 28, 28), 10)
    return _cls_case(f"mlp100-{kind}", f"MLP depth 100 {kind}", MLP(kind=kind, depth=100), x, y)


def mnist_conv(kind: str) -> Case:
    from highway_repro.models.convnets import MnistHighwayNet

    torch.manual_seed(0)
    x, y = _images(100, (1, 28, 28), 10)
    return _cls_case(f"mnistconv-{kind}", f"MNIST 10-layer conv {kind}", MnistHighwayNet(32, kind), x, y)


def cifar_conv(kind: str) -> Case:
    from highway_repro.models.convnets import CifarHighwayNet

    torch.manual_seed(0)
    x, y = _images(100, (3, 32, 32), 10)
    return _cls_case(f"cifarconv-{kind}", f"CIFAR 19-layer conv {kind}", CifarHighwayNet(kind), x, y)


def _registry() -> dict[str, Callable[[], Case]]:
    reg: dict[str, Callable[[], Case]] = {"ours_tlm_xt": lambda: ours_tlm(xt_match=True), "xt": xt_decoder,
                                          "ours_tlm_xt_cpu": lambda: ours_tlm(xt_match=True, cpu_scale=True),
                                          "xt_cpu": lambda: xt_decoder(cpu_scale=True)}
    for g in ("none",) + GATE_KINDS:
        reg[f"tlm-{g}"] = lambda g=g: ours_tlm(g)
        reg[f"txl-{g}"] = lambda g=g: ours_txl(g)
        reg[f"rt-{g}"] = lambda g=g: ours_rt(g)
        # the gate-cost section runs the two d=512 models at half batch (the ratios hardly depend on it)
        reg[f"tlm4-{g}"] = lambda g=g: ours_tlm(g, batch=GATE_BATCH)
        reg[f"txl4-{g}"] = lambda g=g: ours_txl(g, batch=GATE_BATCH)
    for k in ("plain", "highway"):
        reg[f"mlp100-{k}"] = lambda k=k: mlp(k)
        reg[f"mnistconv-{k}"] = lambda k=k: mnist_conv(k)
        reg[f"cifarconv-{k}"] = lambda k=k: cifar_conv(k)
    return reg


CASES = _registry()


def build(name: str) -> Case:
    if name not in CASES:
        raise ValueError(f"unknown benchmark case {name!r} (valid: {', '.join(CASES)})")
    return CASES[name]()

