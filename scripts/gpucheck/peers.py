"""The peers: another library's model of the same size beside ours, timed in the phase that times ours, on the same
device: HF transformers' TransfoXLLMHeadModel (4.36.2, the version `make bench` uses) beside Transformer-XL L6 and
x-transformers' Decoder beside Transformer-L3. Phase 4 (`throughput`) times them eager, phase `compiled` eager and
compiled with `default` (inductor), bf16 first, then fp32 with TF32 matmuls.

Each peer is built and stepped as `make bench` builds it (bench/cases.py `xt_decoder`, bench/hf_txl_worker.py) at
our config's size, dropout, batch shape, optimizer (its class and arguments) and gradient clip, on random tokens:
warm-up + timed steps (forward and backward in the precision's autocast, clip, optimizer step), the device synced
before and after the timed ones. Tokens per step are ours (the scored targets of our batch), so ours / peer tokens/s
is the ratio of step times. FLOPs: forward + backward of one step under torch.utils.flop_counter in the step's
autocast, as phase 4 counts ours (x-transformers with the project's formulas registered, as ours; the standalone HF
worker with torch's own, which cover the matmuls and einsums its attention runs); MFU against the same measured peak.
Peak memory: the peer's own (HF: its process's).

Where the packages come from: `--prepare` downloads the peers' pinned wheels (PEERS below) into .gpu_peers/<key>/,
carried beside .gpu_deps; the check unpacks them into <runs>/peer_site/<key>/. x-transformers runs in this process,
its site before the installed packages. The HF model runs in a worker process (bench/hf_txl_worker.py): the first of
(the carried wheels, first on the path of this Python; `HIGHWAY_BENCH_HF_PYTHON` or `make bench`'s .venv-bench-hf;
this Python's own transformers) whose transformers imports it: transformers 4.36.2 needs huggingface_hub < 1.0 (carried)
and refuses a newer tokenizers, which the worker hides with sentencepiece and accelerate (the model needs none). A peer
that imports nowhere is absent: its rows say why, and the check goes on (an absent peer is not a problem)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .cases import CASE_BY_KEY, label
from .common import PEERS_DIR, TARGETS, say
from .glue import compose, matmul_precision, run_overrides, sync
from .phases import Ctx, phase
from .report import fmt, md_table, pct

GPU_PYTHON = "3.12"  # the GPU machine's Python: the wheels --prepare downloads are for it (all are pure Python now)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


@dataclass(frozen=True)
class Peer:
    key: str  # its folder in .gpu_peers/ and its name in the report
    case: str  # the case (cases.py) it stands beside
    label: str
    wheels: tuple  # name==version, each downloaded by --prepare (the GPU machine's image lacks them or has others)


HF = Peer("hf", "txl6", "HF transformers TransfoXLLMHeadModel", ("transformers==4.36.2", "huggingface_hub==0.20.3"))
XT = Peer("xt", "tlm3", "x-transformers Decoder", ("x-transformers==2.31.10", "einops==0.8.2", "einx==0.4.3",
                                                     "frozendict==2.5.1", "loguru==0.7.3", "torch-einops-utils==0.2.0"))
PEERS = (HF, XT)
PEER_BY_KEY = {p.key: p for p in PEERS}
MODES = ("eager", "default")  # phase `compiled`: each peer eager and compiled with inductor
NEED_S = {"eager": 25, "default": 100}  # per run on a GPU: a worker's start, the imports, compiling
NEED_DRY_S = {"eager": 10, "default": 60}


class PeerAbsent(RuntimeError):
    """The peer's packages import nowhere here; the message says why."""


# ----------------------------------------------------------------------------- the carried wheels (--prepare)

def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def wheel_of(spec: str, path: Path) -> bool:
    """Whether `path` is the wheel of `spec` (name==version; wheel names spell `-` and `.` as `_`)."""
    name, version = spec.split("==")
    parts = path.name.split("-")
    return path.suffix == ".whl" and len(parts) >= 5 and _norm(parts[0]) == _norm(name) and parts[1] == version


