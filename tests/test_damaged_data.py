"""Data faults not covered by tests/test_data.py: truncated or undecodable files, empty splits, corrupt,
interrupted and killed caches, each named in one line."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, write_sums
from highway_repro import data
from highway_repro.data import sources, vision


@pytest.fixture
def offline_mirror(tmp_mirror, monkeypatch):
    """An empty mirror and cache, no network."""
    def refuse(url, dest, timeout=None):
        raise OSError("network disabled in tests")

    monkeypatch.setattr(sources, "download", refuse)
    return tmp_mirror


def _idx(shape, dtype_code=0x08) -> bytes:
    head = bytes([0, 0, dtype_code, len(shape)]) + b"".join(int(n).to_bytes(4, "big") for n in shape)
    return head + np.random.default_rng(0).integers(0, 10, int(np.prod(shape)), dtype=np.uint8).tobytes()


def _mnist(mirror: Path, n_train=50, n_test=20) -> None:
    (mirror / "mnist").mkdir()
    for name, shape in (("train-images-idx3-ubyte", (n_train, 28, 28)), ("train-labels-idx1-ubyte", (n_train,)),
                        ("t10k-images-idx3-ubyte", (n_test, 28, 28)), ("t10k-labels-idx1-ubyte", (n_test,))):
        (mirror / "mnist" / f"{name}.gz").write_bytes(gzip.compress(_idx(shape)))
    write_sums(mirror)


def _one_line_naming(e, name: str) -> None:
    msg = str(e.value)
    assert name in msg and "\n" not in msg, msg


def test_truncated_gzip_idx_file_is_named(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte.gz"
    blob = gzip.compress(_idx((50, 28, 28)))
    path.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(data.DataError) as e:
        vision.read_idx(path)
    _one_line_naming(e, str(path))


def test_truncated_or_empty_mnist_in_a_mirror_is_named(offline_mirror):
    mirror, cache = offline_mirror
    _mnist(mirror)
    assert data.build("mnist", cache_dir=cache, batch_size=10).num_examples("train") == 50
    f = mirror / "mnist" / "train-images-idx3-ubyte.gz"
    f.write_bytes(f.read_bytes()[:-100])  # truncated after its checksum was recorded
    with pytest.raises(data.ChecksumError) as e:
        data.build("mnist", cache_dir=cache / "2", batch_size=10)
    _one_line_naming(e, "mnist/train-images-idx3-ubyte.gz")
    f.write_bytes(gzip.compress(_idx((0, 28, 28))))  # an empty split, with a matching checksum
    write_sums(mirror)
    with pytest.raises(data.DataError) as e:
        data.build("mnist", cache_dir=cache / "3", batch_size=10)
    _one_line_naming(e, "train-images-idx3-ubyte.gz: holds no items")


def _ptb(mirror: Path, valid_text: str | None = None) -> None:
    (mirror / "ptb").mkdir()
    rng = np.random.default_rng(1)
    words = [f"w{i}" for i in range(30)]
    for f, n in (("train", 200), ("valid", 30), ("test", 30)):
        text = "".join(" " + " ".join(rng.choice(words, 8)) + " \n" for _ in range(n))
        (mirror / "ptb" / f"ptb.{f}.txt").write_text(valid_text if f == "valid" and valid_text is not None else text)
    write_sums(mirror)


def test_empty_text_split_is_named(offline_mirror):
    mirror, cache = offline_mirror
    _ptb(mirror, valid_text="\n")
    with pytest.raises(ValueError) as e:
        data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8)
    _one_line_naming(e, "ptb_word: the val split")
    assert "ptb.valid.txt) is empty" in str(e.value)


def test_a_text_file_that_is_not_utf8_is_named(offline_mirror):
    """A text file whose checksum matches but that is not UTF-8: one line naming it and the first bad byte."""
    mirror, cache = offline_mirror
    _ptb(mirror)
    bad = mirror / "ptb" / "ptb.valid.txt"
    bad.write_bytes(b" w1 w2 \n w3 \xff\xfe w4 \n")  # Latin-1 bytes, recorded in SHA256SUMS
    write_sums(mirror)
    with pytest.raises(data.DataError) as e:
        data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8)
    _one_line_naming(e, f"{bad} is not UTF-8 text (byte b'\\xff' at offset 12: invalid start byte)")


KILLED_CACHE_WRITER = """
import dataclasses, json, os, signal, sys
import numpy as np
from highway_repro import data
from highway_repro.data import sources

# the test's files are the committed version, as write_sums commits them in the test's process
sources.FILES.update({rel: dataclasses.replace(sources.FILES[rel], check=None, sha256=sha)
                      for rel, sha in json.loads(sys.argv[2]).items()})

