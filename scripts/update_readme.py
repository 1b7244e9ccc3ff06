"""Copy every results/**/*.md table into README.md between the results markers (make readme)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["demo", "highway_networks", "highway_transformer"]


def main() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    parts = []
    files = sorted((ROOT / "results").rglob("*.md"),
                   key=lambda p: (ORDER.index(p.parent.name) if p.parent.name in ORDER else 99, p.name))
    for md in files:
        rel = md.parent.relative_to(ROOT).as_posix()
        body = md.read_text().strip()
        body = re.sub(r"^# ", "### ", body, count=1, flags=re.M)
        body = re.sub(r"!\[([^\]]*)\]\(([^)/]+)\)", lambda m: f"![{m.group(1)}]({rel}/{m.group(2)})", body)
        parts.append(f"{body}\n\n(source: `{md.relative_to(ROOT).as_posix()}`)\n")
    begin, end = "<!-- results:begin -->", "<!-- results:end -->"
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    readme.write_text(head + begin + "\n\n" + "\n".join(parts) + "\n" + end + tail)
    print(f"README.md: {len(parts)} result tables")


if __name__ == "__main__":
    main()