def pip_download(spec: str, folder: Path) -> str:
    """Downloads the wheel of `spec` for the GPU machine's Python into `folder`; '' or the error's last line."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
           GPU_PYTHON, "--implementation", "cp", *(a for p in PLATFORMS for a in ("--platform", p)), "-d", str(folder),
           spec]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    lines = [x for x in (r.stderr or r.stdout).splitlines() if x.strip() and "is ignored" not in x]
    return "" if r.returncode == 0 else (lines[-1] if lines else f"pip exited {r.returncode}")


def prepare_peers(dst: Path, download=pip_download) -> dict:
    """The pinned wheels of every peer in dst/<key>/: downloaded where missing, other files removed (an older pin);
    {"files": [key/wheel, ...], "bytes": total, "failed": ["spec: why", ...]}."""
    files, failed = [], []
    for peer in PEERS:
        folder = dst / peer.key
        folder.mkdir(parents=True, exist_ok=True)
        keep = []
        for spec in peer.wheels:
            have = [p for p in folder.iterdir() if wheel_of(spec, p)]
            why = "" if have else download(spec, folder)
            have = have or [p for p in folder.iterdir() if wheel_of(spec, p)]
            if have:
                keep.append(have[0])
            else:
                failed.append(f"{spec}: {why or 'no wheel came'}")
        for p in folder.iterdir():
            if p not in keep:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        files += keep
    return {"files": sorted(p.relative_to(dst).as_posix() for p in files),
            "bytes": sum(p.stat().st_size for p in files), "failed": failed}


def site(runs: Path, peer: Peer, src: Path | None = None) -> Path | None:
    """The carried wheels of `peer` (in `src`, default .gpu_peers) unpacked into <runs>/peer_site/<key>/ (again only
    when they changed), or None where none were carried. A wheel of pure Python unpacked is its installed form."""
    wheels = sorted(((src or PEERS_DIR) / peer.key).glob("*.whl"))
    if not wheels:
        return None
    target = runs / "peer_site" / peer.key
    stamp = "\n".join(f"{w.name} {w.stat().st_size}" for w in wheels)
    with contextlib.suppress(OSError):
        if (target / ".unpacked").read_text() == stamp:
            return target
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            z.extractall(target)
    (target / ".unpacked").write_text(stamp)
    return target


# ----------------------------------------------------------------------------- where each peer imports

def hf_sources(ctx: Ctx) -> tuple[list[tuple[str, str, dict | None]], list[str]]:
    """([(what, python, env)] to try in order, [why the others are not tried])."""
    from bench.peers import hf_python

    tries, why = [], []
    carried = site(ctx.runs, HF)
    if carried:
        path = os.pathsep.join([str(carried)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        tries.append(("the carried .gpu_peers/hf", sys.executable, {**os.environ, "PYTHONPATH": path}))
    else:
        why.append(f"no {PEERS_DIR.name}/hf (`python scripts/gpu_check.py --prepare` downloads its wheels)")
    venv = hf_python(None)
    if venv:
        tries.append((str(venv), str(venv), None))
    else:
        why.append("no .venv-bench-hf (`make bench` makes it) and HIGHWAY_BENCH_HF_PYTHON unset")
    if importlib.util.find_spec("transformers") is not None:
        tries.append(("this Python's transformers", sys.executable, None))
    else:
        why.append("this Python has no transformers")
    return tries, why


def start_hf(ctx: Ctx, size: dict, init: dict, log: Path):
    """The first HF worker whose transformers imports (a source found absent once is not tried again)."""
    import torch

    from bench.peers import HFWorker
    from bench.peers import PeerAbsent as WorkerAbsent

    tries, why = hf_sources(ctx)
    seen = ctx.hf_failed
    reasons = [f"{what}: {seen[what]}" for what, _, _ in tries if what in seen]
    for what, python, env in tries:
        if what in seen:
            continue
        with open(log, "a") as err:
            try:
                worker = HFWorker(Path(python), torch.get_num_threads(), size=size, env=env, stderr=err, **init)
            except WorkerAbsent as e:
                seen[what] = str(e)
                reasons.append(f"{what}: {e}")
                continue
        worker.source = what
        return worker
    raise PeerAbsent("; ".join(reasons + why))


def import_xt(ctx: Ctx) -> str:
    """x-transformers' version, from the carried wheels (their site first on the path) or the installed one."""
    carried = site(ctx.runs, XT)
    if carried and str(carried) not in sys.path:
        sys.path.insert(1, str(carried))  # after this checkout, before the installed packages
        importlib.invalidate_caches()
    try:
        import x_transformers  # noqa: F401
        from importlib.metadata import version
    except Exception as e:
        raise PeerAbsent(f"x-transformers does not import: {type(e).__name__}: {e}"
                         + ("" if carried else f"; no {PEERS_DIR.name}/xt (`python scripts/gpu_check.py --prepare` "
                                               "downloads its wheels)")) from None
    return version("x-transformers")


