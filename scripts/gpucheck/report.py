"""The report: everything measured so far, rendered into <out>.md and <out>.csv, and the number formats."""

from __future__ import annotations

import csv
import datetime
import math
import os
import threading
from pathlib import Path

from .common import elapsed


class Report:
    """Everything measured so far; `write()` renders <out>.md and <out>.csv (after each phase, and by the time
    guard)."""

    ORDER = ["machine", "data", "peak", "nan", "throughput", "curve", "ddp", "tests", "grouped", "tables", "compiled",
             "peers"]

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
