"""The weight mapping of scripts/parity.py (`make parity`), on our side only: no official code needed.

The official parameter names and shapes below are read from the official constructors at the pinned
commits (MemTransformerLM of kimiyoung/transformer-xl and cyk1337/Highway-Transformer, RT of
DSE-MSU/R-transformer); the formulas are the official forward passes, written out naively."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from highway_repro.models.r_transformer import RTransformer
from highway_repro.models.transformer_xl import TransformerXL

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def parity():
    spec = importlib.util.spec_from_file_location("parity_script", ROOT / "scripts" / "parity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def shapes(named: dict) -> dict:
    return {k: tuple(v.shape) for k, v in named.items()}


# ---- Transformer-XL (+ gates) -> MemTransformerLM ------------------------------------------------

V, D, H, DH, DI = 11, 8, 2, 3, 16


def tiny_txl(**kw) -> TransformerXL:
    return TransformerXL(V, n_layers=2, d_model=D, n_heads=H, d_head=DH, d_ff=DI, tgt_len=4, mem_len=4, **kw)


def official_txl_shapes(gated_layers=()) -> dict:
    """MemTransformerLM(n_token=11, n_layer=2, n_head=2, d_model=8, d_head=3, d_inner=16), tied, no cutoffs."""
    out = {"word_emb.emb_layers.0.weight": (V, D), "crit.out_layers.0.weight": (V, D),
           "crit.out_layers.0.bias": (V,), "r_w_bias": (H, DH), "r_r_bias": (H, DH)}
    for i in range(2):
        p = f"layers.{i}."
        out.update({p + "dec_attn.qkv_net.weight": (3 * H * DH, D), p + "dec_attn.r_net.weight": (H * DH, D),
                    p + "dec_attn.o_net.weight": (D, H * DH), p + "dec_attn.layer_norm.weight": (D,),
                    p + "dec_attn.layer_norm.bias": (D,), p + "pos_ff.CoreNet.0.weight": (DI, D),
                    p + "pos_ff.CoreNet.0.bias": (DI,), p + "pos_ff.CoreNet.3.weight": (D, DI),
                    p + "pos_ff.CoreNet.3.bias": (D,), p + "pos_ff.layer_norm.weight": (D,),
                    p + "pos_ff.layer_norm.bias": (D,)})
        if i in gated_layers:
            for owner in ("dec_attn", "pos_ff"):
                for w in ("w1", "w2"):
                    out.update({f"{p}{owner}.{w}.weight": (D, D), f"{p}{owner}.{w}.bias": (D,)})
    return out


def test_txl_mapping_gives_every_official_name_and_shape(parity):
    m = tiny_txl()
    assert shapes(parity.txl_to_official(dict(m.named_parameters()))) == official_txl_shapes()
    g = tiny_txl(gate_kind="sdu_tanh", gate_layers="1")  # our layer 1 = official layers.0
    mapped = parity.txl_to_official(dict(g.named_parameters()))
    assert shapes(mapped) == official_txl_shapes(gated_layers=(0,))
    # the same tensors, not copies: the mapping also carries gradients (same names, same shapes)
    assert mapped["word_emb.emb_layers.0.weight"] is g.tok_emb.weight is mapped["crit.out_layers.0.weight"]
    assert mapped["layers.1.dec_attn.qkv_net.weight"] is g.layers[1].attn.qkv.weight
    assert mapped["layers.1.dec_attn.r_net.weight"] is g.layers[1].attn.r_proj.weight
    assert mapped["layers.0.pos_ff.CoreNet.3.bias"] is g.layers[0].ffn.net[3].bias


# official PositionwiseFF / RelPartialLearnableMultiHeadAttn, post-LN branch, before the LayerNorm
OFFICIAL_GATE = {
    "sdu_tanh": lambda w, sub, w1, w2: w + sub + torch.tanh(w1(w)) * w2(w),        # glu_type 2, act_type 0
    "sdu_sigmoid": lambda w, sub, w1, w2: w + sub + torch.sigmoid(w1(w)) * w2(w),  # glu_type 2, act_type 1
    "highway": lambda w, sub, w1, w2: (1 - torch.sigmoid(w1(w))) * w + sub + torch.sigmoid(w1(w)) * w2(w),
    "gated_attn": lambda w, sub, w1, w2: w + (1 - torch.sigmoid(w1(w))) * sub + torch.sigmoid(w1(w)) * w2(w),
}


@pytest.mark.parametrize("kind", sorted(OFFICIAL_GATE))
def test_txl_gate_halves_are_w1_gate_and_w2_transform(parity, kind):
    """The fused [W1 | W2] projection splits so that the official formula with w1, w2 is our gate."""
    torch.manual_seed(0)
    m = tiny_txl(gate_kind=kind, gate_layers="2")
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    mapped = parity.txl_to_official(dict(m.named_parameters()))
    for sub, owner in (("attn", "dec_attn"), ("ffn", "pos_ff")):
        gate = getattr(m.layers[1], f"{sub}_gate")
        p = f"layers.1.{owner}"
        w1 = lambda x, p=p: F.linear(x, mapped[f"{p}.w1.weight"], mapped[f"{p}.w1.bias"])  # noqa: E731
        w2 = lambda x, p=p: F.linear(x, mapped[f"{p}.w2.weight"], mapped[f"{p}.w2.bias"])  # noqa: E731
        x, s = torch.randn(2, 3, D), torch.randn(2, 3, D)
        torch.testing.assert_close(gate(x, s), OFFICIAL_GATE[kind](x, s, w1, w2), rtol=1e-5, atol=1e-6)


def test_txl_names_without_official_counterpart_raise(parity):
    pre = tiny_txl(norm_position="pre")
    with pytest.raises(ValueError, match="ln_final"):
        parity.txl_to_official(dict(pre.named_parameters()))
    with pytest.raises(ValueError, match="'layers.0.attn.extra'"):
        parity.txl_to_official({"layers.0.attn.extra": torch.zeros(1)})


# ---- R-Transformer -> RT (language_word/model.py) --------------------------------------------------

RV, RD, RH, RF = 11, 8, 2, 32


def tiny_rt(**kw) -> RTransformer:
    return RTransformer(RV, n_layers=1, d_model=RD, n_heads=RH, d_ff=RF, rnn="gru", window=3, dropout=0.0,
                        emb_dropout=0.0, norm_impl="official", final_norm=False, **kw)


def official_rt_shapes() -> dict:
    """RT(input_size=8, output_size=11, h=2, rnn_type='GRU', ksize=3, n_level=1, n=1, tied_weights=True),
    without the parameters forward never uses (LocalRNN.output, rt.norm, rt.feed_forward)."""
    p = "rt.forward_net.0."
    out = {"encoder.weight": (RV, RD), "decoder.weight": (RV, RD), "decoder.bias": (RV,)}
    for w in ("weight_ih_l0", "weight_hh_l0"):
        out[f"{p}layers.0.local_rnn.rnn.{w}"] = (3 * RD, RD)
    for b in ("bias_ih_l0", "bias_hh_l0"):
        out[f"{p}layers.0.local_rnn.rnn.{b}"] = (3 * RD,)
    for norm in ("layers.0.connection.norm", "connections.0.norm", "connections.1.norm"):
        out.update({f"{p}{norm}.a_2": (RD,), f"{p}{norm}.b_2": (RD,)})
    for j in range(4):
        out.update({f"{p}pooling.linears.{j}.weight": (RD, RD), f"{p}pooling.linears.{j}.bias": (RD,)})
    out.update({f"{p}feed_forward.w_1.weight": (4 * RD, RD), f"{p}feed_forward.w_1.bias": (4 * RD,),
                f"{p}feed_forward.w_2.weight": (RD, 4 * RD), f"{p}feed_forward.w_2.bias": (RD,)})
    return out


def test_rt_mapping_gives_every_official_name_and_shape(parity):
    m = tiny_rt()
    assert shapes(parity.rt_to_official(dict(m.named_parameters()))) == official_rt_shapes()
    assert shapes(parity.rt_to_official(dict(m.state_dict()))) == official_rt_shapes()  # tied head.weight too


def test_rt_qkv_split_is_the_official_attention(parity):
    """MHPooling: linears[0..2] = q, k, v; scores masked with -1e9 above the diagonal; linears[3] = out."""
    torch.manual_seed(0)
    m = tiny_rt().eval()
    mapped = parity.rt_to_official(dict(m.named_parameters()))
    pre = "rt.forward_net.0.pooling.linears"
    lin = [(mapped[f"{pre}.{j}.weight"], mapped[f"{pre}.{j}.bias"]) for j in range(4)]
    B, T, dk = 2, 5, RD // RH
    x = torch.randn(B, T, RD)
    q, k, v = (F.linear(x, *lin[j]).view(B, T, RH, dk).transpose(1, 2) for j in range(3))
    scores = q @ k.transpose(-2, -1) / math.sqrt(dk)
    scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), -1e9)
    ref = F.linear((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, RD), *lin[3])
    torch.testing.assert_close(m.layers[0].attn(x), ref, rtol=1e-5, atol=1e-6)


def test_rt_norms_map_to_the_official_layer_norm(parity):
    """norm_impl='official': weight/bias are the official a_2/b_2 of `a_2 * (x - mean) / (std + 1e-6) + b_2`."""
    torch.manual_seed(0)
    m = tiny_rt()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    mapped = parity.rt_to_official(dict(m.named_parameters()))
    x = torch.randn(2, 5, RD) * 3 + 1
    for ours, off in ((m.layers[0].ln_rnns[0], "layers.0.connection.norm"), (m.layers[0].ln_attn, "connections.0.norm"),
                      (m.layers[0].ln_ffn, "connections.1.norm")):
        a, b = mapped[f"rt.forward_net.0.{off}.a_2"], mapped[f"rt.forward_net.0.{off}.b_2"]
        ref = a * (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + 1e-6) + b
        torch.testing.assert_close(ours(x), ref, rtol=1e-5, atol=1e-6)


def test_rt_names_without_official_counterpart_raise(parity):
    with pytest.raises(ValueError, match="ln_final"):
        parity.rt_to_official(dict(RTransformer(RV, n_layers=1, d_model=RD, n_heads=RH, d_ff=RF,
                                                final_norm=True).named_parameters()))
    with pytest.raises(ValueError, match="attn_gate"):  # the official R-Transformer has no gates
        parity.rt_to_official(dict(tiny_rt(gate_kind="sdu_tanh").named_parameters()))


# ---- official code handling: copy + patch in the cache, never in the checkout ------------------------

def test_prepare_official_patches_a_cached_copy_only(parity, tmp_path):
    src, cache = tmp_path / "official", tmp_path / "cache"
    for name, spec in parity.OFFICIAL.items():
        for rel in spec["files"]:
            (src / name / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / name / rel).write_text("# stand-in\n")
        for rel, old, _new, count, _why in parity.PATCHES[name]:
            with open(src / name / rel, "a") as f:
                f.write((old + "\n") * count)
    before = {p: p.read_text() for p in src.rglob("*.py")}
    prepared = parity.prepare_official(src, cache)
    assert {p: p.read_text() for p in src.rglob("*.py")} == before  # the checkout is never touched
    for name, info in prepared.items():
        assert info["path"].is_relative_to(cache) and not info["pinned"]
        assert info["commit"].startswith("unknown") and len(info["patches"]) == len(parity.PATCHES[name])
        for rel, old, new, _count, _why in parity.PATCHES[name]:
            text = (info["path"] / rel).read_text()
            assert new in text and (old not in text or old in new)
    # a checkout whose text no longer matches a patch is refused with the file and the count
    (src / "R-transformer" / "models" / "RTransformer.py").write_text("nothing to patch\n")
    with pytest.raises(SystemExit, match=r"R-transformer/models/RTransformer.py expects 1 x"):
        parity.prepare_official(src, cache)