# ----------------------------------------------------------------------------- one timed run

def composed(ctx: Ctx, key: str, precision: str):
    """Our baseline's config of case `key` as phase 4 composes it, its data set's vocabulary and our batch."""
    from highway_repro.train.job import build

    case = CASE_BY_KEY[key]
    if ctx.missing.get(key):
        raise RuntimeError(f"data missing: {', '.join(ctx.missing[key])}")
    cfg = compose([f"experiment={case.experiment}", *case.overrides, *case.variants[0][1],
                   *run_overrides(ctx, precision, ctx.warmup + ctx.steps, 1), *(case.dry if ctx.dry else ())])
    data = build(cfg.data, "data")
    return cfg, int(data.meta["vocab_size"]), data.train_batch(0)


def _timed(step, warmup: int, steps: int, device: str) -> tuple[float, float]:
    for _ in range(warmup):
        step()
    sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        loss = step()
    sync(device)
    return time.perf_counter() - t, float(loss)


def measure_xt(ctx: Ctx, cfg, vocab: int, batch, precision: str, mode: str) -> dict:
    import torch

    from bench.cases import xt_decoder
    from highway_repro.train.job import build

    version = import_xt(ctx)
    m, (x, _) = cfg.model, batch
    cuda = ctx.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    make_opt = build(cfg.optim.optimizer, "optim.optimizer")  # ours' optimizer: its class and arguments
    c = xt_decoder(size={k: m[k] for k in ("n_layers", "d_model", "n_heads", "d_ff")},
                   data={"batch": x.shape[0], "seq": x.shape[1], "vocab": vocab}, dropout=m.dropout,
                   attn_dropout=m.attn_dropout, device=ctx.device, make_opt=make_opt)
    if mode != "eager":
        c.compile(mode=None if mode == "default" else mode, dynamic=False)
    params, clip = [p for p in c.model.parameters() if p.requires_grad], cfg.trainer.grad_clip
    autocast = lambda: torch.autocast(ctx.device.split(":")[0], dtype=torch.bfloat16,  # noqa: E731
                                      enabled=precision == "bf16")

    def step():
        c.opt.zero_grad(set_to_none=True)
        with autocast():
            loss = c.loss(c.fwd)
            loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(params, clip)
        c.opt.step()
        return loss.detach()

    secs, loss = _timed(step, ctx.warmup, ctx.steps, ctx.device)
    mem = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()) if cuda else (None, None)
    with autocast():
        flops = c.flops()  # the module's own forward, as ours is counted
    return {"version": version, "params": c.params, "step_s": secs / ctx.steps, "loss": loss, "flops": flops,
            "mem": mem[0], "mem_reserved": mem[1], "source": "this process"}


