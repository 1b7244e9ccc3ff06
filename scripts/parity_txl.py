"""`make parity`, the Transformer-XL family: our TransformerXL against kimiyoung/transformer-xl's `MemTransformerLM`
(Dai et al. 2019) and, with the gates of Chai et al. (ACL 2020), against cyk1337/Highway-Transformer's.

The weight mapping (`txl_to_official`), the model at the parity size, the check (`check_txl`: log-probabilities, loss,
memories and gradients over several segments), the rows the report shows (`txl_checks`) and the facts about the
official code that docs/discrepancies.md cites, re-derived at run time (per-layer placement, the attention-only mode,
the parameter counts of the 6-layer enwik8 models).
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F

from highway_repro.models.transformer_xl import TransformerXL
from parity_official import copy_into, grad_diff, maxdiff, perturb_, quiet

# ---------------------------------------------------------------------------------------------------
# Weight mapping: our parameter names -> the official ones. It takes named tensors (parameters, or their
# gradients: same names, same shapes) and returns the official names; a name it does not know raises
# ValueError, so nothing is silently left out.
# ---------------------------------------------------------------------------------------------------

def txl_to_official(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our TransformerXL -> official MemTransformerLM (kimiyoung/transformer-xl and, with gates,
    cyk1337/Highway-Transformer: both name their parameters alike).

    ours                                   official
    tok_emb.weight                         word_emb.emb_layers.0.weight and crit.out_layers.0.weight (tied)
    out_bias                               crit.out_layers.0.bias
    r_w_bias, r_r_bias                     r_w_bias, r_r_bias (u, v; shared by all layers)
    layers.i.attn.qkv.weight               layers.i.dec_attn.qkv_net.weight   ([W_q | W_k | W_v], no bias)
    layers.i.attn.r_proj.weight            layers.i.dec_attn.r_net.weight     (W_R)
    layers.i.attn.out.weight               layers.i.dec_attn.o_net.weight
    layers.i.ln_attn.{weight,bias}         layers.i.dec_attn.layer_norm.{weight,bias}
    layers.i.ffn.net.{0,3}.{weight,bias}   layers.i.pos_ff.CoreNet.{0,3}.{weight,bias}
    layers.i.ln_ffn.{weight,bias}          layers.i.pos_ff.layer_norm.{weight,bias}
    layers.i.attn_gate.proj.W  (2d, ...)   rows [:d] -> layers.i.dec_attn.w1.W, rows [d:] -> .w2.W (W: weight, bias)
    layers.i.ffn_gate.proj.W               layers.i.pos_ff.w1.W / w2.W likewise
    (w1 is the gate pre-activation: T = psi(x W1 + b1); w2 the transform f = x W2 + b2.)

    Not mapped (raises): `ln_final` (our pre-LN final norm; the official pre-LN model has none).
    Official parameters with no counterpart: the w1/w2 of every ungated sublayer (built, never used).
    """
    out: dict[str, torch.Tensor] = {}
    for name, t in named.items():
        if name == "tok_emb.weight":
            out["word_emb.emb_layers.0.weight"] = t
            out["crit.out_layers.0.weight"] = t
            continue
        if name == "out_bias":
            out["crit.out_layers.0.bias"] = t
            continue
        if name in ("r_w_bias", "r_r_bias"):
            out[name] = t
            continue
        m = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
        if m is None:
            raise ValueError(f"txl_to_official: no official counterpart for {name!r}")
        i, rest = m.groups()
        pre = f"layers.{i}."
        direct = {"attn.qkv.weight": "dec_attn.qkv_net.weight", "attn.r_proj.weight": "dec_attn.r_net.weight",
                  "attn.out.weight": "dec_attn.o_net.weight",
                  "ln_attn.weight": "dec_attn.layer_norm.weight", "ln_attn.bias": "dec_attn.layer_norm.bias",
                  "ffn.net.0.weight": "pos_ff.CoreNet.0.weight", "ffn.net.0.bias": "pos_ff.CoreNet.0.bias",
                  "ffn.net.3.weight": "pos_ff.CoreNet.3.weight", "ffn.net.3.bias": "pos_ff.CoreNet.3.bias",
                  "ln_ffn.weight": "pos_ff.layer_norm.weight", "ln_ffn.bias": "pos_ff.layer_norm.bias"}
        if rest in direct:
            out[pre + direct[rest]] = t
            continue
        g = re.fullmatch(r"(attn|ffn)_gate\.proj\.(weight|bias)", rest)
        if g is None:
            raise ValueError(f"txl_to_official: no official counterpart for {name!r}")
        sub, kind = g.groups()
        owner = "dec_attn" if sub == "attn" else "pos_ff"
        w1, w2 = t.chunk(2, dim=0)  # [W1 | W2] stacked along the output dimension
        out[f"{pre}{owner}.w1.{kind}"] = w1
        out[f"{pre}{owner}.w2.{kind}"] = w2
    return out


