#!/usr/bin/env python3
"""`make gpu-check`: one prepared run that proves the paper-scale configs on one GPU.

    python scripts/gpu_check.py --prepare                  # on the CPU box: the data subset and the pure-Python
                                                           # dependencies to carry (data/gpu_mirror, .gpu_deps)
    python scripts/gpu_check.py --data data/gpu_mirror     # on the GPU: about 6 min, hard stop at --budget-s
    python scripts/gpu_check.py --dry-run                  # on CPU at tiny sizes (< 1 min): the same code path
    make gpu-check [DRY=1]

Writes `<out>.md` and `<out>.csv` (default `results/gpu_check`), `<out>_curves.csv` and `<out>_curves.png`:

1. machine facts (GPU, memory, driver, CUDA, torch) and the matmul peak measured in the same run
   (bf16, TF32, fp32);
2. data: where the mirror is, what it holds, what is missing;
3. the NaN policy on CUDA: a NaN loss injected at one step is caught by the trainer's deferred check,
   the run stops as `diverged` at that step and keeps its last good checkpoint;
4. every paper-scale model (baseline and one gated variant), through the real configs, `train.run` and
   the Trainer: warm-up + timed steps in bf16 autocast and in fp32 with TF32 matmuls; step time, tokens
   or samples/s, MFU against the measured peak of that precision (FLOPs: torch.utils.flop_counter with
   the formulas of the project's counter), peak CUDA memory, the loss after the steps (finite, falling,
   bf16 against fp32) and the evaluation speed;
5. the learning curve: Transformer-XL 6 layers at the paper's size and hyperparameters, baseline and
   SDU tanh, 400 steps on the enwik8 prefix, validation bpc at step 400 beside the official logs;
6. `torchrun --nproc_per_node=1` with nccl (process group, DDP wrapper, collectives, checkpoint with
   the gathered memory): a run, and the same run stopped halfway and resumed, end equal;
7. the CUDA tests (`pytest -m cuda`);
8. the expected time of every paper table on this GPU: runs x steps x step time + evaluations.

Each measurement runs in its own try/except: an error goes into the report and the check goes on. The
report is rewritten after every phase; a phase that no longer fits into the time left is skipped (and
says so); a time guard writes the report and exits at --budget-s plus a short grace.

Needs torch and numpy, and hydra-core + omegaconf for the configs: when the interpreter lacks them,
the pure-Python copies that `--prepare` puts into `.gpu_deps/` are used. matplotlib only for the PNG
(`--plot` draws it later from the CSV).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import functools
import gc
import importlib.util
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

T0 = time.monotonic()
REPO = Path(__file__).resolve().parents[1]
DEPS = REPO / ".gpu_deps"  # pure-Python packages carried to a bare GPU machine (--prepare)
GPU_MIRROR = REPO / "data" / "gpu_mirror"  # the data subset carried to the GPU machine (--prepare)

# modules: (what needs it, required)
MODULES = {
    "torch": ("everything", True),
    "numpy": ("data, checkpoints", True),
    "hydra": ("the configs (compose API)", False),
    "omegaconf": ("the configs", False),
    "yaml": ("omegaconf, reports", False),
    "antlr4": ("omegaconf interpolations", False),
    "pytest": ("the CUDA tests", False),
    "matplotlib": ("the curve PNG (optional; --plot draws it later)", False),
}
# official training logs, enwik8 6 layers, validation bpc at step 400 (REFERENCE.md B2, VERIFIED);
# the source is highway_repro.report.papers.ENWIK8_L6_LOGS, these are used only if it cannot be imported
OFFICIAL_STEP400 = {"baseline": 2.5668, "sdu_tanh": 2.4276}
# items of the paper's evaluation splits where the check's data is a subset (used to scale evaluation times)
PAPER_EVAL_ITEMS = {"enwik8_prefix": 5_000_000, "cifar10": 10_000}
TARGETS = {"mfu": 0.40, "bf16_vs_fp32": 0.01, "bpc400": 0.15, "resume_rel": 1e-2}

ENWIK8 = ("enwik8/enwik8.prefix",)
PTB = tuple(f"ptb/ptb.{s}.txt" for s in ("train", "valid", "test"))
MNIST = tuple(f"mnist/{n}.gz" for n in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"))
CIFAR = tuple(f"cifar10/cifar-10-batches-py/{n}" for n in ("data_batch_1", "test_batch", "batches.meta"))


def elapsed() -> float:
    return time.monotonic() - T0


def say(msg: str) -> None:
    print(f"[{elapsed():6.1f}s] {msg}", flush=True)


# ----------------------------------------------------------------------------- the models measured

@dataclass(frozen=True)
class Case:
    """One paper-scale model: an experiment config, its variants (baseline first) and the data it needs."""

    key: str
    label: str
    experiment: str
    table: str  # the `make reproduce-<table>` whose time this case's step time sets
    variants: tuple  # ((name, (overrides, ...)), ...)
    overrides: tuple = ()
    files: tuple = ()  # mirror-layout files it reads
    group: str = "B"  # A: the issue's MFU targets (measured first), B: the rest, C: only for the table times
    bf16_lstm: bool = False  # True: holds an LSTM; on CPU, oneDNN runs it in bf16 only with AVX512-BF16 or AMX
    dry: tuple = ()  # extra overrides of the dry run (smaller image batches: bf16 convolutions are slow on CPU)


VARIANTS = frozenset(p.stem for p in (REPO / "configs" / "variant").glob("*.yaml"))


def variant(name: str) -> str:
    """A Highway Transformer variant by its config name; a name with no `configs/variant/<name>.yaml` fails at import,
    not minutes into a GPU run."""
    if name not in VARIANTS:
        raise ValueError(f"variant={name!r}: no configs/variant/{name}.yaml; allowed: {', '.join(sorted(VARIANTS))}")
    return name


def _ht(gated: str | None = "sdu_tanh") -> tuple:
    base = ((variant("baseline"), ("variant=baseline",)),)
    return base + (((variant(gated), (f"variant={gated}",)),) if gated else ())


def cpu_bf16_features() -> list[str]:  # in the package; imported late, once setup_paths put this checkout first
    from highway_repro.engine.loggers import cpu_bf16_features as features
    return features()


HN = (("plain", ("model.kind=plain",)), ("highway", ("model.kind=highway",)))
SMALL_IMAGES = ("data.batch_size=10", "data.eval_batch_size=50")
CASES = (
    Case("txl6", "Transformer-XL 6 layers, enwik8", "ht_enwik8_l6", "ht_enwik8_l6", _ht(),
         ("data=enwik8_prefix",), ENWIK8, "A"),
    Case("tlm3", "Transformer-L3, char-PTB", "ht_char_ptb", "ht_char_ptb", _ht(), (), PTB, "A"),
    Case("txl12", "Transformer-XL 12 layers, enwik8", "ht_enwik8_l12", "ht_enwik8_l12", _ht("sdu_tanh"),
         ("data=enwik8_prefix",), ENWIK8),
    Case("rt_word", "R-Transformer-L3, word-PTB", "ht_word_ptb", "ht_word_ptb", _ht(), (), PTB, bf16_lstm=True),
    Case("mnist_conv", "highway conv net, 10 layers width 32, MNIST", "hn_table1", "hn_table1", HN, (), MNIST,
         dry=SMALL_IMAGES),
    Case("cifar_conv", "highway conv net, 19 layers, CIFAR-10", "hn_cifar", "hn_cifar", HN,
         ("data.allow_partial=true",), CIFAR[:2], dry=SMALL_IMAGES),
    Case("mlp100", "FC net depth 100, MNIST", "hn_fig1", "hn_fig1", HN, ("model.depth=100", "trial=0"), MNIST,
         dry=SMALL_IMAGES),
    Case("rt_char", "R-Transformer-L3, char-PTB", "ht_char_ptb_rt", "ht_char_ptb_rt", _ht(None), (), PTB, "C"),
    Case("tlm_word", "Transformer-L3, word-PTB", "ht_word_ptb_l3", "ht_word_ptb_l3", _ht(None), (), PTB, "C"),
)
CASE_BY_KEY = {c.key: c for c in CASES}
# tables whose time another case's step time estimates (upper bounds: the measured net is the larger one)
TABLE_CASE = {c.table: c.key for c in CASES} | {"hn_analysis": "mlp100"}
BASE_VARIANTS = ("baseline", "plain")


# ----------------------------------------------------------------------------- environment

def _found(mod: str) -> str | None:
    try:
        spec = importlib.util.find_spec(mod)
    except (ImportError, ValueError):
        return None
    return None if spec is None else (spec.origin or str(list(spec.submodule_search_locations or [])[:1]))


def setup_paths() -> dict:
    """This checkout first on sys.path, the carried pure-Python packages (.gpu_deps) last; both also on
    PYTHONPATH for the children (torchrun, pytest). A standalone script for a bare machine: the package is
    not installed there, and an installed copy of another checkout must not win."""
    sys.path.insert(0, str(REPO))
    parts = [str(REPO)]
    if DEPS.is_dir():
        sys.path.append(str(DEPS))
    env = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(parts + env + ([str(DEPS)] if DEPS.is_dir() else []))
    return {m: _found(m) for m in MODULES}


def preflight(found: dict) -> tuple[list[str], list[str]]:
    """(missing required modules, missing optional modules), printed at once (no import of torch yet)."""
    say(f"python {platform.python_version()} at {sys.executable}; checkout {REPO}"
        + (f"; carried packages {DEPS}" if DEPS.is_dir() else ""))
    for m, (why, required) in MODULES.items():
        where = found.get(m)
        say(f"  {m:<11} {'ok ' if where else 'MISSING'} {where or ''}  ({why}{'; required' if required else ''})")
    missing = [m for m, (_, req) in MODULES.items() if req and not found.get(m)]
    optional = [m for m, (_, req) in MODULES.items() if not req and not found.get(m)]
    if sys.version_info < (3, 10):
        missing.append(f"python >= 3.10 (this is {platform.python_version()})")
    return missing, optional


# ----------------------------------------------------------------------------- report

class Report:
    """Everything measured so far; `write()` renders <out>.md and <out>.csv (after each phase, and by the time guard)."""

    ORDER = ["machine", "data", "peak", "nan", "throughput", "curve", "ddp", "tests", "tables"]

    def __init__(self, out: Path, dry: bool, command: str):
        self.out, self.dry, self.command = out, dry, command
        self.lock = threading.RLock()
        self.rows: list[list] = []
        self.targets: list[tuple] = []  # (key, what, measured, goal, status)
        self.sections: dict[str, tuple[str, list[str]]] = {}
        self.problems: list[tuple[str, str]] = []
        self.timeline: list[tuple[str, float, float, str]] = []
        self.started = datetime.datetime.now(datetime.timezone.utc)
        self.finished = False

    def row(self, section, case, variant, precision, metric, value, unit="", note="") -> None:
        with self.lock:
            self.rows.append([section, case, variant, precision, metric, value, unit, note])

    def section(self, key: str, title: str, lines: list[str]) -> None:
        with self.lock:
            self.sections[key] = (title, list(lines))

    def target(self, key: str, what: str, measured: str, goal: str, ok: bool | None, note: str = "") -> None:
        status = "n/a" if ok is None else ("met" if ok else "**NOT met**")
        with self.lock:
            self.targets = [t for t in self.targets if t[0] != key] + [(key, what, measured, goal,
                                                                        status + (f" ({note})" if note else ""))]
            self.row("targets", key, "", "", "met", "" if ok is None else int(bool(ok)), "", measured)

    def problem(self, phase: str, msg: str) -> None:
        with self.lock:
            self.problems.append((phase, msg))
            self.row("problems", phase, "", "", "error", "", "", msg)

    def write(self) -> None:
        with self.lock:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            md = self._markdown()
            tmp = self.out.with_name(self.out.name + ".md.tmp")
            tmp.write_text(md)
            os.replace(tmp, self.out.with_suffix(".md"))
            tmp = self.out.with_name(self.out.name + ".csv.tmp")
            with open(tmp, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["section", "case", "variant", "precision", "metric", "value", "unit", "note"])
                w.writerows([_csv_value(v) for v in r] for r in self.rows)
            os.replace(tmp, self.out.with_suffix(".csv"))

    def _markdown(self) -> str:
        took = elapsed() / 60
        lines = ["# GPU check" + (" (DRY RUN)" if self.dry else ""), ""]
        if self.dry:
            lines += ["**Dry run on CPU at tiny sizes (`--dry-run`): it proves the code path; its numbers mean "
                      "nothing.**", ""]
        state = "" if self.finished else " **(incomplete: written while the check was still running or " \
                                         "when it was stopped)**"
        lines += [f"Written by `{self.command}` (`make gpu-check`) in {took:.1f} min, started "
                  f"{self.started:%Y-%m-%d %H:%M} UTC.{state} Script: `scripts/gpu_check.py` (its docstring "
                  "says what each section measures); the guide: `docs/gpu.md`.", ""]
        lines += ["## Targets", "", "| target | measured | goal | |", "|---|---|---|---|"]
        lines += [f"| {w} | {m} | {g} | {s} |" for _, w, m, g, s in self.targets] or ["| (none measured yet) | | | |"]
        n = 1
        for key in self.ORDER:
            if key in self.sections:
                title, body = self.sections[key]
                lines += ["", f"## {n}. {title}", "", *body]
                n += 1
        lines += ["", "## Errors and skipped parts", ""]
        lines += [f"- {p}: {m}" for p, m in self.problems] or ["none"]
        lines += ["", "## Timeline", "", "| phase | start s | end s | status |", "|---|---:|---:|---|"]
        lines += [f"| {p} | {a:.0f} | {b:.0f} | {s} |" for p, a, b, s in self.timeline]
        return "\n".join(lines) + "\n"


def _csv_value(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


def md_table(header: list[str], rows: list[list], align: str | None = None) -> list[str]:
    align = align or "|".join("---" for _ in header)
    return ["| " + " | ".join(header) + " |", "|" + align + "|"] + ["| " + " | ".join(str(c) for c in r) + " |"
                                                                  for r in rows]


def fmt(x, digits=1, unit=""):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a" if x is None else str(x)
    if abs(x) >= 1e12:
        return f"{x / 1e12:.{digits}f} T{unit}"
    if abs(x) >= 1e9:
        return f"{x / 1e9:.{digits}f} G{unit}"
    if abs(x) >= 1e6:
        return f"{x / 1e6:.{digits}f} M{unit}"
    if abs(x) >= 1e3:
        return f"{x / 1e3:.{digits}f} k{unit}"
    return f"{x:.{digits}f} {unit}".strip()


def pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def hours(s) -> str:
    if s is None:
        return "n/a"
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.1f} min"


# ----------------------------------------------------------------------------- context and phases

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
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        ctx.rep.problem(name, f"{type(e).__name__}: {msg}"[:600])
        say(f"{name}: ERROR {type(e).__name__}: {msg}")
        traceback.print_exc()
    finally:
        _release_memory()
    ctx.rep.timeline.append((name, start, elapsed(), status))
    ctx.rep.write()
    return out


def _release_memory() -> None:
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


# ----------------------------------------------------------------------------- project glue

def compose(overrides) -> "DictConfig":  # noqa: F821
    """The composed training config, as `python -m highway_repro.train <overrides>` sees it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    import highway_repro.train  # noqa: F401  (registers the `hp` resolver)

    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return hydra_compose("train", overrides=list(overrides))


