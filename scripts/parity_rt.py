"""`make parity`, the R-Transformer: our LocalRNN and RTransformer against DSE-MSU/R-transformer (Wang et al. 2019;
`LocalRNN` of models/RTransformer.py, `RT` of language_word/model.py).

Both with `fused=True` (the configs' value: the hand-written local GRU / LSTM kernels and the official LayerNorm of
models/kernels.py) and `fused=False` (the plain formulas of models/r_transformer.py). The weight mappings
(`rt_to_official`, `local_rnn_to_official`), the model at the parity size, the checks (`check_local_rnn`: outputs and
input and weight gradients; `check_rt`: log-probabilities, loss and gradients over several sequences), the rows the
report shows (`rt_checks`) and the parameter counts of the word-PTB model.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F

from highway_repro.models.r_transformer import LocalRNN, RTransformer
from parity_official import copy_into, grad_diff, maxdiff, perturb_, quiet

# ---------------------------------------------------------------------------------------------------
# Weight mapping: our parameter names -> the official ones (parameters or their gradients); a name they
# do not know raises ValueError, so nothing is silently left out.
# ---------------------------------------------------------------------------------------------------

def rt_to_official(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our RTransformer -> official `RT` (DSE-MSU/R-transformer, language_word/model.py).

    ours                                   official
    tok_emb.weight (= head.weight, tied)   encoder.weight and decoder.weight
    head.bias                              decoder.bias
    layers.i.rnns.j.rnn.P                  rt.forward_net.i.layers.j.local_rnn.rnn.P (P: weight_ih_l0, ...)
    layers.i.ln_rnns.j.{weight,bias}       rt.forward_net.i.layers.j.connection.norm.{a_2,b_2}
    layers.i.ln_attn.{weight,bias}         rt.forward_net.i.connections.0.norm.{a_2,b_2}
    layers.i.ln_ffn.{weight,bias}          rt.forward_net.i.connections.1.norm.{a_2,b_2}
    layers.i.attn.qkv.W  (3d, ...)         rows [:d], [d:2d], [2d:] -> rt.forward_net.i.pooling.linears.{0,1,2}.W
    layers.i.attn.out.W                    rt.forward_net.i.pooling.linears.3.W
    layers.i.ffn.net.{0,3}.W               rt.forward_net.i.feed_forward.{w_1,w_2}.W
    (the norms map one to one with norm_style='official', whose weight/bias are the official a_2/b_2;
    with norm_style='torch' the same parameters feed a different formula.)

    Not mapped (raises): `ln_final` (our final norm; the official model has none) and gates (the official
    R-Transformer has none). Official parameters with no counterpart (built, never used in forward):
    every LocalRNN's `output` Linear+ReLU, and the model-level `rt.norm` and `rt.feed_forward`.
    """
    out: dict[str, torch.Tensor] = {}
    for name, t in named.items():
        if name in ("tok_emb.weight", "head.weight"):
            out["encoder.weight"] = t
            out["decoder.weight"] = t
            continue
        if name == "head.bias":
            out["decoder.bias"] = t
            continue
        m = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
        if m is None:
            raise ValueError(f"rt_to_official: no official counterpart for {name!r}")
        i, rest = m.groups()
        pre = f"rt.forward_net.{i}."
        ln = {"weight": "a_2", "bias": "b_2"}
        if r := re.fullmatch(r"rnns\.(\d+)\.rnn\.(\w+)", rest):
            out[f"{pre}layers.{r[1]}.local_rnn.rnn.{r[2]}"] = t
        elif r := re.fullmatch(r"ln_rnns\.(\d+)\.(weight|bias)", rest):
            out[f"{pre}layers.{r[1]}.connection.norm.{ln[r[2]]}"] = t
        elif r := re.fullmatch(r"ln_(attn|ffn)\.(weight|bias)", rest):
            out[f"{pre}connections.{0 if r[1] == 'attn' else 1}.norm.{ln[r[2]]}"] = t
        elif r := re.fullmatch(r"attn\.qkv\.(weight|bias)", rest):
            for j, part in enumerate(t.chunk(3, dim=0)):  # [W_q | W_k | W_v]
                out[f"{pre}pooling.linears.{j}.{r[1]}"] = part
        elif r := re.fullmatch(r"attn\.out\.(weight|bias)", rest):
            out[f"{pre}pooling.linears.3.{r[1]}"] = t
        elif r := re.fullmatch(r"ffn\.net\.([03])\.(weight|bias)", rest):
            out[f"{pre}feed_forward.{'w_1' if r[1] == '0' else 'w_2'}.{r[2]}"] = t
        else:
            raise ValueError(f"rt_to_official: no official counterpart for {name!r}")
    return out