real_save = np.save
def dying_save(f, arr, allow_pickle=False):
    if dying_save.calls == 1:  # the second array: half written, then the process is killed
        f.write(b"\\x93NUMPY partial")
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    dying_save.calls += 1
    real_save(f, arr, allow_pickle=allow_pickle)
dying_save.calls = 0
np.save = dying_save
data.build("ptb_word", cache_dir=sys.argv[1], batch_size=2, seq_len=8)
"""


def test_a_killed_cache_writer_leaves_no_temp_file_after_the_next_build(offline_mirror):
    """A cache writer killed (SIGKILL) inside an array's write leaves its temp file; the next build removes it (its
    writer is dead) and writes the cache: no temp file left, the arrays those of an uninterrupted build."""
    mirror, cache = offline_mirror
    _ptb(mirror)
    committed = json.dumps({rel: src.sha256 for rel, src in sources.FILES.items() if (mirror / rel).is_file()})
    r = subprocess.run([sys.executable, "-c", KILLED_CACHE_WRITER, str(cache), committed], cwd=REPO,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HIGHWAY_DATA_MIRROR": str(mirror)})
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    (folder,) = list((cache / "prepared").glob("ptb_word-*"))
    assert [p.name for p in folder.glob("*.tmp")], "the killed writer left no temp file"
    d = data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8)
    assert sorted(p.name for p in folder.iterdir()) == ["info.json", "manifest.json", "test.npy", "train.npy",
                                                        "val.npy"]
    assert d.num_tokens("val") == 30 * 9


def test_a_cache_build_removes_only_its_own_hosts_dead_temp_files(tmp_path):
    """A cache folder on a file system shared by several nodes: a build removes the temp file of a dead writer of its
    own host, and leaves a live writer's and every file of another host (whose processes it cannot see) alone."""
    from highway_repro.data.prepared import _sweep_temp_files, _writer

    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    host = _writer().split("-")[0]
    names = {"mine_dead": f"train.npy.{host}-{dead.pid}.abc.tmp", "mine_live": f"val.npy.{host}-{os.getppid()}.d.tmp",
             "other_dead": f"train.npy.othernode-{dead.pid}.abc.tmp", "other_live": "val.npy.othernode-1.x.tmp"}
    for n in names.values():
        (tmp_path / n).write_bytes(b"half")
    _sweep_temp_files(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(v for k, v in names.items() if k != "mine_dead")


def test_a_corrupt_data_cache_is_refused_in_one_line_until_its_folder_is_deleted(offline_mirror):
    """A prepared folder changed after it was written is refused in one line naming the file and the folder to
    delete, never rebuilt in its place; once the folder is deleted, the next build writes it again from the source."""
    mirror, cache = offline_mirror
    _ptb(mirror)
    good = data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8)
    (folder,) = list((cache / "prepared").glob("ptb_word-*"))
    breakages = [("train.npy", lambda p: p.write_bytes(p.read_bytes()[:50])),      # truncated array
                 ("manifest.json", lambda p: p.write_text("{not json")),          # garbage manifest
                 ("val.npy", lambda p: np.save(p, np.zeros(3, np.int64)))]         # wrong shape and dtype
    for name, damage in breakages:
        damage(folder / name)
        with pytest.raises(data.ChecksumError) as e:
            data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8)
        _one_line_naming(e, f"{folder / name}")
        assert str(e.value).endswith(f"delete the folder {folder} to rebuild it from the raw files"), name
        shutil.rmtree(folder)
        again = data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8)
        for s in ("train", "val", "test"):
            assert np.array_equal(again.streams[s], good.streams[s]), (name, s)


def test_interrupted_cache_write_leaves_no_partial_file(offline_mirror, monkeypatch):
    """A crash while a cache array is written (disk full, kill) leaves no file under a final name, no temp
    file, and no manifest; the next build rebuilds the cache."""
    mirror, cache = offline_mirror
    _ptb(mirror)
    real_save = np.save
    calls = []

    def dying_save(f, arr, allow_pickle=False):
        calls.append(1)
        if len(calls) == 2:  # the second array: half written, then the process "dies"
            f.write(b"\x93NUMPY partial")
            raise OSError("No space left on device")
        real_save(f, arr, allow_pickle=allow_pickle)

    monkeypatch.setattr(np, "save", dying_save)
    from highway_repro.errors import StorageError

    with pytest.raises(StorageError, match="No space left"):  # an errno-less short write: the full-disk line
        data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8)
    monkeypatch.setattr(np, "save", real_save)
    (folder,) = list((cache / "prepared").glob("ptb_word-*"))
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["train.npy"], names  # the one complete array; no partial val.npy, no temp file, no manifest
    d = data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8)
    assert sorted(p.name for p in folder.iterdir()) == ["info.json", "manifest.json", "test.npy", "train.npy",
                                                        "val.npy"]
    assert d.num_tokens("val") == 30 * 9