@contextlib.contextmanager
def trainer_class(cls):
    """`train.run` builds `cls` (a Trainer subclass) instead of the Trainer (run imports the name when called)."""
    from highway_repro.engine import trainer as trainer_mod

    old = trainer_mod.Trainer
    trainer_mod.Trainer = cls
    try:
        yield cls
    finally:
        trainer_mod.Trainer = old


def recording_trainer():
    """A Trainer subclass that keeps the instances `train.run` builds (model, data and memory for the FLOP count)."""
    from highway_repro.engine.trainer import Trainer

    class Recording(Trainer):
        built: list = []

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            Recording.built.append(self)

    return Recording


@contextlib.contextmanager
def matmul_precision(tf32: bool):
    """fp32 matmuls in TF32 ("high") or in full fp32 ("highest"), restored afterwards."""
    import torch

    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _to(batch, device):
    import torch

    return tuple(b.to(device) if torch.is_tensor(b) else b for b in batch)


def register_flop_formulas() -> str:
    """The project's FLOP formulas (highway_repro/engine/flops.py: CPU flash attention, oneDNN and cuDNN RNNs,
    which torch's counter lacks), as the trainer counts them."""
    from highway_repro.engine import flops

    flops.register()
    return flops.__name__


def count_flops(tr) -> int:
    """FLOPs of one training step's forward + backward, counted as the Trainer runs it (its batch of step 0,
    its autocast, and for Transformer-XL its memory after the run: the steady state, full memory)."""
    from torch.utils.flop_counter import FlopCounterMode

    register_flop_formulas()
    batch = _to(tr.data.train_batch(0), tr.device)
    tr.model.train()
    with FlopCounterMode(display=False) as counter:
        with tr._autocast():
            loss, _, _ = tr._forward(batch, tr.mems, getattr(tr.data, "score_len", None))
        loss.backward()
    tr.optimizer.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


def eval_sizes(data) -> dict:
    """split -> (batches, items) of one full evaluation pass over the split as the check's data holds it."""
    out = {}
    for split in data.splits:
        if hasattr(data, "eval_windows") and hasattr(data, "num_targets"):
            out[split] = (len(data.eval_windows(split)), int(data.num_targets(split)))
        elif hasattr(data, "num_examples") and hasattr(data, "eval_batch_size"):
            n = int(data.num_examples(split))
            out[split] = (math.ceil(n / data.eval_batch_size), n)
        else:
            batches = items = 0
            for _, y, *rest in data.eval_batches(split):
                batches, items = batches + 1, items + int(y.shape[0])
            out[split] = (batches, items)
    return out


def eval_speed(tr, device: str) -> dict:
    """Seconds per evaluation batch (after one warm-up batch), on the first evaluation split."""
    split = "val" if "val" in tr.data.splits else tr.data.splits[0]
    sizes = eval_sizes(tr.data)
    k = min(1 if device == "cpu" else (10 if tr.task.kind == "lm" else 5), sizes[split][0])
    tr.evaluate(split, max_batches=1)
    sync(device)
    t = time.perf_counter()
    tr.evaluate(split, max_batches=k)
    sync(device)
    return {"split": split, "batch_s": (time.perf_counter() - t) / max(k, 1), "sizes": sizes,
            "data_name": getattr(tr.data, "name", "")}