TXL_SIZE = dict(vocab_size=40, n_layers=3, d_model=32, n_heads=4, d_head=8, d_ff=64)
TXL_RUN = dict(batch=3, tgt_len=5, mem_len=7, segments=4)


def build_ours_txl(gate_kind: str, gate_layers, norm: str, clamp_len: int, same_length: bool,
                   fused: bool) -> TransformerXL:
    m = TransformerXL(**TXL_SIZE, dropout=0.0, attn_dropout=0.0, tgt_len=TXL_RUN["tgt_len"],
                      mem_len=TXL_RUN["mem_len"], clamp_len=clamp_len, same_length=same_length, norm=norm,
                      gate_kind=gate_kind, gate_layers=gate_layers, fused=fused)
    return m


HT_CODES = {"none": (0, 0), "sdu_tanh": (2, 0), "sdu_sigmoid": (2, 1), "highway": (3, 0), "gated_attn": (4, 0)}


def check_txl(mod, *, repo: str, gate_kind: str = "none", glu_layers=None, gate_layers="all", norm="post",
              clamp_len=-1, same_length=False, fused=True, dtype=torch.float32, seed=0) -> dict:
    """Our TransformerXL vs the official MemTransformerLM over TXL_RUN['segments'] segments with memory."""
    torch.manual_seed(seed)
    ours = build_ours_txl(gate_kind, gate_layers, norm, clamp_len, same_length, fused)
    n_layers = TXL_SIZE["n_layers"]
    kw = dict(tie_weight=True, d_embed=None, div_val=1, tie_projs=[False], pre_lnorm=norm == "pre",
              tgt_len=TXL_RUN["tgt_len"], ext_len=0, mem_len=TXL_RUN["mem_len"], cutoffs=[],
              same_length=same_length, attn_type=0, clamp_len=clamp_len)
    if repo == "Highway-Transformer":
        glu, act = HT_CODES[gate_kind]
        kw.update(glu_type=glu, act_type=act, glu_layers=list(range(n_layers)) if glu_layers is None else glu_layers)
    elif gate_kind != "none":
        raise ValueError("kimiyoung/transformer-xl has no gates")
    with quiet():
        off = mod.MemTransformerLM(TXL_SIZE["vocab_size"], n_layers, TXL_SIZE["n_heads"], TXL_SIZE["d_model"],
                                   TXL_SIZE["d_head"], TXL_SIZE["d_ff"], 0.0, 0.0, **kw)
    if norm == "pre":
        ours.ln_final = None  # conventions set equal: the official pre-LN model has no final norm
    perturb_(ours, seed + 1)
    ours, off = ours.to(dtype), off.to(dtype)
    gated = {f"layers.{i}.{o}" for i, pl in enumerate(ours.placement)
             for s, o in (("attn", "dec_attn"), ("ffn", "pos_ff")) if pl[s]}

    def unused(k):  # official gate weights of an ungated sublayer (built, never used)
        m = re.fullmatch(r"(layers\.\d+\.(?:dec_attn|pos_ff))\.w[12]\.(weight|bias)", k)
        return m is not None and m[1] not in gated

    left = copy_into(off, txl_to_official(dict(ours.state_dict())), unused)
    ours.train(), off.train()  # dropout is 0: train mode = the training code paths (fused kernels)

    g = torch.Generator().manual_seed(seed + 2)
    B, T, S = TXL_RUN["batch"], TXL_RUN["tgt_len"], TXL_RUN["segments"]
    data = torch.randint(0, TXL_SIZE["vocab_size"], (B, T * S + 1), generator=g)
    res = {"logprob": 0.0, "nll": 0.0, "mems": 0.0, "logprob_nograd": 0.0}
    captured = {}
    hook = off.crit.register_forward_pre_hook(lambda m, a: captured.__setitem__("hidden", a[0]))
    mem_ours, mem_off = None, ()
    loss_ours, loss_off = 0.0, 0.0
    for s in range(S):
        x, y = data[:, s * T:(s + 1) * T], data[:, s * T + 1:(s + 1) * T + 1]
        logits, mem_ours = ours(x, mem_ours)
        lp_ours = F.log_softmax(logits.double(), -1).to(dtype)  # (B, T, V)
        nll_ours = -lp_ours.gather(-1, y[..., None])[..., 0]  # (B, T)
        out = off(x.t().contiguous(), y.t().contiguous(), *mem_off)
        nll_off, mem_off = out[0].t(), tuple(out[1:])  # (B, T); n_layers + 1 memories (T', B, d)
        c = off.crit
        logit_off = c._compute_logit(captured["hidden"], c.out_layers[0].weight, c.out_layers[0].bias,
                                     c.out_projs[0])  # (T*B, V)
        lp_off = F.log_softmax(logit_off.double(), -1).to(dtype).view(T, B, -1).transpose(0, 1)
        res["logprob"] = max(res["logprob"], maxdiff(lp_ours, lp_off))
        res["nll"] = max(res["nll"], maxdiff(nll_ours, nll_off))
        for l in range(n_layers):  # the official last entry (the final output) is never read
            res["mems"] = max(res["mems"], maxdiff(mem_ours[l], mem_off[l].transpose(0, 1)))
        loss_ours = loss_ours + nll_ours.mean()
        loss_off = loss_off + nll_off.mean()
    hook.remove()
    loss_ours.backward()
    loss_off.backward()
    grads = txl_to_official({k: p.grad for k, p in ours.named_parameters()})
    res["grads"], res["grad_scale"] = grad_diff(off, grads, lambda k: k in left)
    res["scale"] = lp_off.abs().max().item()
    # the inference path (no autograd: our fused attention takes scaled_dot_product_attention)
    ours.eval(), off.eval()
    with torch.no_grad():
        mem_ours, mem_off = None, ()
        for s in range(S):
            x, y = data[:, s * T:(s + 1) * T], data[:, s * T + 1:(s + 1) * T + 1]
            logits, mem_ours = ours(x, mem_ours)
            out = off(x.t().contiguous(), y.t().contiguous(), *mem_off)
            mem_off = tuple(out[1:])
            nll_ours = -F.log_softmax(logits.double(), -1).gather(-1, y[..., None])[..., 0]
            res["logprob_nograd"] = max(res["logprob_nograd"], maxdiff(nll_ours.to(dtype), out[0].t()))
    res["unused_official_params"] = sum(off.state_dict()[k].numel() for k in left)
    return res


