"""docs/cluster.md's cost table: each paper table's runs at the paper scale on GPUs, priced by the runner's one cost
rule (`runner.estimate.per_run_s`: a cell's kept GPU runs, else the scale file's `est_step_s` x steps) and laid out
on N GPUs as the queue lays them (`runner.estimate.wall_s`: each run on the first GPU free).

    python scripts/cluster_costs.py          # rewrite the table between the markers of docs/cluster.md
"""

from __future__ import annotations

import sys
from pathlib import Path

from highway_repro.report.header import duration
from highway_repro.runner.estimate import MARGIN, per_run_s, wall_s
from highway_repro.runner.plan import job_names, plan_grids
from highway_repro.targets import PAPER_TABLES, TARGETS, make_target, runs_folder

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "cluster.md"
BEGIN, END = "<!-- costs:begin -->", "<!-- costs:end -->"
GPUS = (1, 8, 32)


def table() -> str:
    """The markdown table: table, runs, one run, GPU-hours, wall time on each of GPUS."""
    lines = [f"| table | runs | a run | GPU-hours | {' | '.join(f'{n} GPU' + 's' * (n > 1) for n in GPUS)} |",
             "|---|---:|---:|---:|" + "---:|" * len(GPUS)]
    for name in PAPER_TABLES:
        cfg, fgs = plan_grids(name, "paper", ["trainer.device=cuda"])
        names = job_names(cfg, [g for _, g in fgs], TARGETS[name].sweep)
        kept = [p.parent for p in (ROOT / "results" / runs_folder(name, "paper")).glob("*/metrics.json")]
        secs, _ = per_run_s(names, kept, cfg)
        if None in secs:
            lines.append(f"| `make {make_target(name)}` | {len(names)} | no estimate | | " + "| " * len(GPUS))
            continue
        walls = " | ".join(duration(wall_s(secs, n)) for n in GPUS)
        lines.append(f"| `make {make_target(name)}` | {len(names):,} | {duration(sum(secs) / len(secs))} | "
                     f"{sum(secs) / 3600:,.1f} | {walls} |")
    return "\n".join(lines) + f"\n\n± {MARGIN * 100:.0f} % across machines (`runner/estimate.py`)."


def main() -> int:
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        print(f"{DOC} has no {BEGIN} ... {END} markers", file=sys.stderr)
        return 1
    head, _, rest = text.partition(BEGIN)
    DOC.write_text(head + BEGIN + "\n" + table() + "\n" + END + rest.partition(END)[2])
    print(f"wrote {DOC}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