def run_overrides(ctx: Ctx, precision: str, max_steps: int, log_every: int) -> list[str]:
    return [f"scale={ctx.scale}", f"trainer.device={ctx.device}", f"trainer.precision={precision}",
            f"trainer.max_steps={max_steps}", f"trainer.log_every={log_every}", "trainer.eval_every=0",
            "trainer.checkpoint_every=0", "trainer.eval_max_batches=null", "trainer.final_max_batches=1",
            "trainer.gate_stats_every=0", "trainer.progress=false", "trainer.splits=[val]", "logger=jsonl",
            "resume=null"]


def fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


# ----------------------------------------------------------------------------- 1. machine and peak

def machine(ctx: Ctx) -> dict:
    import torch

    facts = {"python": platform.python_version(), "torch": torch.__version__,
             "torch CUDA build": torch.version.cuda or "none", "cuDNN": torch.backends.cudnn.version(),
             "CPU cores": os.cpu_count(), "CPU bf16 features": ", ".join(cpu_bf16_features()) or "none",
             "platform": platform.platform(),
             # NGC containers set the first: fp32 matmuls then run in TF32 whatever the code asks (the "fp32" peak too)
             **{v: os.environ.get(v, "unset") for v in ("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "NVIDIA_TF32_OVERRIDE")}}
    with contextlib.suppress(Exception):
        kb = int(next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal")).split()[1])
        facts["RAM"] = f"{kb / 2 ** 20:.0f} GiB"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        facts.update({"GPU": p.name, "GPU count": torch.cuda.device_count(),
                      "GPU memory": f"{p.total_memory / 2 ** 30:.1f} GiB", "compute capability": f"{p.major}.{p.minor}",
                      "SMs": p.multi_processor_count})
        facts["NCCL"] = nccl_version()
        with contextlib.suppress(Exception):
            r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,power.limit",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=15)
            if r.returncode == 0 and r.stdout.strip():
                drv, clock, power = [x.strip() for x in r.stdout.strip().splitlines()[0].split(",")]
                facts.update({"driver": drv, "max SM clock": clock, "power limit": power})
    else:
        facts["GPU"] = "none (CUDA not available)"
    info = _mirror_info()
    facts["tree"] = f"{info.get('commit', 'unknown')} ({info.get('source', 'no git, no PREPARED.json')})"
    rows = [[k, v] for k, v in facts.items()]
    ctx.rep.section("machine", "Machine", md_table(["what", "value"], rows))
    for k, v in facts.items():
        ctx.rep.row("machine", "", "", "", k, v)
    if not ctx.dry and not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available: this is a CPU-only torch or no GPU is visible "
                           f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); use --dry-run on CPU")
    return facts


def nccl_version() -> str | None:
    """torch.cuda.nccl.version(): a tuple in recent torch, an int (e.g. 21805) in older ones."""
    try:
        import torch

        v = torch.cuda.nccl.version()
    except Exception:
        return None
    return ".".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)


def _mirror_info() -> dict:
    mirror = os.environ.get("HIGHWAY_DATA_MIRROR")
    if mirror and (Path(mirror) / "PREPARED.json").is_file():
        with contextlib.suppress(Exception):
            return {**json.loads((Path(mirror) / "PREPARED.json").read_text()),
                    "source": "commit the data was prepared at: the mirror's PREPARED.json"}
    with contextlib.suppress(Exception):
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=5)
        if r.returncode == 0:
            return {"commit": r.stdout.strip(), "source": "git HEAD; uncommitted changes not shown"}
    return {}


def matmul_rate(n: int, dtype, reps: int, device: str) -> float:
    import torch

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    for _ in range(2):
        torch.mm(a, b, out=c)
    sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        torch.mm(a, b, out=c)
    sync(device)
    return 2.0 * n ** 3 * reps / (time.perf_counter() - t)


def matmul_peak(ctx: Ctx) -> dict:
    import torch

    n, reps = (256, 2) if ctx.dry else (8192, 10)
    rows = []
    for name, dtype, tf32 in (("bf16", torch.bfloat16, False), ("tf32", torch.float32, True),
                              ("fp32", torch.float32, False)):
        with matmul_precision(tf32):
            rate = max(matmul_rate(n, dtype, reps, ctx.device) for _ in range(3))
        ctx.peaks[name] = rate
        ctx.rep.row("peak", "matmul", "", name, "flops_per_s", rate, "FLOP/s", f"{n}x{n} @ {n}x{n}, best of 3 x {reps}")
        rows.append([name, fmt(rate, 1, "FLOP/s")])
        say(f"matmul peak {name}: {rate / 1e12:.2f} TFLOP/s")
    _release_memory()
    ctx.rep.section("peak", "Matmul peak (measured in this run)", md_table(["precision", "peak"], rows) + [
        "", f"Square matmuls {n} x {n} @ {n} x {n}, best of 3 trials of {reps} calls after 2 warm-up calls. "
            "MFU below = FLOPs of a training step / step time / this peak, with the peak of the precision the step ran "
            "in (bf16 autocast: bf16; fp32 with TF32 matmuls: TF32)."])
    return ctx.peaks


# ----------------------------------------------------------------------------- 2. data

def data_check(ctx: Ctx) -> None:
    from highway_repro.data import sources

    mirror = sources.mirror_dir()
    lines = [f"Mirror (`HIGHWAY_DATA_MIRROR` or `--data`): `{mirror or 'not set'}`"
             + ("" if mirror is None or mirror.is_dir() else " (**does not exist**)")
             + f"; cache `{sources.cache_dir()}`; downloads off (`HIGHWAY_DATA_OFFLINE=1`).", ""]
    info = _mirror_info() if mirror else {}
    if info.get("note"):
        lines += [info["note"], ""]
    rows = []
    for case in CASES:
        missing = [f for f in case.files if sources.locate(f) is None]
        ctx.missing[case.key] = missing
        rows.append([case.label, ", ".join(f"`{f}`" for f in case.files),
                     "ok" if not missing else "**missing** " + ", ".join(f"`{f}`" for f in missing)])
        ctx.rep.row("data", case.key, "", "", "missing_files", len(missing), "", " ".join(missing))
    lines += md_table(["model", "files", "status"], rows)
    lines += ["", "The paper's enwik8 runs use the full corpus (90M/5M/5M); the mirror holds only its 4.15 MB prefix "
                  "(`data=enwik8_prefix`, a proportional 90/5/5 split): speed and memory do not depend on it, the "
                  "step-400 bpc comparison is indicative only. CIFAR-10: the carried subset (see above) is enough for "
                  "speed; evaluation times are scaled to the full 10,000-image test set."]
    ctx.rep.section("data", "Data", lines)
    if any(ctx.missing.values()):
        say("data missing for: " + ", ".join(k for k, v in ctx.missing.items() if v)
            + " (set HIGHWAY_DATA_MIRROR or --data to a folder laid out like the offline mirror; "
              "`python scripts/gpu_check.py --prepare` makes data/gpu_mirror)")


# ----------------------------------------------------------------------------- 3. NaN policy

def nan_check(ctx: Ctx) -> dict:
    """A NaN loss at step 12 (0-based) of a 16-step run with checkpoints every 5 steps: the trainer must stop
    as diverged at step 12 and keep the checkpoint of step 10. On CUDA the trainer's deferred check does it
    (no host sync per step; checked before the step-15 log); on CPU (dry run) the deferred path is forced."""
    import torch

    from highway_repro.engine import checkpoint as ckpt_lib
    from highway_repro.engine.trainer import Trainer
    from highway_repro.train import run

    bad, every, steps = 12, 5, 16
    seen = {"deferred_detections": 0}

    class NanAt(Trainer):
        defer_nan_check = None if not ctx.dry else True  # None: the trainer's own choice (deferred on CUDA)

        def _forward(self, batch, mems, score_len):
            loss, sums, new_mems = super()._forward(batch, mems, score_len)
            if self.model.training and self.step == bad:
                loss = loss * float("nan")
            return loss, sums, new_mems

        def _check_finite(self):
            if self._first_bad is not None and int(self._first_bad) < self.cfg.max_steps:
                seen["deferred_detections"] += 1
            return super()._check_finite()

    if ctx.missing.get("txl6"):
        raise RuntimeError(f"data missing: {', '.join(ctx.missing['txl6'])}")
    out = fresh_dir(ctx.runs / "nan")
    cfg = compose(["experiment=ht_enwik8_l6", "data=enwik8_prefix", *run_overrides(ctx, "bf16", steps, every),
                   f"trainer.checkpoint_every={every}"])
    with trainer_class(NanAt):
        final = run(cfg, out)
    ck = ckpt_lib.load(out / "ckpt" / "last.pt")
    finite = all(bool(torch.isfinite(v).all()) for v in ck["model"].values() if torch.is_tensor(v))
    logged = [x.get("step") for x in read_jsonl(out / "metrics.jsonl")]
    res = {"status": final.get("status"), "step": final.get("step"), "error": final.get("error"),
           "ckpt_step": ck.get("step"), "ckpt_finite": finite, "last_logged_step": max(logged, default=None),
           "deferred": seen["deferred_detections"] > 0, "device": ctx.device}
    ok = (res["status"] == "diverged" and res["step"] == bad and res["ckpt_step"] == 10 and finite
          and res["deferred"] and (res["last_logged_step"] or 0) <= 10)
    for k, v in res.items():
        ctx.rep.row("nan", "txl6", "baseline", "bf16", k, v)
    ctx.rep.section("nan", "NaN policy on the device (deferred check)", [
        f"Transformer-XL 6 layers (`ht_enwik8_l6`, `scale={ctx.scale}`), bf16, {steps} steps, checkpoints every {every}, "
        f"`trainer.nan_policy=stop`; the loss of step {bad} is multiplied by NaN (a Trainer subclass).", "",
        *md_table(["expected", "got"], [
            ["status diverged", res["status"]], [f"stopped at step {bad}", res["step"]],
            ["error names the step", res["error"]], ["ckpt/last.pt is step 10", res["ckpt_step"]],
            ["its weights finite", finite], ["nothing logged after step 10", res["last_logged_step"]],
            ["caught by the deferred check" + ("" if not ctx.dry else " (forced on CPU)"), res["deferred"]]]),
    ])
    ctx.rep.target("nan", f"NaN policy on {ctx.device}: injected NaN caught by the deferred check, stop with the "
                          "last good checkpoint", f"{res['status']} at step {res['step']}, ckpt step {res['ckpt_step']}",
                   f"diverged at {bad}, ckpt 10", ok)
    return res


# ----------------------------------------------------------------------------- 4. throughput

def throughput(ctx: Ctx, case: Case, variant: str, overrides: tuple, precision: str) -> dict:
    import torch

    from highway_repro.train import run

    if ctx.missing.get(case.key):
        raise RuntimeError(f"data missing: {', '.join(ctx.missing[case.key])}")
    W, S = ctx.warmup, ctx.steps
    log_every = math.gcd(W, S)
    out = fresh_dir(ctx.runs / f"{case.key}-{variant}-{precision}")
    cfg = compose([f"experiment={case.experiment}", *case.overrides, *overrides,
                   *run_overrides(ctx, precision, W + S, log_every), *(case.dry if ctx.dry else ())])
    cuda = ctx.device.startswith("cuda")
    rec = recording_trainer()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    with trainer_class(rec), matmul_precision(precision == "fp32" and not ctx.dry):
        final = run(cfg, out)
        wall = time.perf_counter() - t
        mem = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()) if cuda else (None, None)
        tr = rec.built[-1]
        rec.built.clear()
        if final.get("status") != "done":
            raise RuntimeError(f"the run ended {final.get('status')}: {final.get('error')}")
        lines = [x for x in read_jsonl(out / "metrics.jsonl") if any(k.startswith("perf/") for k in x)]
        timed = [x for x in lines if x["step"] > W]
        if not timed:
            raise RuntimeError(f"no timed log lines after step {W} in {out / 'metrics.jsonl'}")
        unit = next(k for k in timed[0] if k.startswith("perf/")).split("/", 1)[1]
        rate = len(timed) / sum(1.0 / float(x[f"perf/{unit}"]) for x in timed)  # equal intervals: harmonic mean
        batch = tr.data.train_batch(0)
        items = int(batch[1].numel()) if tr.task.kind == "lm" else int(batch[1].shape[0])
        key = (case.key, variant)
        if key not in ctx.flops:
            try:  # the speed numbers stand without it
                ctx.flops[key] = count_flops(tr)
            except Exception as e:
                ctx.flops[key] = None
                ctx.rep.problem(f"flops {case.key} {variant}", f"{type(e).__name__}: {e}"[:300])
        try:
            ev = eval_speed(tr, ctx.device)
        except Exception as e:
            ev = None
            ctx.rep.problem(f"eval speed {case.key} {variant} {precision}", f"{type(e).__name__}: {e}"[:300])
        params = sum(p.numel() for p in tr.model.parameters())
    del tr
    shutil.rmtree(out / "ckpt", ignore_errors=True)
    step_s = items / rate
    peak = ctx.peaks.get("bf16" if precision == "bf16" else ("fp32" if ctx.dry else "tf32"))
    res = {"case": case.key, "variant": variant, "precision": precision, "params": params, "items": items,
           "unit": unit.replace("_per_s", ""), "rate": rate, "step_s": step_s, "flops": ctx.flops[key],
           "mfu": (ctx.flops[key] / step_s / peak) if peak and ctx.flops[key] else None, "mem": mem[0],
           "mem_reserved": mem[1],
           "loss_first": float(lines[0]["train/loss"]), "loss_last": float(lines[-1]["train/loss"]),
           "wall_s": wall, "eval": ev, "batch": tuple(batch[0].shape)}
    res["finite"] = math.isfinite(res["loss_last"])
    res["falling"] = res["finite"] and res["loss_last"] < res["loss_first"]
    ctx.results[(case.key, variant, precision)] = res
    for metric in ("params", "items", "rate", "step_s", "flops", "mfu", "mem", "mem_reserved", "loss_first",
                   "loss_last", "finite", "falling", "wall_s"):
        ctx.rep.row("throughput", case.key, variant, precision, metric, res[metric],
                    {"rate": f"{res['unit']}/s", "step_s": "s", "flops": "FLOP", "mem": "B", "mem_reserved": "B",
                     "wall_s": "s"}.get(metric, ""))
    if ev:
        ctx.rep.row("throughput", case.key, variant, precision, "eval_batch_s", ev["batch_s"], "s", ev["split"])
    say(f"{case.key} {variant} {precision}: {step_s * 1e3:.1f} ms/step, {rate:,.0f} {res['unit']}/s, "
        f"MFU {pct(res['mfu'])}, mem {fmt(mem[0], 2, 'B')}, loss {res['loss_first']:.3f} -> {res['loss_last']:.3f}")
    throughput_section(ctx)
    return res


