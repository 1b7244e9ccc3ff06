#!/usr/bin/env python3
"""The device effect, paired by seed: every kept run made on a GPU at the cpu scale (`<table>-cpu-gpu/<job>`) against
its CPU twin (`<table>-cpu/<job>`, the same job: config, seed and data order), on the table's test metric.

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


def main() -> int:
    for apart in sorted((ROOT / "results").glob("*/runs/*-cpu-gpu")):
        cpu = apart.with_name(apart.name.removesuffix("-gpu"))
        pairs = []
        for gpu_run in sorted(p.parent for p in apart.glob("*/metrics.json")):
            twin = cpu / gpu_run.name
            if (twin / "metrics.json").exists() and metric(gpu_run) and metric(twin):
                (key, g), (_, c) = metric(gpu_run), metric(twin)
                pairs.append((gpu_run.name, key, g, c))
        if not pairs:
            print(f"{apart.name}: {len(list(apart.glob('*/metrics.json')))} GPU runs, no CPU twin yet\n")
            continue
        print(f"{apart.name}: {len(pairs)} GPU runs with a CPU twin\n")
        print("| run | metric | GPU | CPU | GPU - CPU |\n|---|---|---:|---:|---:|")
        for name, key, g, c in pairs:
            print(f"| `{name}` | {key} | {g:.4f} | {c:.4f} | {g - c:+.4f} |")
        diffs = [g - c for *_, g, c in pairs]
        ci = stats.mean_interval(diffs)
        mean = statistics.fmean(diffs)
        print(f"\nmean GPU - CPU {mean:+.4f}" + (f", 95 % interval [{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else "")
              + f" over {len(diffs)} pairs\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
