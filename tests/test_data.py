"""Tests of the data layer (highway_repro.data).

Tests decorated with ``needs_mirror`` (conftest) read the offline data mirror named by
``$HIGHWAY_DATA_MIRROR`` (CI: ../shared/data relative to the repo) and are
skipped without it; they use the normal cache dir, so later runs are fast.
All other tests build small files in the canonical formats in tmp folders;
``write_sums`` (conftest) commits their sha256s for the test (in the copy of
``sources.FILES`` that ``tmp_mirror`` gives it).
No test touches the network: ``sources.download`` is replaced by a function
that raises.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import pickle
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from highway_repro import data
from highway_repro.data import sources, text, vision
from highway_repro.data.tokenizers import EOS, ByteTokenizer, CharTokenizer, SentencePieceTokenizer, WordTokenizer
from highway_repro.errors import ConfigError, HighwayError
from conftest import mirror, needs_mirror, write_mirror_sums, write_sums

MIRROR = mirror()


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    def refuse(url, dest, timeout=None):
        raise OSError("network disabled in tests")

    monkeypatch.setattr(sources, "download", refuse)
    monkeypatch.delenv("HIGHWAY_DATA_OFFLINE", raising=False)


def flip_a_byte(path: Path, offset: int = 10) -> None:
    """Change one byte and restore the size and times (as `touch -r` does): only a checksum can tell."""
    st = path.stat()
    blob = bytearray(path.read_bytes())
    blob[offset] ^= 0x01
    path.write_bytes(bytes(blob))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


class FakeTok:
    kind = "fake"

    def __init__(self, vocab_size):
        self.vocab_size = vocab_size


# ----------------------------------------------------------------------------- registry and options

def test_unknown_name_and_options():
    with pytest.raises(ValueError, match=r"'nope'.*valid names: mnist, cifar10"):
        data.build("nope")
    with pytest.raises(ConfigError,
                       match=r"^data.colour=1: not an option of data set 'ptb_word' \(valid: .*vocab_size"):
        data.build("ptb_word", colour=1)
    with pytest.raises(ConfigError, match="data.newlines='drop'"):
        data.build("ptb_char", newlines="drop")
    assert set(data.names()) == {"mnist", "cifar10", "cifar100", "ptb_word", "ptb_char", "ptb_char_raw",
                                 "enwik8", "enwik8_prefix"}


# ----------------------------------------------------------------------------- against the mirror

@needs_mirror
def test_mnist_mirror():
    d = data.build("mnist", batch_size=100, seed=3)
    assert d.kind == "classification" and d.meta == {"num_classes": 10, "input_shape": (1, 28, 28)}
    assert d.num_examples("train") == 60000 and d.num_examples("test") == 10000
    assert d.splits == ("test",) and d.steps_per_epoch == 600
    x, y = d.train_batch(7)
    assert x.shape == (100, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert 0 <= x.min() and x.max() <= 1 and x.max() > 0.99
    x2, y2 = data.build("mnist", batch_size=100, seed=3).train_batch(7)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert sum(len(yb) for _, yb in d.eval_batches("test")) == 10000
    assert d.data["train"][0].dtype == torch.uint8
    xc, _ = data.build("mnist", normalize="caffe", batch_size=100, seed=3).train_batch(7)
    assert torch.allclose(xc * 256, x * 255)
    d = data.build("mnist", val_size=5000, train_limit=1000)
    assert d.splits == ("val", "test") and d.num_examples("val") == 5000 and d.num_examples("train") == 1000
    with pytest.raises(ValueError, match="normalize='gcn'.*scale, caffe"):
        data.build("mnist", normalize="gcn")
    assert "mnist" in d.describe() and "60,000" not in d.describe()


@needs_mirror
def test_cifar10_partial_mirror(caplog):
    with pytest.raises(data.DataNotFoundError) as e:
        data.build("cifar10")
    msg = str(e.value)
    assert "data_batch_2" in msg and "HIGHWAY_DATA_MIRROR" in msg and "cifar-10-python.tar.gz" in msg
    assert "allow_partial" in msg and "\n" not in msg
    with caplog.at_level(logging.WARNING):
        d = data.build("cifar10", allow_partial=True, augment=True)
    assert "10000 training images" in caplog.text
    assert d.num_examples("train") == 10000 and d.num_examples("test") == 10000
    assert d.meta == {"num_classes": 10, "input_shape": (3, 32, 32)}
    x, y = d.train_batch(0)
    assert x.shape == (100, 3, 32, 32) and y.max() < 10
    xt, _ = next(d.eval_batches("test"))
    assert abs(xt.mean().item()) < 0.05  # gcn + training pixel mean subtracted
    with pytest.raises(ValueError, match="unknown split 'val'.*val_size"):
        next(d.eval_batches("val"))


@needs_mirror
def test_ptb_word_mirror():
    d = data.build("ptb_word", batch_size=20, seq_len=35)
    assert d.kind == "lm" and d.meta == {"vocab_size": 10000}
    assert [d.num_tokens(s) for s in ("train", "val", "test")] == [929589, 73760, 82430]
    assert d.streams["train"].dtype == np.uint16
    x, y = d.train_batch(0)
    assert x.shape == y.shape == (20, 35) and x.dtype == y.dtype == torch.int64
    assert d.tokenizer.decode(d.streams["test"][:30]).startswith("no it was n't black monday")


@needs_mirror
def test_ptb_char_mirror():
    d = data.build("ptb_char", batch_size=8, seq_len=100)
    assert [d.num_tokens(s) for s in ("train", "val", "test")] == [5017482, 393042, 442423]
    eos = d.tokenizer.symbols.index(EOS)
    distinct = [len(set(np.unique(d.streams[s]).tolist()) - {eos}) for s in ("train", "val", "test")]
    assert distinct == [49, 49, 47] and d.meta["vocab_size"] == 50
    assert d.streams["train"].dtype == np.uint8
    assert d.tokenizer.decode(d.streams["train"][:9]) == "aer_bankn"


@needs_mirror
def test_ptb_char_raw_mirror():
    d = data.build("ptb_char_raw", batch_size=8, seq_len=100)
    for split, f in (("train", "train"), ("val", "valid"), ("test", "test")):
        raw = (MIRROR / "ptb" / f"ptb.{f}.txt").read_text()
        assert d.num_tokens(split) == len(raw)  # every character one token, each line end one <eos>
        assert (d.streams[split] == d.tokenizer.symbols.index(EOS)).sum() == raw.count("\n")
    assert d.meta["vocab_size"] == 50
    assert d.tokenizer.decode(d.streams["val"][:12]) == " consumers m"


@needs_mirror
def test_enwik8_prefix_mirror():
    raw = (MIRROR / "enwik8" / "enwik8.prefix").read_bytes()
    keep = data.build("enwik8_prefix", newlines="keep", batch_size=4, seq_len=64)
    sizes = [keep.num_tokens(s) for s in ("train", "val", "test")]
    assert sum(sizes) == 4154399 == len(raw) and sizes[1] == sizes[2] == round(0.05 * len(raw))
    assert keep.meta["vocab_size"] == 256 and bytes(keep.streams["test"][-20:]) == raw[-20:]
    drop = data.build("enwik8_prefix", batch_size=4, seq_len=64)  # default: drop
    assert drop.tokenizer.newlines == "drop" and 10 not in drop.tokenizer.codes
    assert sum(drop.num_tokens(s) for s in ("train", "val", "test")) == len(raw) - raw.count(b"\n")
    assert drop.meta["vocab_size"] == len(set(raw) - {10})
    assert bytes(np.asarray(drop.tokenizer.codes, np.uint8)[drop.streams["val"]]) == \
        raw[sizes[0]: sizes[0] + sizes[1]].replace(b"\n", b"")


@needs_mirror
def test_second_build_reads_the_prepared_cache(monkeypatch):
    """A second build verifies the raw files and loads the prepared arrays: no raw file is read or tokenised again."""
    def refuse(*args, **kwargs):
        raise AssertionError("a raw file was read again: the prepared cache was not used")

    for name in ("mnist", "ptb_word", "ptb_char"):
        first = data.build(name)
        with monkeypatch.context() as m:
            for module, fn in ((vision, "read_idx"), (text, "_read_utf8"), (CharTokenizer, "fit"),
                               (WordTokenizer, "fit")):
                m.setattr(module, fn, refuse)
            again = data.build(name)
        assert again.meta == first.meta and again.steps_per_epoch == first.steps_per_epoch, name
        assert all(torch.equal(a, b) for a, b in zip(again.train_batch(3), first.train_batch(3))), name


@needs_mirror
def test_lm_eval_scores_every_token_once_mirror():
    d = data.build("ptb_char", batch_size=16, seq_len=400, score_len=320, eval_batch_size=10)
    assert d.score_len == 320 and d.eval_score_len == 320
    scored = sum(min(d.eval_score_len, x.shape[1]) * x.shape[0] for x, _ in d.eval_batches("val"))
    assert scored == d.num_targets("val") == 10 * ((393042 - 1) // 10)


@needs_mirror
def test_committed_sums_are_those_of_the_mirror():
    """The committed sha256s are the real mirror's files, the mirror lists the same, and its copies pass every check
    that applies to them (PTB's md5s, MNIST's md5s of the decompressed idx files) through fetch."""
    committed = sources._read_sums(sources.SUMS_FILE.read_text())
    assert committed == sources._read_sums((MIRROR / "SHA256SUMS").read_text())
    for rel, sha in committed.items():
        assert hashlib.sha256((MIRROR / rel).read_bytes()).hexdigest() == sha, rel
        assert sources.FILES[rel].sha256 == sha and sources.fetch(rel) == MIRROR / rel
        sources.verify(MIRROR / rel, rel, sources.FILES[rel].check, "the committed sum is wrong")  # published too
    assert sum(f.check is not None for f in map(sources.FILES.get, committed)) == 7  # 3 PTB + 4 MNIST md5s


@needs_mirror
def test_changed_prepared_array_of_the_mirror_data_is_refused(tmp_path):
    d = data.build("ptb_word", cache_dir=tmp_path)
    (npy,) = list(tmp_path.glob("prepared/ptb_word-*/train.npy"))
    np.save(npy, d.streams["train"][::-1].copy())  # same shape and dtype, other tokens
    with pytest.raises(sources.ChecksumError) as e:
        data.build("ptb_word", cache_dir=tmp_path)
    assert f"checksum mismatch for prepared train.npy at {npy}" in str(e.value) and "\n" not in str(e.value)


# ----------------------------------------------------------------------------- checksums and missing files

def test_wrong_checksum_message(tmp_path, monkeypatch):
    monkeypatch.delenv("HIGHWAY_DATA_MIRROR", raising=False)
    (tmp_path / "ptb").mkdir()
    (tmp_path / "ptb" / "ptb.train.txt").write_text("not the treebank\n")
    with pytest.raises(sources.ChecksumError) as e:
        sources.fetch("ptb/ptb.train.txt", tmp_path)
    msg = str(e.value)  # the committed sha256 decides: its bytes are the ones the published md5 f26c4b92... names
    assert "ptb/ptb.train.txt" in msg and sources.FILES["ptb/ptb.train.txt"].sha256 in msg
    assert hashlib.sha256(b"not the treebank\n").hexdigest() in msg and "delete" in msg and "\n" not in msg


def test_a_mirror_with_regenerated_sums_does_not_replace_the_committed_ones(tmp_mirror):
    """A changed mirror file whose SHA256SUMS entry was regenerated to match: the committed sha256 decides."""
    mirror, cache = tmp_mirror
    prefix = mirror / "enwik8" / "enwik8.prefix"
    prefix.parent.mkdir()
    prefix.write_bytes(b"abc\n" * 100)
    write_mirror_sums(mirror)  # the mirror vouches for it; the committed sums (the real data's) do not
    with pytest.raises(sources.ChecksumError) as e:
        sources.fetch("enwik8/enwik8.prefix", cache)
    assert str(e.value) == (
        f"checksum mismatch for enwik8/enwik8.prefix at {prefix}: sha256 expected "
        f"{sources.FILES['enwik8/enwik8.prefix'].sha256} (committed in highway_repro/data/SHA256SUMS), got "
        f"{hashlib.sha256(prefix.read_bytes()).hexdigest()}; the file is corrupt or another version: the mirror at "
        f"{mirror} holds another version; fix it or unset HIGHWAY_DATA_MIRROR")
    (mirror / "ptb").mkdir()
    (mirror / "ptb" / "ptb.valid.txt").write_text(" a b \n")
    write_mirror_sums(mirror)
    with pytest.raises(sources.ChecksumError, match=f"ptb.valid.txt.*sha256 expected "
                                                    f"{sources.FILES['ptb/ptb.valid.txt'].sha256}"):
        sources.fetch("ptb/ptb.valid.txt", cache)  # the bytes the published md5 aa0affc0... names


def test_a_flipped_byte_with_size_and_mtime_restored_is_refused(tmp_mirror):
    """Every use hashes the raw files: a same-size change with the old mtime is refused, the prepared arrays of the
    old file are not used and nothing is rebuilt."""
    mirror, cache = tmp_mirror
    make_small_ptb(mirror)
    data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8)
    valid = mirror / "ptb" / "ptb.valid.txt"
    expected = hashlib.sha256(valid.read_bytes()).hexdigest()
    flip_a_byte(valid)
    with pytest.raises(data.ChecksumError) as e:
        data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8)
    msg = str(e.value)
    assert msg.startswith(f"checksum mismatch for ptb/ptb.valid.txt at {valid}: sha256 expected {expected} "
                          f"(committed in highway_repro/data/SHA256SUMS), got "
                          f"{hashlib.sha256(valid.read_bytes()).hexdigest()}") and "\n" not in msg
    assert isinstance(e.value, HighwayError) and len(list(cache.glob("prepared/*"))) == 1


def test_a_changed_prepared_array_is_refused_not_rebuilt(tmp_mirror):
    mirror, cache = tmp_mirror
    make_small_ptb(mirror)
    good = data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8)
    (folder,) = list((cache / "prepared").glob("ptb_word-*"))
    manifest = json.loads((folder / "manifest.json").read_text())
    np.save(folder / "val.npy", good.streams["val"][::-1].copy())  # same shape and dtype, other tokens
    changed = (folder / "val.npy").read_bytes()
    with pytest.raises(data.ChecksumError) as e:
        data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8)
    assert str(e.value) == (
        f"checksum mismatch for prepared val.npy at {folder / 'val.npy'}: sha256 expected "
        f"{manifest['sha256']['val.npy']} (its manifest), got {hashlib.sha256(changed).hexdigest()}; it changed after "
        f"it was written: delete the folder {folder} to rebuild it from the raw files")
    assert (folder / "val.npy").read_bytes() == changed  # not rebuilt
    (folder / "manifest.json").write_text("{not json")
    with pytest.raises(data.ChecksumError, match=r"manifest.json is unreadable \(JSONDecodeError: .*delete the folder"):
        data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8)
    (folder / "manifest.json").unlink()  # a writer killed before its manifest: built again
    again = data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8)
    assert np.array_equal(again.streams["val"], good.streams["val"])
    assert json.loads((folder / "manifest.json").read_text())["sha256"] == manifest["sha256"]


def test_missing_file_without_network(tmp_path, monkeypatch):
    monkeypatch.delenv("HIGHWAY_DATA_MIRROR", raising=False)
    with pytest.raises(data.DataNotFoundError) as e:
        data.build("mnist", cache_dir=tmp_path)
    msg = str(e.value)
    assert "mnist/train-images-idx3-ubyte.gz" in msg and "http://yann.lecun.com/exdb/mnist/" in msg
    assert "ossci-datasets.s3.amazonaws.com" in msg and "HIGHWAY_DATA_MIRROR" in msg
    assert "network disabled in tests" in msg and "\n" not in msg


def test_download_is_verified_and_renamed(tmp_path, monkeypatch):
    monkeypatch.delenv("HIGHWAY_DATA_MIRROR", raising=False)
    content = b"\x00\x00\x08\x01\x00\x00\x00\x03\x01\x02\x03"
    monkeypatch.setitem(sources.FILES, "mnist/t10k-labels-idx1-ubyte.gz", sources.Source(
        "mnist/t10k-labels-idx1-ubyte.gz", ("http://example.invalid/x.gz",),
        ("md5_gunzip", hashlib.md5(content).hexdigest())))
    monkeypatch.setattr(sources, "download", lambda url, dest, timeout=None: dest.write_bytes(gzip.compress(content)))
    path = sources.fetch("mnist/t10k-labels-idx1-ubyte.gz", tmp_path)
    assert path == tmp_path / "mnist/t10k-labels-idx1-ubyte.gz"
    assert vision.read_idx(path).tolist() == [1, 2, 3]
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp files left


def test_archive_download_and_extract(tmp_path, monkeypatch):
    """CIFAR-10 with no mirror: the canonical tar.gz is "downloaded", verified, and its members extracted."""
    import io
    import tarfile

    monkeypatch.delenv("HIGHWAY_DATA_MIRROR", raising=False)
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            blob = pickle.dumps({b"data": rng.integers(0, 256, (20, 3072), dtype=np.uint8),
                                 b"labels": rng.integers(0, 10, 20).tolist()}, protocol=2)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            t.addfile(info, io.BytesIO(blob))
    archive = buf.getvalue()
    key = "cifar10/cifar-10-python.tar.gz"
    calls = []

    def fake_download(url, dest, timeout=None):
        calls.append(url)
        dest.write_bytes(archive)

    monkeypatch.setattr(sources, "download", fake_download)
    wrong = sources.ARCHIVES[key]
    with pytest.raises(sources.ChecksumError, match="c58f30108f718f92721af3b95e74349a"):
        data.build("cifar10", cache_dir=tmp_path, batch_size=10)
    assert not (tmp_path / key).exists()
    monkeypatch.setitem(sources.ARCHIVES, key, sources.Archive(key, wrong.urls, hashlib.md5(archive).hexdigest()))
    d = data.build("cifar10", cache_dir=tmp_path, batch_size=10)
    assert d.num_examples("train") == 100 and d.num_examples("test") == 20
    assert calls == [wrong.urls[0]] * 2  # once refused, once accepted; then extracted from the cache
    # no checksum is published for a batch: its sha256 is recorded at extraction and checked on every use
    batch = tmp_path / "cifar10/cifar-10-batches-py/data_batch_5"
    record = batch.with_name("data_batch_5.sha256")
    assert record.read_text() == f"{hashlib.sha256(batch.read_bytes()).hexdigest()}  data_batch_5\n"
    flip_a_byte(batch, 100)
    with pytest.raises(sources.ChecksumError, match=f"data_batch_5 at {batch}: sha256 expected [0-9a-f]{{64}} \\("
                                                    f"recorded in {record}\\), got [0-9a-f]{{64}}; .*delete {batch}"):
        data.build("cifar10", cache_dir=tmp_path, batch_size=10)
    record.unlink()
    with pytest.raises(sources.ChecksumError, match=f"data_batch_5 at {batch} cannot be verified: no checksum of it "
                                                    f"is published or committed .*{record} is missing"):
        sources.fetch("cifar10/cifar-10-batches-py/data_batch_5", tmp_path)
    assert calls == [wrong.urls[0]] * 2  # refused, never fetched again


# ----------------------------------------------------------------------------- readers

def test_idx_magic_check(tmp_path):
    bad = tmp_path / "train-images-idx3-ubyte.gz"
    bad.write_text("<html>not found</html>")
    with pytest.raises(data.DataError, match=r"train-images-idx3-ubyte.gz: not an idx file"):
        vision.read_idx(bad)
    bad.write_bytes(gzip.compress(b"\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00\x00\x02\x00\x00\x00\x02" + b"\x01" * 7))
    with pytest.raises(data.DataError, match="body has 7"):
        vision.read_idx(bad)


def make_cifar100(mirror: Path, n_train=300, n_test=50, seed=0) -> None:
    rng = np.random.default_rng(seed)
    base = mirror / "cifar100" / "cifar-100-python"
    base.mkdir(parents=True)
    for name, n in (("train", n_train), ("test", n_test)):
        fine = rng.integers(0, 100, n).tolist()
        d = {b"filenames": [b"x.png"] * n, b"batch_label": name.encode(), b"fine_labels": fine,
             b"coarse_labels": [f // 5 for f in fine], b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8)}
        (base / name).write_bytes(pickle.dumps(d, protocol=2))
    (base / "meta").write_bytes(pickle.dumps({b"fine_label_names": [b"c%d" % i for i in range(100)]}, protocol=2))
    write_sums(mirror)


def test_cifar100_fixture(tmp_mirror):
    mirror, cache = tmp_mirror
    make_cifar100(mirror)
    d = data.build("cifar100", cache_dir=cache, batch_size=50, eval_batch_size=20, val_size=100, augment=True, seed=1)
    assert d.meta == {"num_classes": 100, "input_shape": (3, 32, 32)}
    assert (d.num_examples("train"), d.num_examples("val"), d.num_examples("test")) == (200, 100, 50)
    assert d.steps_per_epoch == 4 and d.splits == ("val", "test")
    assert [len(y) for _, y in d.eval_batches("test")] == [20, 20, 10]
    # the same (seed, step) gives the same batch, also from a fresh object; other steps differ
    x1, y1 = d.train_batch(5)
    x2, y2 = data.build("cifar100", cache_dir=cache, batch_size=50, val_size=100, augment=True, seed=1).train_batch(5)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(d.train_batch(6)[0], x1)
    # an epoch visits every training image once
    ys = torch.cat([d.train_batch(s)[1] for s in range(4, 8)])
    assert sorted(ys.tolist()) == sorted(d.data["train"][1].tolist())
    # global contrast normalisation by hand (numpy, float64): each image / 255, minus its mean, over its unbiased
    # std; the pixel mean is that over the training images; an eval image is gcn(x) - pixel mean
    def gcn(u8):
        a = u8.numpy().astype(np.float64) / 255.0
        a = a - a.mean(axis=(1, 2, 3), keepdims=True)
        return a / a.std(axis=(1, 2, 3), ddof=1, keepdims=True)

    mean = gcn(d.data["train"][0]).mean(0)
    np.testing.assert_allclose(d.pixel_mean.numpy(), mean, atol=1e-5)
    xv, _ = next(d.eval_batches("val"))
    np.testing.assert_allclose(xv.numpy(), gcn(d.data["val"][0][:20]) - mean, atol=1e-5)


def test_augment_matches_loop():
    x = torch.randn(6, 3, 32, 32)
    out = vision.ImageData._pad_crop_flip(x, torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(0)
    oy, ox = torch.randint(0, 17, (6,), generator=g), torch.randint(0, 17, (6,), generator=g)
    flip = torch.rand(6, generator=g) < 0.5
    padded = torch.nn.functional.pad(x, (8, 8, 8, 8))
    for i in range(6):
        ref = padded[i, :, oy[i]: oy[i] + 32, ox[i]: ox[i] + 32]
        assert torch.equal(out[i], ref.flip(-1) if flip[i] else ref)


def test_mnist_augment_is_a_shift_of_at_most_2px():
    x = torch.rand(50, 1, 28, 28) + 1.0  # no zeros inside, so the zero border shows the shift
    out = vision.ImageData._pad_crop_flip(x, torch.Generator().manual_seed(0), *vision.AUGMENT["mnist"])
    shifts = set()
    for i in range(50):
        hits = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)
                if torch.equal(out[i], torch.roll(torch.nn.functional.pad(x[i], (2, 2, 2, 2)), (dy, dx), (1, 2))
                               [:, 2:30, 2:30])]
        assert len(hits) == 1  # a pure translation (no flip), zeros where it leaves the image
        shifts.add(hits[0])
    assert len(shifts) > 10  # all 25 offsets are drawn; 50 draws cover more than 10 of them


class Evil:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return os.mkdir, (self.target,)


def test_malicious_pickle_not_executed(tmp_mirror):
    mirror, cache = tmp_mirror
    make_cifar100(mirror)
    target = str(mirror.parent / "pwned")
    (mirror / "cifar100/cifar-100-python/train").write_bytes(pickle.dumps({b"data": Evil(target)}))
    write_sums(mirror)
    with pytest.raises(vision.UnsafePickleError, match=r"cifar-100-python/train: refusing.*mkdir"):
        data.build("cifar100", cache_dir=cache)
    assert not os.path.exists(target)


def test_cifar_wrong_format(tmp_mirror):
    mirror, cache = tmp_mirror
    make_cifar100(mirror)
    (mirror / "cifar100/cifar-100-python/test").write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8)}))
    write_sums(mirror)
    with pytest.raises(data.DataError, match=r"cifar-100-python/test: wrong format.*fine_labels"):
        data.build("cifar100", cache_dir=cache)


# ----------------------------------------------------------------------------- LM batching

def lm(n=1000, **kw):
    return text.LMData("toy", {"train": np.arange(n), "val": np.arange(n // 2), "test": np.arange(n // 3)},
                       FakeTok(n), **kw)


def test_lm_train_batches():
    d = lm(1000, batch_size=4, seq_len=10, score_len=10)
    L = 999 // 4
    assert d.steps_per_epoch == (L - 10) // 10 + 1
    x, y = d.train_batch(3)
    assert x.shape == (4, 10) and x.dtype == torch.int64
    assert torch.equal(y, x + 1)                       # y = x shifted by one
    assert x[1, 0].item() == L + 30                    # column 1, window 3
    assert torch.equal(d.train_batch(3 + d.steps_per_epoch)[0], x)
    assert torch.equal(lm(1000, batch_size=4, seq_len=10).train_batch(3)[0], x)
    d = lm(1000, batch_size=4, seq_len=10, score_len=4)
    assert d.train_batch(2)[0][0, 0].item() == 8       # windows start score_len apart


@pytest.mark.parametrize("T,S,B", [(10, 10, 1), (10, 4, 1), (10, 4, 3), (7, 3, 5), (10, 1, 2), (5, 5, 4)])
def test_lm_eval_scores_every_token_once(T, S, B):
    n = 203
    d = lm(n * 2, batch_size=1, seq_len=T, eval_seq_len=T, eval_score_len=S, eval_batch_size=B)
    L = (n - 1) // B
    seen, prev_end = [], 0
    for x, y in d.eval_batches("val"):
        assert x.shape[0] == B and 1 <= x.shape[1] <= T and torch.equal(y, x + 1)
        k = min(S, x.shape[1])
        assert x[0, -1].item() + 1 > prev_end           # stream order
        prev_end = x[0, -1].item() + 1
        seen += y[:, -k:].flatten().tolist()
    assert len(seen) == d.num_targets("val") == B * L
    assert sorted(seen) == list(range(1, B * L + 1))     # every target exactly once
    if B == 1:
        assert d.num_targets("val") == n - 1


def test_lm_eval_windows_have_context():
    d = lm(1000, batch_size=1, seq_len=400, score_len=320)
    assert d.eval_score_len == 320
    w = lm(2000, batch_size=1, seq_len=400, score_len=320).eval_windows("val")
    assert w[0] == (0, 320) and w[1] == (240, 640) and w[2] == (560, 960) and w[-1] == (960, 999)
    with pytest.raises(ValueError, match="score_len <= seq_len"):
        lm(1000, seq_len=10, score_len=11)
    with pytest.raises(ValueError, match="train split too small"):
        lm(100, batch_size=10, seq_len=20)


# ----------------------------------------------------------------------------- tokenizers

def test_char_word_byte_tokenizers():
    t = CharTokenizer.fit(["ab c\nca\n"])
    assert t.symbols == [EOS, " ", "a", "b", "c"]
    ids = t.encode("ab c\nca\n")
    assert ids.dtype == np.uint8 and t.decode(ids) == "ab c\nca\n"
    with pytest.raises(ValueError, match="not in the vocabulary"):
        t.encode("abz")
    w = WordTokenizer.fit(" the cat \n the <unk> sat\n")
    assert w.words == ["the", "cat", EOS, "<unk>", "sat"]
    assert w.decode(w.encode("the dog sat\n")) == "the <unk> sat\n"
    b = ByteTokenizer.fit([np.frombuffer(b"ab\nb", np.uint8)], "drop")
    assert b.codes == [97, 98] and b.encode(b"b\na").tolist() == [1, 0]


def test_sentencepiece_trains_and_round_trips(tmp_path):
    rng = np.random.default_rng(0)
    words = ["the", "market", "shares", "rose", "fell", "percent", "N", "<unk>", "company", "said"]
    lines = [" ".join(rng.choice(words, rng.integers(3, 12))) for _ in range(500)]
    corpus = "\n".join(lines) + "\n"
    sp = SentencePieceTokenizer.train(corpus, tmp_path / "sp.model", vocab_size=25)
    assert sp.vocab_size == 25 and (tmp_path / "sp.model").is_file()
    ids = sp.encode(corpus)
    assert ids.dtype == np.uint8 and (ids == sp.eos_id).sum() == len(lines)
    assert sp.decode(ids) == corpus
    assert sp.sp.id_to_piece(int(sp.encode("<unk>\n")[-2])) == "<unk>"  # kept as one piece


def make_small_ptb(mirror: Path) -> None:
    (mirror / "ptb").mkdir()
    rng = np.random.default_rng(1)
    words = [f"w{i}" for i in range(60)] + ["<unk>", "N"]
    for f, n in (("train", 400), ("valid", 60), ("test", 60)):
        lines = [" " + " ".join(rng.choice(words, rng.integers(2, 15))) + " " for _ in range(n)]
        (mirror / "ptb" / f"ptb.{f}.txt").write_text("\n".join(lines) + "\n")
    write_sums(mirror)


def test_ptb_word_sentencepiece_and_datasets_reader(tmp_mirror):
    mirror, cache = tmp_mirror
    make_small_ptb(mirror)
    plain = data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8)
    hf = data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8, reader="datasets")
    for s in ("train", "val", "test"):
        assert np.array_equal(plain.streams[s], hf.streams[s])
    assert plain.tokenizer.words == hf.tokenizer.words
    sp = data.build("ptb_word", cache_dir=cache, tokenizer="sentencepiece", vocab_size=60, batch_size=2, seq_len=8)
    (model,) = list(cache.glob("prepared/ptb_word-*/tokenizer.model"))  # covered by the folder's manifest
    assert sp.meta["vocab_size"] == 60 and sp.tokenizer.model_file == str(model)
    assert sp.tokenizer.decode(sp.streams["val"]).split() == (mirror / "ptb/ptb.valid.txt").read_text().split()
    again = data.build("ptb_word", cache_dir=cache, tokenizer="sentencepiece", vocab_size=60, batch_size=2, seq_len=8)
    assert np.array_equal(again.streams["train"], sp.streams["train"])
    with pytest.raises(ValueError, match="needs vocab_size"):
        data.build("ptb_word", cache_dir=cache, tokenizer="sentencepiece")
    with pytest.raises(ValueError, match="tokenizer='sentencepiece'.*char"):
        data.build("ptb_char_raw", cache_dir=cache, tokenizer="sentencepiece")


# ----------------------------------------------------------------------------- enwik8

def make_enwik8_zip(folder: Path, n: int, seed=0) -> bytes:
    rng = np.random.default_rng(seed)
    block = rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes() + b"\n" * 1000
    raw = (block * (n // len(block) + 1))[:n]
    (folder / "enwik8").mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / "enwik8" / "enwik8.zip", "w", zipfile.ZIP_STORED) as z:
        z.writestr("enwik8", raw)
    # no checksum of enwik8.zip is published: a copy put in the cache by hand is vouched for by its record
    sha = hashlib.sha256((folder / "enwik8" / "enwik8.zip").read_bytes()).hexdigest()
    (folder / "enwik8" / "enwik8.zip.sha256").write_text(f"{sha}  enwik8.zip\n")
    return raw


def check_enwik8(cache: Path, raw: bytes, n_eval: int) -> None:
    keep = data.build("enwik8", newlines="keep", cache_dir=cache, batch_size=4, seq_len=64)
    assert [keep.num_tokens(s) for s in ("train", "val", "test")] == [len(raw) - 2 * n_eval, n_eval, n_eval]
    assert bytes(keep.streams["val"][:100]) == raw[len(raw) - 2 * n_eval: len(raw) - 2 * n_eval + 100]
    drop = data.build("enwik8", cache_dir=cache, batch_size=4, seq_len=64)
    test_raw = raw[-n_eval:]
    assert drop.num_tokens("test") == n_eval - test_raw.count(b"\n")
    assert 10 not in drop.tokenizer.codes and drop.meta["vocab_size"] == 255


def test_enwik8_split_small(tmp_path, monkeypatch):
    monkeypatch.delenv("HIGHWAY_DATA_MIRROR", raising=False)
    monkeypatch.setattr(text, "ENWIK8_BYTES", 3_000_000)
    monkeypatch.setattr(text, "ENWIK8_EVAL_BYTES", 150_000)
    raw = make_enwik8_zip(tmp_path, 3_000_000)
    check_enwik8(tmp_path, raw, 150_000)


@pytest.mark.slow
def test_enwik8_full_size_is_fast(tmp_path, monkeypatch):
    monkeypatch.delenv("HIGHWAY_DATA_MIRROR", raising=False)
    raw = make_enwik8_zip(tmp_path, 100_000_000)
    t = time.perf_counter()
    d = data.build("enwik8", cache_dir=tmp_path, batch_size=22, seq_len=512)
    assert time.perf_counter() - t < 20  # vectorised preparation (a few seconds)
    assert d.num_tokens("train") == 90_000_000 - raw[:90_000_000].count(b"\n")
    check_enwik8(tmp_path, raw, 5_000_000)