def throughput_section(ctx: Ctx) -> None:
    rows = []
    worst = None
    for (ck, var, prec), r in ctx.results.items():
        other = ctx.results.get((ck, var, "fp32" if prec == "bf16" else "bf16"))
        rel = None
        if other and prec == "bf16" and r["finite"] and other["finite"]:
            rel = abs(r["loss_last"] - other["loss_last"]) / abs(other["loss_last"])
            ctx.rep.row("throughput", ck, var, "bf16", "loss_rel_diff_vs_fp32", rel)
            if worst is None or rel > worst[0]:
                worst = (rel, f"{ck} {var}")
        case = CASE_BY_KEY[ck]
        rows.append([case.label, var, ctx.fp32_name if prec == "fp32" else prec, f"{r['params']:,}",
                     "x".join(map(str, r["batch"])), f"{r['step_s'] * 1e3:.1f}", f"{r['rate']:,.0f} {r['unit']}/s",
                     fmt(r["flops"], 2), pct(r["mfu"]), fmt(r["mem"], 2, "B") if r["mem"] is not None else "n/a",
                     f"{r['loss_first']:.3f} → {r['loss_last']:.3f}", "yes" if r["falling"] else "**no**",
                     pct(rel) if rel is not None else ""])
    lines = [f"Each row: the experiment's config at `scale={ctx.scale}` through `train.run` and the Trainer, "
             f"{ctx.warmup} warm-up + {ctx.steps} timed steps (speed from the trainer's own `perf/*` lines of the "
             "timed log intervals; a log interval ends with a host sync), then one evaluation batch. fp32 rows run "
             "with TF32 matmuls (`torch.set_float32_matmul_precision('high')`; the trainer itself leaves torch's "
             "default, full fp32). FLOPs: forward + backward of one step (torch.utils.flop_counter with the "
             "project's formulas and cuDNN RNNs; causal attention kernels are counted in full, as torch counts "
             "them); MFU = FLOPs / step time / measured peak of the step's precision. Memory: "
             "`torch.cuda.max_memory_allocated` over the run (model, Adam/SGD state, activations, one evaluation "
             "batch). Loss: mean training loss of the first (warm-up) and of the last log interval.", "",
             *md_table(["model", "variant", "precision", "params", "batch", "step ms", "throughput", "FLOPs/step",
                        "MFU", "peak mem", "loss", "falling", "bf16 vs fp32"], rows,
                       "---|---|---|---:|---|---:|---:|---:|---:|---:|---|---|---:")]
    ctx.rep.section("throughput", "Training speed, MFU and memory at the paper's sizes", lines)
    for key, label in (("txl6", "Transformer-XL L6 (paper size) bf16 MFU"), ("tlm3", "Transformer-L3 bf16 MFU")):
        r = ctx.results.get((key, "baseline", "bf16"))
        if r:
            ctx.rep.target(f"mfu_{key}", label, pct(r["mfu"]), f">= {pct(TARGETS['mfu'])}",
                           r["mfu"] is not None and r["mfu"] >= TARGETS["mfu"])
    if worst:
        ctx.rep.target("bf16", "bf16 loss within 1% of fp32 after the timed steps (worst case)",
                       f"{pct(worst[0])} ({worst[1]})", f"<= {pct(TARGETS['bf16_vs_fp32'])}",
                       worst[0] <= TARGETS["bf16_vs_fp32"])
    done = list(ctx.results.values())
    bad = [f"{r['case']} {r['variant']} {r['precision']}" for r in done if not r["finite"]]
    ctx.rep.target("finite", "training losses finite after the timed steps", f"{len(done) - len(bad)} of {len(done)}",
                   "all", not bad, ("not: " + ", ".join(bad)) if bad else "")
    flat = [f"{r['case']} {r['variant']} {r['precision']}" for r in done
            if not r["falling"] and not (r["case"] == "mlp100" and r["variant"] == "plain")]
    ctx.rep.target("falling", "training loss falling over the steps (the plain depth-100 net excepted: the paper "
                              "shows it does not train)", f"{len(done) - len(flat)} of {len(done)}", "all", not flat,
                   ("not: " + ", ".join(flat)) if flat else "")


