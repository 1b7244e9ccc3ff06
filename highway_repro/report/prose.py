"""The report's prose as Markdown templates (`prose.md`, one `== name ==` section each): `prose(name, **values)`."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from string import Template


@cache
def templates() -> dict[str, Template]:
    """Each section of prose.md: its lines joined by spaces, paragraphs (blank lines) by a blank line."""
    parts = re.split(r"^== (.+) ==\n", Path(__file__).with_name("prose.md").read_text(), flags=re.M)[1:]
    return {name: Template("\n\n".join(" ".join(p.split("\n")) for p in body.strip().split("\n\n")))
            for name, body in zip(parts[::2], parts[1::2])}


def prose(name: str, **values) -> str:
    return templates()[name].substitute(values)