# ---- facts about the official code, re-derived at run time ------------------------------------------

def official_gated_layers(mod_ht, n_layer: int, glu_layers: list[int], glu_type: int = 2) -> list[int]:
    """0-based layers whose sublayers the official MemTransformerLM actually gates for `--glu_layers`."""
    with quiet():
        m = mod_ht.MemTransformerLM(10, n_layer, 2, 8, 4, 16, 0.0, 0.0, tgt_len=4, ext_len=0, mem_len=4,
                                    glu_type=glu_type, glu_layers=glu_layers)
    return [i for i, layer in enumerate(m.layers) if layer.dec_attn.glu_type != 0]


def official_attention_only_exit(mod_ht) -> str:
    """Run the official glu_type=1 ('only added on SAN, not on FFN') model for one step."""
    with quiet():
        m = mod_ht.MemTransformerLM(10, 2, 2, 8, 4, 16, 0.0, 0.0, tgt_len=4, ext_len=0, mem_len=4, glu_type=1,
                                    glu_layers=[0, 1])
        x = torch.randint(0, 10, (4, 2))
        try:
            m(x, x)
        except SystemExit as e:
            return f"SystemExit with status {e.code!r} at the first forward"
    return "no exit"


def enwik8_counts(mods) -> dict:
    """Parameter counts at the official 6-layer enwik8 size (V=204, d 512, 8x64 heads, d_inner 2048)."""
    out = {}
    for glu, act, label in ((0, 0, "baseline"), (2, 0, "sdu_tanh")):
        torch.manual_seed(0)
        with quiet():
            m = mods["Highway-Transformer"].MemTransformerLM(
                204, 6, 8, 512, 64, 2048, 0.0, 0.0, tgt_len=4, ext_len=0, mem_len=4, glu_type=glu, act_type=act,
                glu_layers=list(range(6)))
            x = torch.randint(0, 204, (4, 1))
            m(x, x)[0].mean().backward()
        total = sum(p.numel() for p in m.parameters())
        used = sum(p.numel() for p in m.parameters() if p.grad is not None)
        out[f"official {label} reported (#params)"] = total
        out[f"official {label} used (get a gradient)"] = used
    with quiet():
        m = mods["transformer-xl"].MemTransformerLM(204, 6, 8, 512, 64, 2048, 0.0, 0.0, tgt_len=4, ext_len=0,
                                                    mem_len=4)
    out["official transformer-xl (kimiyoung) #params"] = sum(p.numel() for p in m.parameters())
    for kind in ("none", "sdu_tanh"):
        ours = TransformerXL(204, n_layers=6, d_model=512, n_heads=8, d_head=64, d_ff=2048, gate_kind=kind)
        out[f"ours gate_kind={kind}"] = sum(p.numel() for p in ours.parameters())
    return out