def throughput_jobs(groups: str) -> list[tuple]:
    jobs = []
    for case in CASES:
        if case.group in groups:
            for variant, ov in case.variants:
                for precision in ("bf16",) if case.group == "C" else ("bf16", "fp32"):
                    jobs.append((case, variant, ov, precision))
    return jobs


def run_throughput(ctx: Ctx, groups: str, reserve: float = 0.0) -> None:
    """The speed runs of these case groups; each starts only if it fits, with `reserve` seconds kept for later."""
    for case, variant, ov, precision in throughput_jobs(groups):
        if ctx.args.cases and case.key not in ctx.args.cases:
            continue
        if ctx.dry and precision == "bf16" and case.bf16_lstm and not cpu_bf16_features():
            ctx.rep.problem(f"throughput {case.key} {variant} bf16", "cannot run on this CPU: its flags have neither "
                                                                     "avx512_bf16 nor amx_bf16 (oneDNN's bf16 LSTM)")
            continue
        need = 8 if ctx.dry else (30 if case.key == "txl12" else 15)
        phase(ctx, f"throughput {case.key} {variant} {precision}", need + reserve, throughput, case, variant, ov,
              precision)


# ----------------------------------------------------------------------------- 5. learning curve

def official_step400() -> dict:
    try:
        from highway_repro.report.papers import ENWIK8_L6_LOG_STEPS, ENWIK8_L6_LOGS

        i = ENWIK8_L6_LOG_STEPS.index(400)
        return {k: ENWIK8_L6_LOGS[k][i] for k in OFFICIAL_STEP400}
    except Exception:
        return dict(OFFICIAL_STEP400)


def curve_need(ctx: Ctx, variant: str) -> float:
    """Seconds one curve run needs: steps x the measured bf16 step time + 4 validation passes, with a margin
    (before any measurement: 0.25 s per step, 30 s of evaluation)."""
    r = ctx.results.get(("txl6", variant, "bf16")) or ctx.results.get(("txl6", "baseline", "bf16"))
    train = ctx.args.curve_steps * (r["step_s"] if r else 0.25)
    ev = r.get("eval") if r else None
    per_pass = (lambda n: min(n, 2)) if ctx.dry else (lambda n: n)  # the dry run caps each pass at 2 batches
    evals = 4 * per_pass(ev["sizes"]["val"][0]) * ev["batch_s"] if ev and "val" in ev["sizes"] else 30.0
    return (8 if ctx.dry else 20) + 1.3 * (train + evals)


def curve_run(ctx: Ctx, variant: str) -> dict:
    from highway_repro.train import run

    if ctx.missing.get("txl6"):
        raise RuntimeError(f"data missing: {', '.join(ctx.missing['txl6'])}")
    steps = ctx.args.curve_steps
    out = fresh_dir(ctx.runs / f"curve-{variant}")
    cap = "2" if ctx.dry else "null"
    cfg = compose(["experiment=ht_enwik8_l6", "data=enwik8_prefix", f"variant={variant}", "seed=1111",
                   f"scale={ctx.scale}", f"trainer.device={ctx.device}", "trainer.precision=bf16",
                   f"trainer.max_steps={steps}", f"trainer.eval_every={max(1, steps // 4)}",
                   f"trainer.log_every={max(1, steps // 40)}", "trainer.checkpoint_every=0",
                   f"trainer.eval_max_batches={cap}", f"trainer.final_max_batches={cap}", "trainer.splits=[val]",
                   "trainer.gate_stats_every=0", "trainer.progress=false", "optim.scheduler.kind=constant",
                   "logger=jsonl", "resume=null"])
    t = time.perf_counter()
    final = run(cfg, out)
    wall = time.perf_counter() - t
    if final.get("status") != "done":
        raise RuntimeError(f"the run ended {final.get('status')}: {final.get('error')}")
    hist = read_jsonl(out / "metrics.jsonl")
    train = [(x["step"], float(x["train/loss"]) / math.log(2)) for x in hist if "train/loss" in x]
    val = [(x["step"], float(x["val/bpc"])) for x in hist if "val/bpc" in x]
    res = {"variant": variant, "steps": steps, "val_bpc": float(final["val/bpc"]), "train": train, "val": val,
           "wall_s": wall, "batch": f"{cfg.data.batch_size}x{cfg.data.seq_len}"}
    ctx.curves[variant] = res
    ctx.rep.row("curve", "txl6", variant, "bf16", f"val_bpc_step{steps}", res["val_bpc"])
    ctx.rep.row("curve", "txl6", variant, "bf16", "wall_s", wall, "s")
    say(f"curve {variant}: val bpc at step {steps} = {res['val_bpc']:.4f} ({wall:.0f} s)")
    curve_section(ctx)
    return res


def curve_section(ctx: Ctx) -> None:
    official = official_step400()
    steps = ctx.args.curve_steps
    rows = []
    for variant, r in ctx.curves.items():
        ref = official.get(variant)
        diff = r["val_bpc"] - ref if ref is not None else None
        rows.append([variant, f"{r['val_bpc']:.4f}", f"{ref:.4f}" if ref else "", f"{diff:+.4f}" if diff is not None else "",
                     f"{r['wall_s']:.0f} s"])
        if ref is not None and steps == 400:
            ctx.rep.target(f"bpc400_{variant}", f"step-400 val bpc, {variant}, vs official log {ref}",
                           f"{r['val_bpc']:.4f} ({diff:+.4f})", f"within {TARGETS['bpc400']}",
                           abs(diff) <= TARGETS["bpc400"], "indicative: enwik8 prefix, not the full corpus")
    b, t = ctx.curves.get("baseline"), ctx.curves.get("sdu_tanh")
    if b and t:
        ctx.rep.target("tanh_below", f"SDU tanh below the baseline at step {steps}",
                       f"{t['val_bpc']:.4f} vs {b['val_bpc']:.4f}", "tanh < baseline", t["val_bpc"] < b["val_bpc"],
                       "indicative: enwik8 prefix")
    lines = [
        f"Transformer-XL 6 layers at the paper's size and hyperparameters (`experiment=ht_enwik8_l6 scale={ctx.scale}`: "
        "d 512, 8 heads, d_inner 2048, tgt/mem 512, batch 22, Adam 2.5e-4, clip 0.25, dropout 0.1, seed 1111), bf16, "
        f"{steps} steps; validation every {max(1, steps // 4)} steps with the paper's evaluation (tgt 128, mem 896). "
        "The learning rate is held constant (`optim.scheduler.kind=constant`): the paper's cosine over 40,000 steps "
        "is within 0.03% of its start over the first 400 steps.", "",
        "**Data: the enwik8 prefix (4.15 MB, split 90/5/5), not the full corpus of the official runs**: its 3.7M "
        "training bytes are seen 1.2 times in 400 steps (the official runs see 4.5M new bytes), and its validation "
        "split is another 207k bytes than the official 5M. The comparison with the official logs is indicative only.", "",
        *md_table(["variant", f"val bpc at step {steps}", "official log at step 400", "difference", "wall"], rows),
    ]
    if ctx.curves:
        lines += ["", f"Curves (training bpc per log interval, validation bpc at each evaluation): "
                      f"`{ctx.rep.out.name}_curves.csv`, `{ctx.rep.out.name}_curves.png`."]
    ctx.rep.section("curve", f"Learning curve: enwik8 6 layers, {steps} steps", lines)
    write_curves(ctx.rep.out, ctx.curves, official)


def curves_png(ctx: Ctx) -> Path:
    """The PNG of the curves CSV (matplotlib may be missing on the GPU machine: `--plot` draws it later)."""
    csv_path = ctx.rep.out.with_name(ctx.rep.out.name + "_curves.csv")
    if _found("matplotlib") is None:
        raise RuntimeError(f"matplotlib is missing here: draw it elsewhere with `python scripts/gpu_check.py "
                           f"--plot {csv_path.name}`")
    return plot_curves(csv_path, ctx.rep.out.with_name(ctx.rep.out.name + "_curves.png"))


def write_curves(out: Path, curves: dict, official: dict) -> None:
    path = out.with_name(out.name + "_curves.csv")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "split", "step", "bpc"])
        for variant, r in curves.items():
            w.writerows([variant, "train", s, f"{v:.5f}"] for s, v in r["train"])
            w.writerows([variant, "val", s, f"{v:.5f}"] for s, v in r["val"])
        for variant, v in official.items():
            w.writerow([variant, "official_val", 400, v])


