#!/usr/bin/env python3
"""The device effect, paired by seed: every kept run made on a GPU at the cpu scale (`<table>-cpu-gpu/<job>`) against
its CPU twin (`<table>-cpu/<job>`, the same job: config, seed and data order), on the table's test metric; and the
CPU model's, every twin in `results/<paper>/cpu_twins/<table>-<scale>/<job>` (a kept CPU run's job trained again
on another CPU model) against its kept run.

    python scripts/device_effect.py            # a Markdown table per table with twins, and the mean GPU - CPU

The interval is the paired t interval of the GPU - CPU differences (95 %); docs/gpu.md quotes its output.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from highway_repro.report import stats  # noqa: E402

METRICS = ("test/bpc", "test/ppl", "test/acc", "val/bpc")  # the first one a run has


def metric(run: Path) -> tuple[str, float] | None:
    final = json.loads((run / "metrics.json").read_text())
    return next(((k, float(final[k])) for k in METRICS if isinstance(final.get(k), (int, float))), None)


def cpu(run: Path) -> str:
    """The CPU model a run was made on (its run_info.json)."""
    return str(json.loads((run / "run_info.json").read_text()).get("cpu_model"))


def report(title: str, pairs: list[tuple[str, str, float, float]], a: str, b: str) -> None:
    """A Markdown table of the pairs (name, metric, a's value, b's value) and the mean a - b with its 95 % interval."""
    print(f"{title}: {len(pairs)} pairs\n")
    print(f"| run | metric | {a} | {b} | {a} - {b} |\n|---|---|---:|---:|---:|")
    for name, key, x, y in pairs:
        print(f"| `{name}` | {key} | {x:.4f} | {y:.4f} | {x - y:+.4f} |")
    diffs = [x - y for *_, x, y in pairs]
    ci = stats.mean_interval(diffs)
    print(f"\nmean {a} - {b} {statistics.fmean(diffs):+.4f}" + (f", 95 % interval [{ci[0]:+.4f}, {ci[1]:+.4f}]"
                                                               if ci else "") + f" over {len(diffs)} pairs\n")


def twins(folder: Path, kept: Path) -> list[tuple[str, str, float, float, Path]]:
    """(name, metric, the twin's value, the kept run's value, the kept run) of each run of `folder` whose twin (the
    same job folder name) `kept` holds."""
    out = []
    for run in sorted(p.parent for p in folder.glob("*/metrics.json")):
        twin = kept / run.name
        if (twin / "metrics.json").exists() and metric(run) and metric(twin):
            (key, x), (_, y) = metric(run), metric(twin)
            out.append((run.name, key, x, y, twin))
    return out


def main() -> int:
    for apart in sorted((ROOT / "results").glob("*/runs/*-cpu-gpu")):
        pairs = twins(apart, apart.with_name(apart.name.removesuffix("-gpu")))
        if not pairs:
            print(f"{apart.name}: {len(list(apart.glob('*/metrics.json')))} GPU runs, no CPU twin yet\n")
            continue
        report(f"{apart.name}: GPU runs with a CPU twin", [p[:4] for p in pairs], "GPU", "CPU")
    # twins across CPU models: results/<paper>/cpu_twins/<table>-<scale>/<job>, the job of a kept CPU run made on
    # another CPU model, trained again on this one (the same recipe, seed and data order, 1 thread)
    for folder in sorted((ROOT / "results").glob("*/cpu_twins/*")):
        pairs = twins(folder, folder.parent.parent / "runs" / folder.name)
        for model in sorted({cpu(p[4]) for p in pairs}):
            mine = [p for p in pairs if cpu(p[4]) == model]
            here = sorted({cpu(folder / p[0]) for p in mine})
            report(f"{folder.name}: twins made on {', '.join(here)} of runs kept from {model}", [p[:4] for p in mine],
                   "twin", "kept")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
