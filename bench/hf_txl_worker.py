"""HF transformers TransfoXLLMHeadModel as a worker process (standalone: torch + transformers only).

Run by `bench` (`python -m bench`) with the python of a venv that has transformers==4.36.2 (the last
release with Transformer-XL; its pins clash with this project's), e.g.

    .venv-bench-hf/bin/python bench/hf_txl_worker.py

and by the GPU check's peer rows (scripts/gpucheck/peers.py) with the check's own Python, the carried
transformers first on its path.

Protocol: one JSON object per line on stdin, one JSON reply per line on stdout.
    {"cmd": "init", "threads": 2, "clock": "wall", "size": {...}, ...}
        -> {"params": N, "version": "4.36.2", ...}, or {"absent": "why transformers did not import"}
        optional: "device" (cpu), "precision" (fp32 | tf32 | bf16: autocast), "optimizer" ({"name": "Adam",
        "kwargs": {...}}; default fused Adam, lr 1e-4), "grad_clip", "compile" (a torch.compile mode, or
        "default"); size may hold "dropout" and "dropatt" (default 0)
    {"cmd": "step"}                                 -> {"s": seconds of one training step}
    {"cmd": "steps", "n": 30}                       -> {"s": seconds of n steps, device synced, "loss": last}
    {"cmd": "flops"}                                -> {"flops": forward + backward FLOPs}
    {"cmd": "memory"}                               -> {"allocated": peak CUDA bytes, "reserved": ...} (None on CPU)
    {"cmd": "rss"}                                  -> {"maxrss_kb": peak RSS (VmHWM), "rss_kb": ...}
    {"cmd": "quit"}
A training step: forward with the memory of the previous step, mean loss of the
model's own (shifted) labels, backward, clip (where asked), optimizer step, as in our case.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import time
import warnings

# The model needs none of these; transformers 4.36.2 checks their versions at import time where they are installed,
# and a machine's newer tokenizers (>= 0.19) or accelerate fail that check or its imports. None in sys.modules: absent.
HIDDEN = ("tokenizers", "sentencepiece", "accelerate")


def _status_kb(field: str) -> int:
    """VmRSS / VmHWM (peak) of this process from /proc (ru_maxrss keeps the parent's across fork + exec)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _load():
    """(torch, transformers) or the reason they do not import."""
    for name in HIDDEN:
        sys.modules.setdefault(name, None)
    try:
        import transformers  # first: where it is missing, the reason comes before torch is loaded

        import torch
        from transformers import TransfoXLLMHeadModel  # noqa: F401  (lazy: this import loads the model's module)
    except Exception as e:  # ImportError, or transformers' RuntimeError around one
        cause = e
        while cause.__cause__ is not None:
            cause = cause.__cause__
        arg = cause.args[0] if cause.args and isinstance(cause.args[0], str) else str(cause)
        text = arg.strip().splitlines()  # (PackageNotFoundError's str() wraps its message in another sentence)
        return None, f"{type(cause).__name__}: {text[0] if text else ''}"[:300]
    return (torch, transformers), None


def _optimizer(torch, params, spec):
    if spec:
        return getattr(torch.optim, spec["name"])(params, **spec.get("kwargs", {}))
    try:
        return torch.optim.Adam(params, lr=1e-4, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=1e-4)


def _fp32_softmax(torch, model) -> None:
    """The model's softmax layer outside autocast: CPU autocast keeps log_softmax in bf16, which HF's index put into
    its fp32 loss tensor refuses (CUDA autocast runs log_softmax in fp32 by itself)."""
    crit = model.crit
    forward = crit.forward

    def fp32_forward(hidden, labels=None, *args, **kwargs):
        with torch.autocast("cpu", enabled=False):
            return forward(hidden.float(), labels, *args, **kwargs)

    crit.forward = fp32_forward


def main() -> None:
    warnings.filterwarnings("ignore")
    out = sys.stdout
    sys.stdout = sys.stderr  # library prints must not break the protocol
    state: dict = {"clock": time.perf_counter}
    torch = None

    def reply(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    def sync():
        if state["device"].type == "cuda":
            torch.cuda.synchronize()

    def loss_fn(fwd):
        with torch.autocast(state["device"].type, dtype=torch.bfloat16, enabled=state["bf16"]):
            o = fwd(input_ids=state["x"], labels=state["x"], mems=state["mems"])
            state["mems"] = [m.detach() for m in o.mems]
            return o.losses.float().mean()

    def train_step():
        state["opt"].zero_grad(set_to_none=True)
        loss = loss_fn(state["fwd"])
        loss.backward()
        if state["clip"]:
            torch.nn.utils.clip_grad_norm_(state["params"], state["clip"])
        state["opt"].step()
        return loss

    for line in sys.stdin:
        msg = json.loads(line)
        cmd = msg["cmd"]
        if cmd == "init":
            mods, why = _load()
            if mods is None:
                reply({"absent": why})
                return
            torch, transformers = mods
            from transformers import TransfoXLConfig, TransfoXLLMHeadModel

            torch.set_num_threads(int(msg["threads"]))
            state["clock"] = time.process_time if msg.get("clock") == "cpu" else time.perf_counter
            precision = msg.get("precision", "fp32")
            if precision == "tf32":
                torch.set_float32_matmul_precision("high")
            device = torch.device(msg.get("device", "cpu"))
            s = msg["size"]
            torch.manual_seed(int(msg.get("seed", 0)))
            cfg = TransfoXLConfig(
                vocab_size=s["vocab"], cutoffs=[], adaptive=False, div_val=1, d_model=s["d_model"],
                d_embed=s["d_model"], n_head=s["n_heads"], d_head=s["d_head"], d_inner=s["d_ff"],
                n_layer=s["n_layers"], tgt_len=s["tgt_len"], mem_len=s["mem_len"], ext_len=0, clamp_len=-1,
                same_length=False, attn_type=0, pre_lnorm=False, untie_r=False, dropout=s.get("dropout", 0.0),
                dropatt=s.get("dropatt", 0.0), tie_word_embeddings=True)
            model = TransfoXLLMHeadModel(cfg).to(device)
            model.train()
            if precision == "bf16" and device.type == "cpu":
                _fp32_softmax(torch, model)
            params = [p for p in model.parameters() if p.requires_grad]
            mode = msg.get("compile")
            fwd = model if not mode else torch.compile(model, mode=None if mode == "default" else mode, dynamic=False)
            g = torch.Generator().manual_seed(0)
            state.update(model=model, fwd=fwd, params=params, opt=_optimizer(torch, params, msg.get("optimizer")),
                         mems=None, device=device, bf16=precision == "bf16", clip=msg.get("grad_clip"),
                         x=torch.randint(0, s["vocab"], (s["batch"], s["tgt_len"]), generator=g).to(device))
            with torch.no_grad():  # steady state from the first step: full memory for timing and FLOP counts
                state["mems"] = model(input_ids=state["x"]).mems
            try:  # the freed blocks of that forward are not setup memory (RSS is read next)
                import ctypes

                ctypes.CDLL("libc.so.6").malloc_trim(0)
            except (OSError, AttributeError):
                pass
            reply({"params": sum(p.numel() for p in model.parameters()), "version": transformers.__version__,
                   "torch": torch.__version__, "pid": os.getpid(), "transformers_at": transformers.__file__})
        elif cmd == "step":
            clock = state["clock"]
            t0 = clock()
            train_step()
            sync()
            reply({"s": clock() - t0})
        elif cmd == "steps":
            sync()
            t0 = time.perf_counter()
            for _ in range(int(msg["n"])):
                loss = train_step()
            sync()
            reply({"s": time.perf_counter() - t0, "loss": float(loss)})
        elif cmd == "flops":
            from torch.utils.flop_counter import FlopCounterMode

            with FlopCounterMode(display=False) as fc:
                loss_fn(state["model"]).backward()  # the module's own forward: a compiled one hides its FLOPs
            state["opt"].zero_grad(set_to_none=True)
            reply({"flops": int(fc.get_total_flops())})
        elif cmd == "memory":
            cuda = state["device"].type == "cuda"
            reply({"allocated": torch.cuda.max_memory_allocated() if cuda else None,
                   "reserved": torch.cuda.max_memory_reserved() if cuda else None})
        elif cmd == "rss":
            reply({"maxrss_kb": _status_kb("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                   "rss_kb": _status_kb("VmRSS")})
        elif cmd == "quit":
            reply({"bye": True})
            return
        else:
            reply({"error": f"unknown cmd {cmd!r}"})


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