def local_rnn_to_official(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our LocalRNN -> official LocalRNN: rnn.P -> rnn.P (the official `output` Linear is never used)."""
    out = {}
    for name, t in named.items():
        if not re.fullmatch(r"rnn\.\w+", name):
            raise ValueError(f"local_rnn_to_official: no official counterpart for {name!r}")
        out[name] = t
    return out


RT_SIZE = dict(vocab_size=40, n_layers=2, d_model=32, n_heads=4, d_ff=128)
RT_RUN = dict(batch=3, seq_len=11, segments=3)
RT_FINAL_NORM = "ln_final."  # our final norm's parameters (no official counterpart)


def build_ours_rt(rnn: str, window: int, norm_style: str, final_norm: bool, fused: bool) -> RTransformer:
    """norm_style 'official': the official layer norm (unbiased std + 1e-6); 'torch': nn.LayerNorm. fused: the
    kernels of models/kernels.py (local RNN, official LayerNorm), as the configs run it."""
    return RTransformer(**RT_SIZE, rnn=rnn, window=window, dropout=0.0, emb_dropout=0.0, norm_style=norm_style,
                        final_norm=final_norm, fused=fused)


def check_local_rnn(mod_rt, rnn: str, window: int, fused: bool, dtype, seed=0) -> dict:
    """Our LocalRNN (`fused`: the hand-written kernel) vs the official LocalRNN alone, same weights: outputs, input
    and weight gradients."""
    torch.manual_seed(seed)
    d = RT_SIZE["d_model"]
    ours = LocalRNN(d, rnn, window, fused=fused)
    perturb_(ours, seed + 1)
    off = mod_rt.RTransformer.__init__.__globals__["LocalRNN"](d, d, rnn.upper(), window, 0.0)
    copy_into(off, local_rnn_to_official(dict(ours.state_dict())), lambda k: k.startswith("output."))
    ours, off = ours.to(dtype), off.to(dtype)
    g = torch.Generator().manual_seed(seed + 2)
    x = torch.randn(RT_RUN["batch"], RT_RUN["seq_len"], d, generator=g, dtype=torch.float64).to(dtype)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ours(xa), off(xb)
    (ya * torch.cos(ya)).sum().backward()
    (yb * torch.cos(yb)).sum().backward()
    grads = local_rnn_to_official({k: p.grad for k, p in ours.named_parameters()})
    gw, gs = grad_diff(off, grads, lambda k: k.startswith("output."))
    return {"output": maxdiff(ya, yb), "input_grad": maxdiff(xa.grad, xb.grad), "grads": gw, "grad_scale": gs,
            "scale": yb.abs().max().item()}


def check_rt(mod_rt, rnn: str, window: int, norm_style: str, final_norm: bool, fused: bool, dtype, perturb: bool,
             seed=0) -> dict:
    """Our RTransformer vs the official RT (language_word/model.py) on several sequences. Gradients only
    where the conventions are equal; `perturb=False` measures a convention difference at initialisation."""
    torch.manual_seed(seed)
    ours = build_ours_rt(rnn, window, norm_style, final_norm, fused)
    with quiet():
        off = mod_rt.RT(RT_SIZE["d_model"], RT_SIZE["vocab_size"], h=RT_SIZE["n_heads"], rnn_type=rnn.upper(),
                        ksize=window, n_level=RT_SIZE["n_layers"], n=1, dropout=0.0, emb_dropout=0.0,
                        tied_weights=True)
    if perturb:
        perturb_(ours, seed + 1)
    named = {k: v for k, v in ours.state_dict().items() if not k.startswith(RT_FINAL_NORM)}  # no counterpart

    def unused(k):
        return ".local_rnn.output." in k or k.startswith(("rt.norm.", "rt.feed_forward."))

    left = copy_into(off, rt_to_official(named), unused)
    ours, off = ours.to(dtype), off.to(dtype)
    ours.eval(), off.eval()
    g = torch.Generator().manual_seed(seed + 2)
    B, T, S = RT_RUN["batch"], RT_RUN["seq_len"], RT_RUN["segments"]
    res = {"logprob": 0.0, "nll": 0.0}
    loss_ours, loss_off = 0.0, 0.0
    for _ in range(S):
        x = torch.randint(0, RT_SIZE["vocab_size"], (B, T + 1), generator=g)
        x, y = x[:, :-1], x[:, 1:]
        lp_ours = F.log_softmax(ours(x)[0].double(), -1).to(dtype)
        lp_off = F.log_softmax(off(x).double(), -1).to(dtype)
        nll_ours = -lp_ours.gather(-1, y[..., None])[..., 0]
        nll_off = -lp_off.gather(-1, y[..., None])[..., 0]
        res["logprob"] = max(res["logprob"], maxdiff(lp_ours, lp_off))
        res["nll"] = max(res["nll"], maxdiff(nll_ours, nll_off))
        loss_ours = loss_ours + nll_ours.mean() / S
        loss_off = loss_off + nll_off.mean() / S
    res["loss"] = abs(loss_ours.item() - loss_off.item())
    if norm_style == "official" and not final_norm:
        loss_ours.backward()
        loss_off.backward()
        grads = rt_to_official({k: p.grad for k, p in ours.named_parameters()})
        res["grads"], res["grad_scale"] = grad_diff(off, grads, lambda k: k in left)
    res["scale"] = lp_off.abs().max().item()
    res["unused_official_params"] = sum(off.state_dict()[k].numel() for k in left)
    return res


def rt_counts(mod_rt) -> dict:
    """Parameter counts at the word-PTB R-Transformer-L3 size (V=10,000, d 128, LSTM window 9)."""
    torch.manual_seed(0)
    with quiet():
        off = mod_rt.RT(128, 10000, h=8, rnn_type="LSTM", ksize=9, n_level=3, n=1, dropout=0.0, emb_dropout=0.0,
                        tied_weights=True)
    x = torch.randint(0, 10000, (1, 5))
    off(x).sum().backward()
    out = {"official RT reported (#params)": sum(p.numel() for p in off.parameters()),
           "official RT used (get a gradient)": sum(p.numel() for p in off.parameters() if p.grad is not None)}
    for final_norm in (True, False):
        ours = RTransformer(10000, n_layers=3, d_model=128, n_heads=8, d_ff=512, rnn="lstm", window=9,
                            norm_style="official", final_norm=final_norm)
        out[f"ours final_norm={final_norm}"] = sum(p.numel() for p in ours.parameters())
    return out


def rt_checks() -> list[tuple[str, str, dict, str]]:
    """(group, label, kwargs of check_local_rnn ("c-rnn") or check_rt ("c"), conventions). The local RNN and the
    rows with equal conventions run with the kernels on (`fused=True`, the configs' value) and off; the rows that
    measure a convention difference run as the configs do."""
    rows = []
    for rnn, window in (("gru", 3), ("lstm", 4)):
        for fused in (True, False):
            rows.append(("c-rnn", f"local RNN alone ({rnn.upper()}, window {window}), fused={fused}",
                         dict(rnn=rnn, window=window, fused=fused), "equal"))
    for rnn, window in (("gru", 3), ("lstm", 4)):
        for norm_style, final_norm, fused in (("official", False, True), ("official", False, False),
                                              ("torch", False, True), ("torch", True, True)):
            equal = norm_style == "official" and not final_norm
            label = (f"R-Transformer ({rnn.upper()}, window {window}), norm_style={norm_style}, "
                     f"final_norm={final_norm}, fused={fused}" + ("" if equal else ", at initialisation"))
            rows.append(("c", label, dict(rnn=rnn, window=window, norm_style=norm_style, final_norm=final_norm,
                                          fused=fused, perturb=equal), "equal" if equal else "differ"))
    return rows
