"""The benchmark report: its rows and sections, the wall-clock budget, number formats, the machine, and the writer of
OUT.md / OUT.csv (`python -m bench --out OUT`)."""

from __future__ import annotations

import csv
import os
import platform
import shlex
import time
from pathlib import Path

import torch

from bench import timing
from highway_repro.engine.loggers import cpu_model

REPO = Path(__file__).resolve().parents[1]
TARGETS = {
    "xt": 1.0, "xt_aim": 1.1, "gate_excess": 0.05, "mfu_tlm": 0.75, "mfu_txl": 0.65,
    "data_mb_s": 200.0, "startup_s": 2.0,
}


# ----------------------------------------------------------------------------- bookkeeping

class Report:
    def __init__(self):
        self.rows: list[dict] = []
        self.sections: list[tuple[str, list[str]]] = []
        self.targets: list[tuple[str, str, str, bool | None]] = []

    def row(self, section: str, case: str, metric: str, value, unit: str = "", note: str = "") -> None:
        self.rows.append({"section": section, "case": case, "metric": metric,
                          "value": value if isinstance(value, str) else f"{value:.6g}", "unit": unit, "note": note})

    def section(self, title: str, lines: list[str]) -> None:
        self.sections.append((title, lines))

    def target(self, what: str, measured: str, target: str, met: bool | None, resolved: bool = True) -> None:
        self.targets.append((what, measured, target, met, resolved))


class Budget:
    """Wall-clock budget of the whole run; sections ask for a share of what is left."""

    def __init__(self, total_s: float):
        self.t0, self.total = time.perf_counter(), total_s

    def left(self) -> float:
        return self.total - (time.perf_counter() - self.t0)

    def alloc(self, fraction: float) -> float:
        """Seconds for a section: `fraction` of the whole budget, at most what is left."""
        return max(0.0, min(self.left(), self.total * fraction))


def fmt(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def met(ok: bool | None, resolved: bool = True) -> str:
    """met / NOT met by the median; 'not resolved' when the 95% CI of the median reaches across the goal."""
    verdict = {True: "met", False: "**NOT met**", None: "n/a"}[ok]
    return verdict if resolved else verdict + " (not resolved: the CI spans the goal)"


def ci_text(ci, fmt) -> str:
    return "n/a (under 6 rounds)" if ci is None else f"{fmt(ci[0])} to {fmt(ci[1])}"


def spread_text(xs) -> str:
    lo, hi = timing.spread(xs)
    return f"{lo:.2f}-{hi:.2f}"


# ----------------------------------------------------------------------------- machine

def cpu_name() -> str:
    return cpu_model() or platform.processor() or "unknown CPU"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return " ".join(f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags)
    except OSError:
        pass
    return "?"


def _mem_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return int(line.split()[1]) / 2 ** 20
    except OSError:
        pass
    return float("nan")


def machine() -> dict:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    info = {
        "cpu": cpu_name(), "cpu_flags": _cpu_flags(), "cores_available": cores,
        "torch_threads": torch.get_num_threads(), "ram_gb": round(_mem_gb(), 1),
        "python": platform.python_version(), "torch": torch.__version__,
        "mkldnn": torch.backends.mkldnn.is_available(), "mkl": torch.backends.mkl.is_available(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "load_avg_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    try:
        from importlib.metadata import version

        info["x_transformers"] = version("x-transformers")
    except Exception:
        info["x_transformers"] = None
    return info


# ----------------------------------------------------------------------------- output

def write(rep: Report, info: dict, out: Path, args, wall_s: float) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = "python -m bench " + shlex.join(args.argv)
    only_compile = args.compile and not [x for x in args.sections.split(",") if x.strip()]
    target = ("bench-compile" if only_compile else
              {"xt_cpu": "bench-cpu-scale", "precision": "bench-precision"}.get(args.sections, "bench"))
    md = ["# Benchmarks" + (": eager vs torch.compile" if only_compile else ""), "",
          f"Written by `{cmd.strip()}` (`make {target}`) in "
          f"{wall_s / 60:.1f} min on "
          f"{time.strftime('%Y-%m-%d %H:%M %Z')}. Every figure is a median over rounds after warm-up; every "
          "comparison is a ratio of contenders measured side by side in one process, interleaved round by round "
          "(the order alternates). The machine is shared with other jobs: the load average below says how busy "
          "it was; absolute numbers move with it, ratios much less.", "",
          "## Machine", "",
          f"- CPU: {info['cpu']} ({info['cpu_flags']}), {info['cores_available']} cores available, "
          f"torch threads {info['torch_threads']}, RAM {info['ram_gb']} GB",
          f"- torch {info['torch']} (MKL {info['mkl']}, oneDNN {info['mkldnn']}), Python {info['python']}, "
          f"x-transformers {info.get('x_transformers')}, GPU: {info['cuda'] or 'none'}",
          f"- load average (1, 5, 15 min) at start {tuple(round(x, 2) for x in info['load_avg_start'] or ())}, "
          f"at end {tuple(round(x, 2) for x in os.getloadavg())}",
          f"- timing: {info['timing']}"]
    if rep.targets:
        md += ["", "## Targets", "", "| target | measured | goal | |", "|---|---:|---|---|"]
    for what, measured, goal, ok, resolved in rep.targets:
        md.append(f"| {what} | {measured} | {goal} | {met(ok, resolved)} |")
    for title, lines in rep.sections:
        md += ["", f"## {title}", ""] + lines
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["section", "case", "metric", "value", "unit", "note"])
        w.writeheader()
        w.writerows(rep.rows)
