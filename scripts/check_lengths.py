"""The length rules (`make lint`): each Python file of the package, the scripts and the benchmarks reads alone
(at most 500 lines), the Hydra app stays small (under 150), the design fits two screens (docs/DESIGN.md at most
120 lines), the README one read (at most 150), the manual a short one (docs/guide.md at most 300) and the failure
tables one page (docs/failures.md at most 80). Prints each file over its limit; exit 1 if any."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMITS = [("highway_repro/**/*.py", 500), ("scripts/**/*.py", 500), ("bench/**/*.py", 500),
          ("highway_repro/train/app.py", 149), ("docs/DESIGN.md", 120), ("README.md", 150), ("docs/guide.md", 300),
          ("docs/failures.md", 80)]


def over(root: Path = ROOT) -> list[str]:
    """'<path>: <n> lines (at most <limit>)' for each file over its limit."""
    out = []
    for pattern, limit in LIMITS:
        for path in sorted(root.glob(pattern)):
            n = len(path.read_text().splitlines())
            if n > limit:
                out.append(f"{path.relative_to(root)}: {n} lines (at most {limit})")
    return out


if __name__ == "__main__":
    problems = over()
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    raise SystemExit(1 if problems else 0)
