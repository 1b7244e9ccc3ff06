"""Running the phases: the context they share, one phase with its time check and its own try/except, the time
guard, and subprocesses that the guard can kill."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path

from .common import REPO, elapsed, say
from .report import Report


class Ctx:
    def __init__(self, args, rep: Report):
        self.args, self.rep, self.dry = args, rep, args.dry_run
        self.deadline = args.budget_s
        self.device = "cpu" if self.dry else "cuda"
        self.scale = "smoke" if self.dry else "paper"
        self.warmup, self.steps = args.warmup, args.steps
        self.runs = Path(args.runs).resolve()
        self.peaks: dict[str, float] = {}  # "bf16" | "tf32" | "fp32" -> FLOP/s
        self.results: dict[tuple, dict] = {}  # (case, variant, precision) -> measurement
        self.flops: dict[tuple, int] = {}  # (case, variant) -> FLOPs per training step
        self.configs_ok = False
        self.missing: dict[str, list[str]] = {}  # case key -> missing mirror files
        self.child = None  # the running subprocess (the time guard kills it)
        self.phase = "start"
        self.curves: dict[str, dict] = {}
        self.peers: dict[tuple, dict] = {}  # (peer, mode, precision) -> measurement or {"absent": why}
        self.peer_absent: dict[str, str] = {}  # peer -> why it imports nowhere (not tried again)
        self.hf_failed: dict[str, str] = {}  # where the HF worker did not import transformers -> why

    def left(self) -> float:
        return self.deadline - elapsed()

    @property
    def fp32_name(self) -> str:
        return "fp32" if self.dry else "fp32 (TF32 matmuls)"


def phase(ctx: Ctx, name: str, need_s: float, fn, *args):
    """Run one measurement: skipped if it does not fit into the time left, errors recorded, report rewritten."""
    if ctx.left() < need_s:
        ctx.rep.problem(name, f"skipped: {ctx.left():.0f} s left, it needs about {need_s:.0f} s")
        ctx.rep.timeline.append((name, elapsed(), elapsed(), "skipped (time)"))
        say(f"{name}: skipped ({ctx.left():.0f} s left, needs ~{need_s:.0f} s)")
        ctx.rep.write()
        return None
    ctx.phase = name
    start = elapsed()
    say(f"--- {name}")
    status, out = "ok", None
    try:
        out = fn(ctx, *args)
    except Exception as e:  # each measurement on its own: record and go on
        status = "error"
        lines = str(e).strip().splitlines()
        msg = lines[0] if lines else ""
        # a compiler's own lines (inductor's C++ build: "...: error: ...") say what failed; keep them
        said = [x.strip() for x in lines[1:] if "error" in x.lower()][:4]
        ctx.rep.problem(name, (f"{type(e).__name__}: {msg}" + "".join(f" / {x}" for x in said))[:1200])
        say(f"{name}: ERROR {type(e).__name__}: {msg}")
        traceback.print_exc()
    finally:
        release_memory()
    ctx.rep.timeline.append((name, start, elapsed(), status))
    ctx.rep.write()
    return out


def release_memory() -> None:
    """Free the device memory of the last phase (the trainer and optimizer hold reference cycles)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


def start_guard(ctx: Ctx, grace: float) -> threading.Timer:
    """At --budget-s + grace: kill the running child, write the report, exit (status 3)."""
    def expire():
        say(f"time guard: {elapsed():.0f} s, stopping during '{ctx.phase}'")
        child = ctx.child
        if child is not None and child.poll() is None:
            with contextlib.suppress(Exception):
                os.killpg(child.pid, signal.SIGKILL)
        ctx.rep.problem("time guard", f"stopped at {elapsed():.0f} s during '{ctx.phase}'")
        with contextlib.suppress(Exception):
            ctx.rep.write()
        os._exit(3)

    t = threading.Timer(max(1.0, ctx.deadline + grace - elapsed()), expire)
    t.daemon = True
    t.start()
    return t


def run_child(ctx: Ctx, cmd: list[str], timeout: float) -> tuple[int, str]:
    """A subprocess in its own session (killed as a group on timeout); returns (exit code, output)."""
    say("+ " + " ".join(cmd))
    p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    ctx.child = p
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(Exception):
            os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return 124, (out or "") + f"\n(killed after {timeout:.0f} s)"
    finally:
        ctx.child = None
    return p.returncode, out or ""


def tail(text: str, n: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-n:])
