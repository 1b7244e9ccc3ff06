"""``HIGHWAY_DATA_MIRROR=<offline mirror> python -m highway_repro.data``: write ``PREPARED_SHA256SUMS`` beside this
module, the sha256s of the prepared folders (:mod:`highway_repro.data.prepared`) that the mirror's files give, one
line ``<sha256>  <folder>/<file>`` per file, from a fresh build of each of :data:`ANCHORED` in a temp cache."""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path
from unittest import mock

from . import build, prepared, sources
from .sources import DataError

# (data set, options that change its prepared arrays): those the configs and the mirror tests use
ANCHORED = (("mnist", {}), ("cifar10", {"allow_partial": True}), ("ptb_word", {}), ("ptb_char", {}),
            ("ptb_char_raw", {}), ("enwik8_prefix", {"newlines": "drop"}), ("enwik8_prefix", {"newlines": "keep"}))


def prepared_sums(cache: str | os.PathLike) -> str:
    """The text of ``PREPARED_SHA256SUMS``: each of :data:`ANCHORED` built from the mirror alone (no download, no
    committed sums) into the empty cache dir ``cache``, then every file of each prepared folder but its manifest."""
    if sources.mirror_dir() is None:
        raise DataError("HIGHWAY_DATA_MIRROR is unset; set it to the offline data mirror (e.g. ../shared/data)")
    with mock.patch.dict(os.environ, HIGHWAY_DATA_OFFLINE="1"), mock.patch.object(prepared, "COMMITTED", {}):
        for name, options in ANCHORED:
            build(name, cache_dir=cache, **options)
    files = sorted(p for p in (Path(cache) / "prepared").glob("*/*") if p.name != "manifest.json")
    return "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.parent.name}/{p.name}\n" for p in files)


def main() -> None:
    try:
        with tempfile.TemporaryDirectory() as cache:
            prepared.SUMS_FILE.write_text(prepared_sums(cache))
    except DataError as e:
        sys.exit(f"error: {e}")
    print(f"wrote {prepared.SUMS_FILE}", file=sys.stderr)


if __name__ == "__main__":
    main()