def measure_hf(ctx: Ctx, cfg, vocab: int, batch, precision: str, mode: str) -> dict:
    from omegaconf import OmegaConf

    m, (x, _) = cfg.model, batch
    size = {"vocab": vocab, "d_model": m.d_model, "n_heads": m.n_heads, "d_head": m.d_head, "d_ff": m.d_ff,
            "n_layers": m.n_layers, "tgt_len": x.shape[1], "mem_len": m.mem_len, "batch": x.shape[0],
            "dropout": m.dropout, "dropatt": m.attn_dropout}
    opt = OmegaConf.to_container(cfg.optim.optimizer, resolve=True)
    target = opt.pop("_target_")
    if not target.startswith("torch.optim."):
        raise RuntimeError(f"optim.optimizer._target_={target}: the HF worker builds torch.optim optimizers only")
    init = {"device": ctx.device, "precision": precision if precision == "bf16" or ctx.dry else "tf32",
            "optimizer": {"name": target.rsplit(".", 1)[1], "kwargs": {k: v for k, v in opt.items()
                                                                      if not k.startswith("_")}},
            "grad_clip": cfg.trainer.grad_clip or None, "compile": None if mode == "eager" else mode,
            "seed": int(cfg.seed)}
    log = ctx.runs / f"peer-hf-{mode}-{precision}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    worker = start_hf(ctx, size, init, log)
    ctx.child = worker.proc  # the time guard kills it
    try:
        worker.call({"cmd": "steps", "n": ctx.warmup})
        timed = worker.call({"cmd": "steps", "n": ctx.steps})
        mem = worker.call({"cmd": "memory"})
        flops = worker.call({"cmd": "flops"})["flops"]
    except Exception as e:
        raise RuntimeError(f"{e} (its stderr: {log})") from None
    finally:
        worker.close()
        ctx.child = None
    return {"version": worker.info["version"], "params": worker.info["params"], "step_s": timed["s"] / ctx.steps,
            "loss": timed["loss"], "flops": flops, "mem": mem["allocated"], "mem_reserved": mem["reserved"],
            "source": worker.source}


def peer_run(ctx: Ctx, peer: Peer, precision: str, mode: str) -> dict:
    """One peer run: absent (its rows say why) or measured; beside our run of the same case, precision and mode."""
    name = peer.key if mode == "eager" else f"{peer.key}+compile-{mode}"
    absent = ctx.peer_absent.get(peer.key)
    res = None
    if absent is None:
        try:
            cfg, vocab, batch = composed(ctx, peer.case, precision)
            fn = measure_hf if peer is HF else measure_xt
            with matmul_precision(precision == "fp32" and not ctx.dry):
                res = fn(ctx, cfg, vocab, batch, precision, mode)
        except PeerAbsent as e:
            absent = ctx.peer_absent[peer.key] = str(e)
    if res is None:
        ctx.peers[(peer.key, mode, precision)] = {"absent": absent}
        ctx.rep.row("peers", peer.case, name, precision, "absent", 1, "", absent)
        say(f"peer {name} {precision}: absent ({absent})")
        peers_section(ctx)
        return ctx.peers[(peer.key, mode, precision)]
    items = int(batch[1].numel())
    peak = ctx.peaks.get("bf16" if precision == "bf16" else ("fp32" if ctx.dry else "tf32"))
    res.update(items=items, rate=items / res["step_s"], batch=tuple(batch[0].shape),
               mfu=res["flops"] / res["step_s"] / peak if peak and res["flops"] else None)
    ctx.peers[(peer.key, mode, precision)] = res
    for metric, unit in (("params", ""), ("items", ""), ("rate", "tokens/s"), ("step_s", "s"), ("flops", "FLOP"),
                         ("mfu", ""), ("mem", "B"), ("mem_reserved", "B"), ("loss", "")):
        ctx.rep.row("peers", peer.case, name, precision, metric, res[metric], unit,
                    f"{peer.label} {res['version']} ({res['source']})" if metric == "rate" else "")
    r = ratio(ctx, peer, precision, mode)
    if r is not None:
        ctx.rep.row("peers", peer.case, name, precision, "ours_over_peer", r, "x", "tokens/s")
    say(f"peer {name} {precision}: {res['step_s'] * 1e3:.1f} ms/step, {res['rate']:,.0f} tokens/s, MFU "
        f"{pct(res['mfu'])}" + (f"; ours / peer {r:.2f}x" if r is not None else ""))
    peers_section(ctx)
    return res


def ours(ctx: Ctx, peer: Peer, precision: str, mode: str) -> dict | None:
    """Our baseline's run of the peer's case in that precision and mode (phase 4's or phase `compiled`'s)."""

    return ctx.results.get((peer.case, label(CASE_BY_KEY[peer.case].variants[0][0], mode), precision))


def ratio(ctx: Ctx, peer: Peer, precision: str, mode: str) -> float | None:
    """Ours / peer tokens/s (the same tokens per step: the ratio of the peer's step time to ours)."""
    a, b = ours(ctx, peer, precision, mode), ctx.peers.get((peer.key, mode, precision))
    if not a or not b or "absent" in b or not a.get("step_s") or not b.get("step_s"):
        return None
    return (a["items"] / a["step_s"]) / (b["items"] / b["step_s"])


