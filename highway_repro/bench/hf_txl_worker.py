"""HF transformers TransfoXLLMHeadModel as a benchmark worker process (standalone: torch + transformers only).

Run by `highway_repro.bench` with the python of a venv that has transformers==4.36.2 (the last
release with Transformer-XL; its pins clash with this project's), e.g.

    .venv-bench-hf/bin/python highway_repro/bench/hf_txl_worker.py

Protocol: one JSON object per line on stdin, one JSON reply per line on stdout.
    {"cmd": "init", "threads": 2, "clock": "wall", "size": {...}} -> {"params": N, "version": "4.36.2"}
    {"cmd": "step"}                                 -> {"s": seconds of one training step}
    {"cmd": "flops"}                                -> {"flops": forward + backward FLOPs}
    {"cmd": "rss"}                                  -> {"maxrss_kb": peak RSS (VmHWM), "rss_kb": ...}
    {"cmd": "quit"}
A training step: forward with the memory of the previous step, mean loss of the
model's own (shifted) labels, backward, Adam step (fused where available), as in our case.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import warnings


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


def main() -> None:
    warnings.filterwarnings("ignore")
    out = sys.stdout
    sys.stdout = sys.stderr  # library prints must not break the protocol
    import torch
    import transformers
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel

    state: dict = {"clock": time.perf_counter}

    def reply(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    def loss_fn():
        o = state["model"](input_ids=state["x"], labels=state["x"], mems=state["mems"])
        state["mems"] = [m.detach() for m in o.mems]
        return o.losses.mean()

    for line in sys.stdin:
        msg = json.loads(line)
        cmd = msg["cmd"]
        if cmd == "init":
            torch.set_num_threads(int(msg["threads"]))
            state["clock"] = time.process_time if msg.get("clock") == "cpu" else time.perf_counter
            s = msg["size"]
            torch.manual_seed(0)
            cfg = TransfoXLConfig(
                vocab_size=s["vocab"], cutoffs=[], adaptive=False, div_val=1, d_model=s["d_model"],
                d_embed=s["d_model"], n_head=s["n_heads"], d_head=s["d_head"], d_inner=s["d_ff"],
                n_layer=s["n_layers"], tgt_len=s["tgt_len"], mem_len=s["mem_len"], ext_len=0, clamp_len=-1,
                same_length=False, attn_type=0, pre_lnorm=False, untie_r=False, dropout=0.0, dropatt=0.0,
                tie_word_embeddings=True)
            model = TransfoXLLMHeadModel(cfg)
            model.train()
            params = [p for p in model.parameters() if p.requires_grad]
            try:
                opt = torch.optim.Adam(params, lr=1e-4, fused=True)
            except (RuntimeError, TypeError, ValueError):
                opt = torch.optim.Adam(params, lr=1e-4)
            g = torch.Generator().manual_seed(0)
            state.update(model=model, opt=opt, mems=None,
                         x=torch.randint(0, s["vocab"], (s["batch"], s["tgt_len"]), generator=g))
            with torch.no_grad():  # steady state from the first step: full memory for timing and FLOP counts
                state["mems"] = model(input_ids=state["x"]).mems
            try:  # the freed blocks of that forward are not setup memory (RSS is read next)
                import ctypes

                ctypes.CDLL("libc.so.6").malloc_trim(0)
            except (OSError, AttributeError):
                pass
            reply({"params": sum(p.numel() for p in model.parameters()), "version": transformers.__version__,
                   "torch": torch.__version__, "pid": os.getpid()})
        elif cmd == "step":
            clock = state["clock"]
            t0 = clock()
            state["opt"].zero_grad(set_to_none=True)
            loss_fn().backward()
            state["opt"].step()
            reply({"s": clock() - t0})
        elif cmd == "flops":
            from torch.utils.flop_counter import FlopCounterMode

            with FlopCounterMode(display=False) as fc:
                loss_fn().backward()
            state["opt"].zero_grad(set_to_none=True)
            reply({"flops": int(fc.get_total_flops())})
        elif cmd == "rss":
            reply({"maxrss_kb": _status_kb("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                   "rss_kb": _status_kb("VmRSS")})
        elif cmd == "quit":
            reply({"bye": True})
            return
        else:
            reply({"error": f"unknown cmd {cmd!r}"})


if __name__ == "__main__":
    main()