def plot_curves(csv_path: Path, png: Path) -> Path:
    from highway_repro.report.plots import Panel, plot

    series, reference = {}, {}
    with open(csv_path) as f:
        for r in csv.DictReader(f):
            target = reference if r["split"] == "official_val" else series
            label = f"{r['variant']} {'official log, val' if r['split'] == 'official_val' else r['split']}"
            xs, ys = target.setdefault(label, ([], []))
            xs.append(int(r["step"]))
            ys.append(float(r["bpc"]))
    return plot(png, [Panel("Transformer-XL 6 layers, enwik8 prefix (indicative)", series, "bpc"),
                      Panel("official training logs (full enwik8), val bpc", reference, "bpc", dashed=True)])


# ----------------------------------------------------------------------------- 6. torchrun + nccl

def ddp_check(ctx: Ctx) -> dict:
    work = fresh_dir(ctx.runs / "ddp")
    result = work / "result.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
           str(Path(__file__).resolve()), "--ddp-worker", "--runs", str(work)] + (["--dry-run"] if ctx.dry else [])
    rc, out = run_child(ctx, cmd, timeout=min(150.0, max(30.0, ctx.left() - 15)))  # ~40 s on a GPU
    if not result.exists():
        raise RuntimeError(f"torchrun exited {rc} without a result: {tail(out, 6)}")
    r = json.loads(result.read_text())
    if r.get("error"):
        raise RuntimeError(f"the torchrun worker failed: {r['error']} | {tail(out, 4)}")
    ok = (r["backend"] == ("gloo" if ctx.dry else "nccl") and r["all_reduce_ok"] and r["ckpt_step"] == r["half"]
          and r["resumed_step"] == r["steps"] and r["max_rel_diff"] <= TARGETS["resume_rel"])
    for k in ("backend", "world_size", "device", "nccl", "all_reduce_ok", "ckpt_step", "ckpt_mems", "resumed_step",
              "max_rel_diff", "wall_s"):
        ctx.rep.row("ddp", "txl6", "baseline", "bf16", k, r.get(k))
    rows = [[k, f"{r['uninterrupted'][k]:.6f}", f"{r['resumed'][k]:.6f}",
             f"{abs(r['uninterrupted'][k] - r['resumed'][k]) / abs(r['uninterrupted'][k]):.2e}"]
            for k in r["compared"]]
    ctx.rep.section("ddp", "torchrun --nproc_per_node=1 with " + r["backend"], [
        f"`torchrun --standalone --nproc_per_node=1 scripts/gpu_check.py --ddp-worker`: process group `{r['backend']}` "
        f"(NCCL {r.get('nccl') or 'n/a'}) on `{r['device']}`, world size {r['world_size']}, plus the trainer's gloo "
        f"group for flags; all_reduce check {'ok' if r['all_reduce_ok'] else '**failed**'}. `train.run(..., dist=...)` "
        "with the model in DistributedDataParallel (the torchrun path of `highway_repro.train`, whose "
        "`init_from_env` returns None for world size 1, so the worker builds the same `DistInfo` itself): "
        f"Transformer-XL 6 layers (`scale={ctx.scale}`), bf16, {r['steps']} steps, constant LR, checkpoint and "
        f"evaluation every {r['half']} steps; once straight through, once stopped at step {r['half']} "
        f"(checkpoint step {r['ckpt_step']}, memory of {r['ckpt_mems']} layers gathered into it) and resumed with "
        f"`resume=auto` to step {r['resumed_step']}. {r['wall_s']:.0f} s.", "",
        *md_table(["metric", "uninterrupted", "stopped + resumed", "relative difference"], rows),
        "", "CUDA kernels with atomics (embedding backward, ...) are not bit-reproducible, so the target is a "
            f"relative difference <= {TARGETS['resume_rel']:g} (on CPU the two agree exactly)."])
    ctx.rep.target("ddp", f"torchrun --nproc_per_node=1, {r['backend']}: checkpoint and resume",
                   f"max relative difference {r['max_rel_diff']:.1e}, resumed to step {r['resumed_step']}",
                   f"<= {TARGETS['resume_rel']:g}", ok)
    return r


def ddp_worker(args) -> int:
    """Runs under torchrun: one rank; writes <runs>/result.json."""
    work = Path(args.runs)
    result = {"error": None}
    try:
        import torch
        import torch.distributed as tdist

        from highway_repro.engine import checkpoint as ckpt_lib
        from highway_repro.engine.distributed import DistInfo, _pick_device
        from highway_repro.train import run

        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = "cpu" if args.dry_run else "cuda"
        dev = _pick_device(device, local)
        backend = "nccl" if dev.type == "cuda" else "gloo"
        kwargs = {"device_id": dev} if backend == "nccl" else {}
        t0 = time.perf_counter()
        # as highway_repro.engine.distributed.init_from_env does for world sizes > 1
        tdist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(minutes=3), **kwargs)
        flag_group = tdist.new_group(backend="gloo") if backend != "gloo" else None
        dist = DistInfo(rank=rank, world_size=world, local_rank=local, device=dev, backend=backend,
                        _flag_group=flag_group)
        x = torch.full((4,), float(rank + 1), device=dev)
        tdist.all_reduce(x)
        result.update({"backend": tdist.get_backend(), "world_size": world, "device": str(dev),
                       "all_reduce_ok": bool((x == world * (world + 1) / 2).all()),
                       "nccl": nccl_version() if backend == "nccl" else None})
        steps, half = (4, 2) if args.dry_run else (16, 8)
        base = ["experiment=ht_enwik8_l6", "data=enwik8_prefix", f"scale={'smoke' if args.dry_run else 'paper'}",
                f"trainer.device={device}", "trainer.precision=bf16", f"trainer.log_every={half // 2}",
                f"trainer.eval_every={half}", f"trainer.checkpoint_every={half}", "trainer.eval_max_batches=4",
                "trainer.final_max_batches=4", "trainer.splits=[val]", "trainer.gate_stats_every=0",
                "trainer.progress=false", "optim.scheduler.kind=constant", "logger=jsonl"]
        whole = run(compose(base + [f"trainer.max_steps={steps}", "resume=null"]), fresh_dir(work / "whole"), dist=dist)
        part_dir = fresh_dir(work / "part")
        run(compose(base + [f"trainer.max_steps={half}", "resume=null"]), part_dir, dist=dist)
        ck = ckpt_lib.load(part_dir / "ckpt" / "last.pt")
        resumed = run(compose(base + [f"trainer.max_steps={steps}", "resume=auto"]), part_dir, dist=dist)
        compared = [k for k in ("train/loss", "val/loss") if k in whole and k in resumed]
        result.update({
            "steps": steps, "half": half, "ckpt_step": ck["step"], "ckpt_mems": len(ck.get("mems") or []),
            "resumed_step": resumed.get("step"), "compared": compared,
            "uninterrupted": {k: float(whole[k]) for k in compared}, "resumed": {k: float(resumed[k]) for k in compared},
            "max_rel_diff": max(abs(float(whole[k]) - float(resumed[k])) / abs(float(whole[k])) for k in compared),
            "wall_s": time.perf_counter() - t0})
        dist.cleanup()
    except Exception as e:
        traceback.print_exc()
        result["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    work.mkdir(parents=True, exist_ok=True)
    (work / "result.json").write_text(json.dumps(result, indent=1, default=str))
    return 0 if result["error"] is None else 1


# ----------------------------------------------------------------------------- 7. CUDA tests

def cuda_tests(ctx: Ctx) -> dict:
    import xml.etree.ElementTree as ET

    files = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py") if "mark.cuda" in p.read_text())
    if not files:
        raise RuntimeError("no test file under tests/ uses the `cuda` marker")
    xml = ctx.runs / "cuda_tests.xml"
    xml.parent.mkdir(parents=True, exist_ok=True)
    xml.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
           f"--junitxml={xml}", *files]
    rc, out = run_child(ctx, cmd, timeout=min(120.0, max(20.0, ctx.left() - 15)))  # ~30 s on a GPU
    if not xml.exists():
        raise RuntimeError(f"pytest exited {rc} without a result: {tail(out, 6)}")
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failed, skipped = [], set()
    for tc in ET.parse(xml).getroot().iter("testcase"):
        counts["tests"] += 1
        name = f"{tc.get('classname', '')}::{tc.get('name')}"
        if tc.find("failure") is not None or tc.find("error") is not None:
            bad = tc.find("failure") if tc.find("failure") is not None else tc.find("error")
            counts["failures" if tc.find("failure") is not None else "errors"] += 1
            failed.append(f"`{name}`: {(bad.get('message') or '').splitlines()[0][:200] if bad.get('message') else ''}")
        elif tc.find("skipped") is not None:
            counts["skipped"] += 1
            skipped.add((tc.find("skipped").get("message") or "").splitlines()[0][:120])
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    for k, v in {**counts, "passed": passed, "exit_code": rc}.items():
        ctx.rep.row("tests", "pytest -m cuda", "", "", k, v)
    lines = [f"`{' '.join(['python', *cmd[1:]])}`: exit code {rc}; {passed} passed, {counts['failures']} failed, "
             f"{counts['errors']} errors, {counts['skipped']} skipped of {counts['tests']}."]
    lines += [f"- failed: {f}" for f in failed] + [f"- skipped: {s}" for s in sorted(skipped)]
    ctx.rep.section("tests", "CUDA tests (pytest -m cuda)", lines)
    ok = None if ctx.dry else (counts["tests"] > 0 and passed == counts["tests"])
    ctx.rep.target("tests", "CUDA tests (pytest -m cuda)", f"{passed} of {counts['tests']} passed", "all pass", ok,
                   "dry run: skipped without CUDA" if ctx.dry else "")
    return counts