def run_peers(ctx: Ctx, modes=("eager",), precisions=("bf16", "fp32")) -> None:
    """Each peer in each precision and mode not measured yet (a case left out by --cases leaves its peer out)."""
    for precision in precisions:
        for mode in modes:
            for peer in PEERS:
                if (ctx.args.cases and peer.case not in ctx.args.cases) or (peer.key, mode, precision) in ctx.peers:
                    continue
                need = (NEED_DRY_S if ctx.dry else NEED_S)[mode]
                phase(ctx, f"peer {peer.key} {mode} {precision}", need, peer_run, peer, precision, mode)


def peers_section(ctx: Ctx) -> None:
    rows, sources = [], {}
    for (key, mode, precision), r in ctx.peers.items():
        peer = PEER_BY_KEY[key]
        prec = ctx.fp32_name if precision == "fp32" else precision
        mine = ours(ctx, peer, precision, mode)
        if mine:
            rows.append([f"ours: {CASE_BY_KEY[peer.case].label}", prec, mode, f"{mine['params']:,}",
                         "x".join(map(str, mine["batch"])), f"{mine['step_s'] * 1e3:.1f}",
                         f"{mine['rate']:,.0f} tokens/s", fmt(mine["flops"], 2), pct(mine["mfu"]),
                         fmt(mine["mem"], 2, "B") if mine["mem"] is not None else "n/a", ""])
        if "absent" in r:
            rows.append([peer.label, prec, mode, "", "", "", f"absent: {r['absent']}", "", "", "", ""])
            continue
        rt = ratio(ctx, peer, precision, mode)
        sources.setdefault(peer.label, r["source"])
        rows.append([f"{peer.label} {r['version']}", prec, mode, f"{r['params']:,}", "x".join(map(str, r["batch"])),
                     f"{r['step_s'] * 1e3:.1f}", f"{r['rate']:,.0f} tokens/s", fmt(r["flops"], 2), pct(r["mfu"]),
                     fmt(r["mem"], 2, "B") if r["mem"] is not None else "n/a",
                     f"**{rt:.2f}x**" if rt is not None else "ours not measured"])
        if key == "hf" and precision == "bf16" and rt is not None:
            ctx.rep.target(f"peer_hf_{mode}", f"Transformer-XL L6 bf16 {mode}: ours / HF TransfoXLLMHeadModel tokens/s",
                           f"{rt:.2f}x", f">= {TARGETS['hf_ratio']:.2f}x", rt >= TARGETS["hf_ratio"])
    lines = ["Each peer at our baseline config's size, dropout, batch, optimizer and gradient clip, on random tokens, "
             f"{ctx.warmup} warm-up + {ctx.steps} timed steps on the same device as ours, in the same precision "
             "(`make bench`'s builders: bench/cases.py `xt_decoder`, bench/hf_txl_worker.py in a process of its own). "
             "Tokens per step are ours, so ours / peer is the ratio of step times. x-transformers as `make bench` "
             "configures it (pre-LN, learned positions, no FFN biases, SDPA attention; ours here: the paper's "
             "post-LN with sinusoids); HF: relative attention with shared u, v, tied softmax, as ours. FLOPs and MFU "
             "as phase 4 counts ours; peak memory: the peer's own. `default`: both compiled with inductor. An absent "
             "peer says why (its packages: `--prepare` carries them in .gpu_peers/).", "",
             *md_table(["model", "precision", "mode", "params", "batch", "step ms", "throughput", "FLOPs/step", "MFU",
                        "peak mem", "ours / peer"], rows, "---|---|---|---:|---|---:|---:|---:|---:|---:|---:")]
    if sources or ctx.hf_failed:
        lines += ["", "Where the peers ran: " + "; ".join(f"{k}: {v}" for k, v in sources.items())
                  + "".join(f"; HF not from {k} ({v})" for k, v in ctx.hf_failed.items()) + "."]
    ctx.rep.section("peers", "Ours beside the peers on the same device: HF Transformer-XL and x-transformers", lines)