def txl_checks() -> list[tuple[str, str, dict, str]]:
    """(group, label, kwargs of check_txl, conventions note); every one has its conventions set equal."""
    rows = []
    for label, kw in (("post-LN", {}), ("post-LN, same_length", {"same_length": True}),
                      ("post-LN, clamp_len=3", {"clamp_len": 3}),
                      ("post-LN, same_length + clamp_len=3", {"same_length": True, "clamp_len": 3}),
                      ("post-LN, fused=False (plain formulas)", {"fused": False}),
                      ("pre-LN, our final norm off", {"norm": "pre"})):
        rows.append(("a", f"Transformer-XL {label}", dict(repo="transformer-xl", **kw), "equal"))
    for kind in ("none", "sdu_sigmoid", "sdu_tanh", "highway", "gated_attn"):
        rows.append(("b", f"{kind}, all layers", dict(repo="Highway-Transformer", gate_kind=kind), "equal"))
    for kind in ("sdu_tanh", "gated_attn"):
        rows.append(("b", f"{kind}, same_length + clamp_len=3, fused=False",
                     dict(repo="Highway-Transformer", gate_kind=kind, same_length=True, clamp_len=3, fused=False),
                     "equal"))
        rows.append(("b", f"{kind}, pre-LN (our final norm off)",
                     dict(repo="Highway-Transformer", gate_kind=kind, norm="pre"), "equal"))
    rows.append(("b", "sdu_tanh, layers 1-2 of 3 (official --glu_layers 0,1: a prefix)",
                 dict(repo="Highway-Transformer", gate_kind="sdu_tanh", gate_layers="1-2", glu_layers=[0, 1]),
                 "equal"))
    return rows