# ----------------------------------------------------------------------------- 8. time per paper table

def _count(value) -> int:
    """Number of values of a sweep parameter: `a,b,c` or `range(a,b[,s])`."""
    v = str(value).strip()
    if v.startswith("range(") and v.endswith(")"):
        return len(range(*[int(x) for x in v[6:-1].split(",")]))
    return len(v.split(","))


@functools.lru_cache(maxsize=1)
def paper_plan() -> tuple[dict, ...]:
    """For each paper table: runs per variant class (baseline/plain vs gated/highway), steps and evaluations at
    scale=paper, from the config files as the runner reads them (`highway_repro.reproduce.plan`, what
    `make reproduce-<table> SCALE=paper` runs). Needs no GPU."""
    from highway_repro.reproduce import plan as table_plan
    from highway_repro.targets import PAPER_TABLES, TARGETS

    plan = []
    for table in PAPER_TABLES:  # the studies are not paper tables
        t = TARGETS[table]
        cfg, grids, names = table_plan(t, "paper", [])
        params = dict(o.split("=", 1) for o in grids[0]) if t.sweep else {}
        n_runs = len(names)
        n_base = sum(any(f"{k}={v}" in n.split(",") for k in ("variant", "model.kind") for v in BASE_VARIANTS)
                     for n in names)
        tr = cfg.trainer
        plan.append({"table": table, "target": f"make reproduce-{table.replace('_', '-')} SCALE=paper",
                     "experiment": t.experiment, "runs": n_runs, "base_runs": n_base, "steps": int(tr.max_steps),
                     "eval_every": int(tr.eval_every), "eval_cap": tr.eval_max_batches,
                     "splits": list(tr.splits), "grid": params, "case": TABLE_CASE.get(table)})
    return tuple(plan)


def table_time(p: dict, base: dict | None, gated: dict | None) -> float | None:
    """Seconds for one table: sum over its runs of steps x step time + evaluation passes x batches x batch time.

    Evaluation passes per run, as the Trainer does them: on `val` (if the data has it) every `eval_every` steps
    and at the end (capped at eval_max_batches in between), then one pass over each other split of
    trainer.splits. Batches per pass: the check's data, scaled to the paper's split where the check holds a
    subset (enwik8 prefix: 5M bytes; CIFAR-10: 10,000 test images)."""
    total = 0.0
    for r, n in ((base, p["base_runs"]), (gated, p["runs"] - p["base_runs"])):
        if n == 0:
            continue
        r = r or base or gated
        if r is None or not r.get("eval"):
            return None
        ev = r["eval"]
        scale = {s: (PAPER_EVAL_ITEMS[ev["data_name"]] / items if ev["data_name"] in PAPER_EVAL_ITEMS else 1.0)
                 for s, (_, items) in ev["sizes"].items()}
        batches = {s: b * scale[s] for s, (b, _) in ev["sizes"].items()}
        evals = 0.0
        if "val" in batches:
            n_val = math.ceil(p["steps"] / p["eval_every"]) if p["eval_every"] else 1
            inter = min(batches["val"], p["eval_cap"]) if p["eval_cap"] else batches["val"]
            evals += (n_val - 1) * inter + batches["val"]
        evals += sum(batches[s] for s in p["splits"] if s != "val" and s in batches)
        total += n * (p["steps"] * r["step_s"] + evals * ev["batch_s"])
    return total


def tables_section(ctx: Ctx) -> None:
    plan = paper_plan()
    rows = []
    for p in plan:
        case = CASE_BY_KEY.get(p["case"])
        times, mems = {}, []
        for prec in ("bf16", "fp32"):
            base = ctx.results.get((p["case"], case.variants[0][0], prec)) if case else None
            gated = ctx.results.get((p["case"], case.variants[-1][0], prec)) if case else None
            if base or gated:
                times[prec] = table_time(p, base, gated)
                mems += [r["mem"] for r in (base, gated) if r and r.get("mem")]
                ctx.rep.row("tables", p["table"], "", prec, "table_s", times[prec], "s", p["target"])
        grid = " x ".join(f"{k} ({_count(v)})" for k, v in p["grid"].items()) or "one run"
        ctx.rep.row("tables", p["table"], "", "", "runs", p["runs"], "", grid)
        note = {"hn_fig1": "upper bound: every depth timed as depth 100",
                "hn_table1": "width 16 timed as width 32 (upper bound)",
                "hn_analysis": "timed as the depth-100 net (upper bound; the analysis net has depth 50)",
                "ht_enwik8_l12": "gated rows timed as tanh on all 12 layers (upper bound)"}.get(p["table"], "")
        rows.append([f"`{p['target']}`", grid, f"{p['runs']:,}", f"{p['steps']:,}",
                     hours(times.get("bf16")), hours(times.get("fp32")),
                     fmt(max(mems), 1, "B") if mems else "n/a", note])
    ctx.rep.section("tables", "Expected time of each paper table on this GPU (one process, runs one after another)", [
        "time = sum over the table's runs of (steps x measured step time + evaluation passes x batches x measured "
        "evaluation batch time); runs from the sweep file and the paper overrides of `highway_repro/reproduce.py`; "
        "gated/highway rows use the gated variant's step time, baseline/plain rows the baseline's. Data loading is "
        "in the step time (the trainer builds batches in the training process). Not included: start-up, checkpoint "
        "writes, the report. bf16 = `trainer.precision=bf16`; fp32 = the configs' default precision with TF32 "
        "matmuls (without TF32, slower). Ways to go faster: docs/gpu.md.", "",
        *md_table(["command", "grid", "runs", "steps/run", "time bf16", "time fp32/TF32", "peak memory", "note"], rows,
                  "---|---|---:|---:|---:|---:|---:|---")])


# ----------------------------------------------------------------------------- --prepare (on the CPU box)

CONFIG_DEPS = ("hydra", "omegaconf", "antlr4")  # what a CUDA PyTorch image lacks: the config stack
TEST_DEPS = ("yaml", "tqdm", "pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "exceptiongroup",
             "tomli", "py")  # `--test-deps`: for a bare Python (7 MiB, most of it pygments)


def prepare_data(src: Path, dst: Path, n_train: int = 3000, n_test: int = 1000) -> dict:
    """A mirror-layout folder with what the check reads: enwik8 prefix, PTB, MNIST as they are; CIFAR-10 cut to
    the first n_train / n_test images of data_batch_1 / test_batch (canonical pickle layout); SHA256SUMS of
    every file (the data layer checks the mirror against it) and PREPARED.json."""
    import hashlib
    import pickle

    import numpy as np

    from highway_repro.data.vision import read_cifar_pickle

    if dst.exists():
        shutil.rmtree(dst)
    for rel in ENWIK8 + PTB + MNIST + CIFAR[2:]:
        if not (src / rel).is_file():
            raise FileNotFoundError(f"{src / rel} is missing: --from must be a folder laid out like the offline mirror")
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, dst / rel)
    for rel, n in ((CIFAR[0], n_train), (CIFAR[1], n_test)):
        images, labels = read_cifar_pickle(src / rel, b"labels")
        d = {b"batch_label": f"first {n} images of {Path(rel).name}".encode(),
             b"labels": [int(v) for v in labels[:n]], b"data": np.ascontiguousarray(images[:n].reshape(n, 3072)),
             b"filenames": [f"{i}.png".encode() for i in range(n)]}
        with open(dst / rel, "wb") as f:
            pickle.dump(d, f, protocol=2)
    files = sorted(p for p in dst.rglob("*") if p.is_file())
    sums = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  ./{p.relative_to(dst).as_posix()}" for p in files]
    (dst / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    commit = ""
    with contextlib.suppress(Exception):
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                timeout=5).stdout.strip()
    info = {"commit": commit or "unknown", "prepared": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "from": str(src),
        "note": f"Prepared subset of the offline mirror (`scripts/gpu_check.py --prepare`): enwik8 prefix, PTB and MNIST "
                f"as they are; CIFAR-10 cut to the first {n_train:,} training and {n_test:,} test images."}
    (dst / "PREPARED.json").write_text(json.dumps(info, indent=1))
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files)}


