"""Prepared folders anchored to the repository: a folder named in highway_repro/data/PREPARED_SHA256SUMS must hold
the committed sha256s (arrays and info.json, the vocabulary) right after its build and on every use, whatever its
manifest says; the committed sums are those a fresh build from the offline mirror gives."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from conftest import needs_mirror, write_sums
from highway_repro import data
from highway_repro.data import prepared, sources

@pytest.fixture
def anchored(tmp_mirror, monkeypatch):
    """A small word-PTB in a test mirror, no network, built once; its prepared folder's sums committed for the test.
    Returns (build, folder, its data): `build()` builds it again."""
    mirror, cache = tmp_mirror

    def refuse(url, dest, timeout=None):
        raise OSError("network disabled in tests")

    monkeypatch.setattr(sources, "download", refuse)
    (mirror / "ptb").mkdir()
    rng = np.random.default_rng(1)
    for f, n in (("train", 200), ("valid", 30), ("test", 30)):
        lines = (" " + " ".join(rng.choice([f"w{i}" for i in range(30)], 8)) + " \n" for _ in range(n))
        (mirror / "ptb" / f"ptb.{f}.txt").write_text("".join(lines))
    write_sums(mirror)

    def build():
        return data.build("ptb_word", cache_dir=cache, batch_size=2, seq_len=8)

    good = build()
    (folder,) = list((cache / "prepared").glob("ptb_word-*"))
    monkeypatch.setitem(prepared.COMMITTED, folder.name, _manifest(folder)["sha256"])
    return build, folder, good


def _manifest(folder):
    return json.loads((folder / "manifest.json").read_text())


def _rewrite(folder, file, blob: bytes) -> str:
    """Write `file` and its sha256 into the manifest, as someone who can write the cache would; returns the sha256."""
    (folder / file).write_bytes(blob)
    man = _manifest(folder)
    man["sha256"][file] = hashlib.sha256(blob).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(man))
    return man["sha256"][file]


def _refusal(folder, file, committed: str, actual: str) -> str:
    return (f"checksum mismatch for prepared {file} at {folder / file}: sha256 expected {committed} (committed in "
            f"highway_repro/data/PREPARED_SHA256SUMS), got {actual}; it is not what the raw files give: delete the "
            f"folder {folder} to rebuild it from the raw files")


def test_an_array_swapped_with_its_manifest_sum_is_refused(anchored, monkeypatch):
    build, folder, good = anchored
    committed = prepared.COMMITTED[folder.name]["val.npy"]
    np.save(folder / "val.npy", good.streams["val"][::-1].copy())  # same shape and dtype, other tokens
    actual = _rewrite(folder, "val.npy", (folder / "val.npy").read_bytes())
    with pytest.raises(data.ChecksumError) as e:
        build()
    assert str(e.value) == _refusal(folder, "val.npy", committed, actual)
    monkeypatch.delitem(prepared.COMMITTED, folder.name)  # a folder nobody committed: trusted on first use
    assert np.array_equal(build().streams["val"], good.streams["val"][::-1])


def test_a_vocabulary_changed_in_the_info_is_refused(anchored, monkeypatch):
    build, folder, good = anchored
    info = json.loads((folder / "info.json").read_text())
    assert info == {"tokenizer": good.tokenizer.state()}
    info["tokenizer"]["words"] += [f"extra{i}" for i in range(500)]  # another vocabulary: another model size
    blob = json.dumps(info).encode()
    (folder / "info.json").write_bytes(blob)
    with monkeypatch.context() as m:  # the manifest covers the info too
        m.delitem(prepared.COMMITTED, folder.name)
        with pytest.raises(data.ChecksumError, match="prepared info.json .* \\(its manifest\\), got .*changed after"):
            build()
    committed = prepared.COMMITTED[folder.name]["info.json"]
    actual = _rewrite(folder, "info.json", blob)  # ... and its sum rewritten in the manifest
    with pytest.raises(data.ChecksumError) as e:
        build()
    assert str(e.value) == _refusal(folder, "info.json", committed, actual)


def test_a_build_that_does_not_give_the_committed_files_is_refused(anchored, monkeypatch):
    """Right after a build, too: a folder whose build gives other bytes (another numpy, changed preparing code) is
    refused in one line and gets no manifest."""
    build, folder, good = anchored
    sums = dict(prepared.COMMITTED[folder.name], **{"train.npy": "0" * 64})
    monkeypatch.setitem(prepared.COMMITTED, folder.name, sums)
    (folder / "manifest.json").unlink()  # built again
    with pytest.raises(data.ChecksumError) as e:
        build()
    msg = str(e.value)
    assert msg.startswith(f"checksum mismatch for prepared train.npy at {folder / 'train.npy'}: sha256 expected "
                          f"{'0' * 64} (committed in highway_repro/data/PREPARED_SHA256SUMS), got "
                          f"{hashlib.sha256((folder / 'train.npy').read_bytes()).hexdigest()}; ") and "\n" not in msg
    assert f"delete the folder {folder}" in msg and not (folder / "manifest.json").exists()


@pytest.mark.slow  # about 3 s: builds seven prepared folders from the mirror
@needs_mirror
def test_the_committed_sums_are_those_of_a_fresh_build_from_the_mirror(tmp_path):
    """`python -m highway_repro.data` writes the same file as the committed one."""
    from highway_repro.data.__main__ import prepared_sums

    assert prepared_sums(tmp_path) == prepared.SUMS_FILE.read_text()
    assert len(prepared.COMMITTED) == 7