def prepare_deps(dst: Path, modules: tuple = CONFIG_DEPS) -> dict:
    """Pure-Python copies of `modules` (hydra, omegaconf, antlr4; with TEST_DEPS also yaml, pytest and their
    helpers) from this interpreter (compiled extensions left out: yaml falls back to pure Python), for a GPU
    machine that lacks them."""
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    copied, absent = [], []
    for mod in modules:
        spec = None
        with contextlib.suppress(ImportError, ValueError):
            spec = importlib.util.find_spec(mod)
        if spec is None or spec.origin in (None, "built-in", "frozen") and not spec.submodule_search_locations:
            absent.append(mod)
            continue
        if spec.submodule_search_locations:
            pkg = Path(list(spec.submodule_search_locations)[0])
            shutil.copytree(pkg, dst / pkg.name, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", "*.c"))
        else:
            shutil.copyfile(spec.origin, dst / Path(spec.origin).name)
        copied.append(mod)
    size = sum(p.stat().st_size for p in dst.rglob("*") if p.is_file())
    return {"copied": copied, "absent": absent, "bytes": size}


def prepare(args) -> int:
    src = Path(args.prepare_from or os.environ.get("HIGHWAY_DATA_MIRROR") or "/work/shared/data")
    if src.resolve() == GPU_MIRROR.resolve():
        raise SystemExit(f"--from {src}: that is the folder --prepare writes; give the full offline mirror")
    d = prepare_data(src, GPU_MIRROR, args.cifar_train, args.cifar_test)
    say(f"data: {d['files']} files, {d['bytes'] / 2 ** 20:.1f} MiB in {GPU_MIRROR}")
    p = prepare_deps(DEPS, CONFIG_DEPS + (TEST_DEPS if args.test_deps else ()))
    say(f"packages: {', '.join(p['copied'])} ({p['bytes'] / 2 ** 20:.1f} MiB) in {DEPS}"
        + (f"; not in this interpreter (fine if the GPU's Python is >= 3.11): {', '.join(p['absent'])}"
           if p["absent"] else ""))
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True).stdout.split(b"\0")
    tree = sum((REPO / t.decode()).stat().st_size for t in tracked if t and (REPO / t.decode()).is_file())
    total = (d["bytes"] + p["bytes"] + tree) / 2 ** 20
    say(f"with the tracked files ({tree / 2 ** 20:.1f} MiB): {total:.1f} MiB to carry (limit 64 MiB)")
    print("carry: data/gpu_mirror .gpu_deps\n"
          "run:   python3 scripts/gpu_check.py --data data/gpu_mirror --out \"$OUT/gpu_check\"")
    return 0 if total < 64 else 1


# ----------------------------------------------------------------------------- main

def parse(argv):
    ap = argparse.ArgumentParser(prog="python scripts/gpu_check.py", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="CPU, smoke sizes, a few steps: the same code path")
    ap.add_argument("--data", help="mirror-layout data folder (default: $HIGHWAY_DATA_MIRROR, else data/gpu_mirror)")
    ap.add_argument("--out", help="report path without suffix (default results/gpu_check; dry run: "
                                  "runs/gpu_check_dry/gpu_check)")
    ap.add_argument("--runs", default=None, help="run folders (default runs/gpu_check[_dry])")
    ap.add_argument("--budget-s", type=float, default=None, help="stop starting phases after this many seconds from "
                    "the start (default 420; the time guard exits at budget + 30 s)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps per speed run (default 10; dry 1)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per speed run (default 30; dry 2)")
    ap.add_argument("--curve-steps", type=int, default=None, help="learning-curve steps (default 400; dry 4)")
    ap.add_argument("--cases", default="", help="only these speed cases, comma-separated: "
                    + ",".join(c.key for c in CASES))
    ap.add_argument("--skip", default="", help="phases to skip, comma-separated: peak,nan,throughput,curve,ddp,tests,"
                                                "tables")
    ap.add_argument("--prepare", action="store_true", help="write data/gpu_mirror and .gpu_deps here (CPU), then exit")
    ap.add_argument("--from", dest="prepare_from", help="--prepare: the full offline mirror (default "
                                                        "$HIGHWAY_DATA_MIRROR, else /work/shared/data)")
    ap.add_argument("--test-deps", action="store_true", help="--prepare: carry yaml, pytest and their helpers too "
                                                               "(for a Python that lacks them)")
    ap.add_argument("--cifar-train", type=int, default=3000)
    ap.add_argument("--cifar-test", type=int, default=1000)
    ap.add_argument("--plot", metavar="CURVES_CSV", help="draw <name>.png from a curves CSV, then exit")
    ap.add_argument("--ddp-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    dry = args.dry_run
    args.budget_s = args.budget_s if args.budget_s is not None else (900.0 if dry else 420.0)
    args.warmup = args.warmup if args.warmup is not None else (1 if dry else 10)
    args.steps = args.steps if args.steps is not None else (2 if dry else 30)
    args.curve_steps = args.curve_steps if args.curve_steps is not None else (4 if dry else 400)
    args.out = args.out or str(REPO / ("runs/gpu_check_dry/gpu_check" if dry else "results/gpu_check"))
    args.runs = args.runs or str(REPO / ("runs/gpu_check_dry" if dry else "runs/gpu_check"))
    args.cases = [c for c in args.cases.split(",") if c]
    args.skip = {s for s in args.skip.split(",") if s}
    unknown = [c for c in args.cases if c not in CASE_BY_KEY]
    if unknown:
        ap.error(f"--cases {','.join(unknown)}: not known (valid: {', '.join(CASE_BY_KEY)})")
    if args.warmup < 1 or args.steps < 1 or args.curve_steps < 1:
        ap.error("--warmup, --steps and --curve-steps must be >= 1")
    return args


def main(argv=None) -> int:
    global T0
    T0 = time.monotonic()  # the budget counts from here (also when a test calls main in-process)
    args = parse(argv)
    found = setup_paths()
    if args.prepare:  # before the default below points HIGHWAY_DATA_MIRROR at the folder --prepare rewrites
        return prepare(args)
    if args.data:
        os.environ["HIGHWAY_DATA_MIRROR"] = str(Path(args.data).resolve())
    elif not os.environ.get("HIGHWAY_DATA_MIRROR") and GPU_MIRROR.is_dir():
        os.environ["HIGHWAY_DATA_MIRROR"] = str(GPU_MIRROR)
    os.environ.setdefault("HIGHWAY_DATA_OFFLINE", "1")  # no network on the GPU machine: never wait for a download
    if args.ddp_worker:
        return ddp_worker(args)
    if args.plot:
        csv_path = Path(args.plot)
        print(plot_curves(csv_path, csv_path.with_suffix(".png")))
        return 0

    missing, optional = preflight(found)
    command = "python scripts/gpu_check.py " + " ".join(argv if argv is not None else sys.argv[1:])
    rep = Report(Path(args.out), args.dry_run, command.strip())
    if missing:
        msg = (f"missing: {', '.join(missing)}. The check needs a Python with torch (a CUDA build) and numpy; "
               "hydra-core and omegaconf come from .gpu_deps (`python scripts/gpu_check.py --prepare` on a machine "
               "that has them, then carry .gpu_deps).")
        say(msg)
        rep.problem("preflight", msg)
        rep.finished = True
        rep.write()
        return 2
    ctx = Ctx(args, rep)
    ctx.configs_ok = all(found.get(m) for m in ("hydra", "omegaconf", "yaml", "antlr4"))
    if not ctx.configs_ok:
        rep.problem("preflight", "hydra-core / omegaconf / yaml / antlr4 missing: every phase that composes the "
                                 "project's configs is skipped; carry .gpu_deps (made by `--prepare`)")
    if optional:
        rep.row("machine", "", "", "", "missing_optional_modules", " ".join(optional))
    guard = start_guard(ctx, grace=30.0)
    say(f"{'DRY RUN on CPU' if ctx.dry else 'GPU check'}: budget {ctx.deadline:.0f} s; report {rep.out}.md; "
        f"mirror {os.environ.get('HIGHWAY_DATA_MIRROR', 'not set')}")
    try:
        import torch  # seconds: after the module check above
    except Exception as e:  # a torch that is there but does not load (a missing CUDA library, ...)
        rep.problem("preflight", f"import torch failed: {type(e).__name__}: {e}"[:600])
        say(f"import torch failed: {type(e).__name__}: {e}")
        guard.cancel()
        rep.finished = True
        rep.write()
        return 2
    threads = torch.get_num_threads()
    if ctx.dry:
        torch.set_num_threads(1)  # tiny models: one thread is fastest and leaves the other cores alone
    try:
        return check(ctx, args)
    finally:
        guard.cancel()
        torch.set_num_threads(threads)


def check(ctx: Ctx, args) -> int:
    import torch

    rep = ctx.rep
    say(f"torch {torch.__version__} imported; CUDA available: {torch.cuda.is_available()}")
    facts = phase(ctx, "machine", 0, machine)
    if facts is None and not ctx.dry:
        rep.finished = True
        rep.write()
        return 2
    on = lambda name: name not in args.skip  # noqa: E731
    if ctx.configs_ok:
        phase(ctx, "data", 0, data_check)
    if on("peak"):
        phase(ctx, "matmul peak", 5, matmul_peak)
    if ctx.configs_ok:
        if on("nan"):
            phase(ctx, "nan policy", 20, nan_check)
        if on("throughput"):
            run_throughput(ctx, "A")
        if on("curve"):
            for variant in ("baseline", "sdu_tanh"):
                phase(ctx, f"curve {variant}", curve_need(ctx, variant), curve_run, variant)
            if ctx.curves:
                phase(ctx, "curve png", 2, curves_png)
        if on("ddp"):
            phase(ctx, "torchrun nccl", 25 if ctx.dry else 45, ddp_check)
    if on("tests"):
        phase(ctx, "cuda tests", 15 if ctx.dry else 40, cuda_tests)
    if ctx.configs_ok:
        if on("throughput"):
            run_throughput(ctx, "BC", reserve=0 if ctx.dry else 8)  # the table times come after
        if on("tables"):
            phase(ctx, "table times", 3, tables_section)
    rep.finished = True
    rep.write()
    say(f"done in {elapsed():.0f} s: {rep.out.with_suffix('.md')}, {rep.out.with_suffix('.csv')}; "
        f"{len(rep.problems)} problem(s)")
    for p, m in rep.problems:
        say(f"  {p}: {m}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
