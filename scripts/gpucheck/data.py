"""Phase 2, the data: where the mirror is, what it holds, what is missing; and `--prepare`, on the CPU box, the
subset of the data, the pure-Python packages and the peers' wheels to carry to a bare GPU machine, and their size."""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path

from .cases import CASES, CIFAR, ENWIK8, MNIST, PTB
from .common import CARRY_LIMIT, DEPS, GPU_CACHE, GPU_MIRROR, PEERS_DIR, REPO, say
from .peers import prepare_peers
from .phases import Ctx
from .report import md_table


def mirror_info() -> dict:
    """Where the tree and the data come from: the mirror's PREPARED.json (the commit --prepare ran at), else
    git HEAD."""
    mirror = os.environ.get("HIGHWAY_DATA_MIRROR")
    if mirror and (Path(mirror) / "PREPARED.json").is_file():
        with contextlib.suppress(Exception):
            return {**json.loads((Path(mirror) / "PREPARED.json").read_text()),
                    "source": "commit the data was prepared at: the mirror's PREPARED.json"}
    with contextlib.suppress(Exception):
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=5)
        if r.returncode == 0:
            return {"commit": r.stdout.strip(), "source": "git HEAD; uncommitted changes not shown"}
    return {}


def data_check(ctx: Ctx) -> None:
    from highway_repro.data import sources

    mirror = sources.mirror_dir()
    lines = [f"Mirror (`HIGHWAY_DATA_MIRROR` or `--data`): `{mirror or 'not set'}`"
             + ("" if mirror is None or mirror.is_dir() else " (**does not exist**)")
             + f"; cache `{sources.cache_dir()}`; downloads off (`HIGHWAY_DATA_OFFLINE=1`).", ""]
    info = mirror_info() if mirror else {}
    if info.get("note"):
        lines += [info["note"], ""]
    rows = []
    for case in CASES:
        missing = [f for f in case.files if sources.locate(f) is None]
        ctx.missing[case.key] = missing
        rows.append([case.label, ", ".join(f"`{f}`" for f in case.files),
                     "ok" if not missing else "**missing** " + ", ".join(f"`{f}`" for f in missing)])
        ctx.rep.row("data", case.key, "", "", "missing_files", len(missing), "", " ".join(missing))
    lines += md_table(["model", "files", "status"], rows)
    lines += ["", "The paper's enwik8 runs use the full corpus (90M/5M/5M); the mirror holds only its 4.15 MB prefix "
                  "(`data=enwik8_prefix`, a proportional 90/5/5 split): speed and memory do not depend on it, the "
                  "step-400 bpc comparison is indicative only. CIFAR-10: the carried subset (see above) is enough for "
                  "speed; evaluation times are scaled to the full 10,000-image test set."]
    ctx.rep.section("data", "Data", lines)
    if any(ctx.missing.values()):
        say("data missing for: " + ", ".join(k for k, v in ctx.missing.items() if v)
            + " (set HIGHWAY_DATA_MIRROR or --data to a folder laid out like the offline mirror; "
              "`python scripts/gpu_check.py --prepare` makes data/gpu_mirror and data/gpu_cache)")


CONFIG_DEPS = ("hydra", "omegaconf", "antlr4")  # what a CUDA PyTorch image lacks: the config stack
TEST_DEPS = ("yaml", "tqdm", "pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "exceptiongroup",
             "tomli", "py")  # `--test-deps`: for a bare Python (7 MiB, most of it pygments)


def _committed(path: Path, rel: str) -> str:
    """The sha256 of `path`, the mirror file `rel`, if it is the one committed in the data layer's SHA256SUMS."""
    import hashlib

    from highway_repro.data import sources

    sha, expected = hashlib.sha256(path.read_bytes()).hexdigest(), sources.FILES[rel].sha256
    if sha != expected:
        raise sources.ChecksumError(f"checksum mismatch for {rel} at {path}: sha256 expected {expected} (committed in "
                                    f"{sources.SUMS_NAME}), got {sha}; --from must be the offline mirror")
    return sha


def prepare_data(src: Path, dst: Path, cache: Path, n_train: int = 3000, n_test: int = 1000) -> dict:
    """What the check reads, each source file verified against the committed sums first: the enwik8 prefix, PTB,
    MNIST and CIFAR-10's batches.meta as they are, in the mirror-layout folder `dst` (with the committed SHA256SUMS
    lines of its files and PREPARED.json); CIFAR-10 cut to the first n_train / n_test images of data_batch_1 /
    test_batch (canonical pickle layout) in the data cache folder `cache`, each with the `<file>.sha256` record the
    data layer checks a file with no committed sum against (as it records the batches it extracts)."""
    import hashlib
    import pickle

    import numpy as np

    from highway_repro.data.vision import read_cifar_pickle

    for folder in (dst, cache):
        if folder.exists():
            shutil.rmtree(folder)
    for rel, n in ((CIFAR[0], n_train), (CIFAR[1], n_test)):
        _committed(src / rel, rel)
        images, labels = read_cifar_pickle(src / rel, b"labels")
        d = {b"batch_label": f"first {n} images of {Path(rel).name}".encode(),
             b"labels": [int(v) for v in labels[:n]], b"data": np.ascontiguousarray(images[:n].reshape(n, 3072)),
             b"filenames": [f"{i}.png".encode() for i in range(n)]}
        blob = pickle.dumps(d, protocol=2)
        (cache / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache / rel).write_bytes(blob)
        (cache / f"{rel}.sha256").write_text(f"{hashlib.sha256(blob).hexdigest()}  {Path(rel).name}\n")
    sums = []
    for rel in ENWIK8 + PTB + MNIST + CIFAR[2:]:
        if not (src / rel).is_file():
            raise FileNotFoundError(f"{src / rel} is missing: --from must be a folder laid out like the offline mirror")
        sums.append(f"{_committed(src / rel, rel)}  ./{rel}")
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, dst / rel)
    (dst / "SHA256SUMS").write_text("\n".join(sums) + "\n")  # for `sha256sum -c`; the data layer reads its own
    commit = ""
    with contextlib.suppress(Exception):
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                timeout=5).stdout.strip()
    info = {"commit": commit or "unknown", "prepared": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "from": str(src),
        "note": f"Prepared subset of the offline mirror (`scripts/gpu_check.py --prepare`): "
                f"enwik8 prefix, PTB and MNIST "
                f"as they are; CIFAR-10 cut to the first {n_train:,} training and {n_test:,} test images (in the data "
                f"cache `{cache.name}`, vouched for by their `.sha256` records)."}
    (dst / "PREPARED.json").write_text(json.dumps(info, indent=1))
    files = sorted(p for folder in (dst, cache) for p in folder.rglob("*") if p.is_file())
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files)}


def prepare_deps(dst: Path, modules: tuple = CONFIG_DEPS) -> dict:
    """Pure-Python copies of `modules` (hydra, omegaconf, antlr4; with TEST_DEPS also yaml, pytest and their
    helpers) from this interpreter (compiled extensions left out: yaml falls back to pure Python), for a GPU
    machine that lacks them."""
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    copied, absent = [], []
    for mod in modules:
        spec = None
        with contextlib.suppress(ImportError, ValueError):
            spec = importlib.util.find_spec(mod)
        if spec is None or spec.origin in (None, "built-in", "frozen") and not spec.submodule_search_locations:
            absent.append(mod)
            continue
        if spec.submodule_search_locations:
            pkg = Path(list(spec.submodule_search_locations)[0])
            shutil.copytree(pkg, dst / pkg.name, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", "*.c"))
        else:
            shutil.copyfile(spec.origin, dst / Path(spec.origin).name)
        copied.append(mod)
    size = sum(p.stat().st_size for p in dst.rglob("*") if p.is_file())
    return {"copied": copied, "absent": absent, "bytes": size}


def tree_bytes(repo: Path = REPO) -> int:
    """What of the checkout travels to the GPU machine: the tracked files and the untracked ones git does not ignore."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                           capture_output=True).stdout.split(b"\0")
    return sum((repo / n.decode()).stat().st_size for n in set(names) if n and (repo / n.decode()).is_file())


def carry_total(parts: dict[str, int], limit: int = CARRY_LIMIT) -> tuple[str, bool]:
    """One line of what travels, part by part, and whether it stays within the limit."""
    total = sum(parts.values())
    text = ", ".join(f"{k} {v / 2 ** 20:.1f} MiB" for k, v in parts.items())
    return f"{text}: {total / 2 ** 20:.1f} MiB to carry (limit {limit / 2 ** 20:.0f} MiB)", total <= limit


def prepare(args) -> int:
    src = Path(args.prepare_from or os.environ.get("HIGHWAY_DATA_MIRROR") or "/work/shared/data")
    if src.resolve() == GPU_MIRROR.resolve():
        raise SystemExit(f"--from {src}: that is the folder --prepare writes; give the full offline mirror")
    d = prepare_data(src, GPU_MIRROR, GPU_CACHE, args.cifar_train, args.cifar_test)
    say(f"data: {d['files']} files, {d['bytes'] / 2 ** 20:.1f} MiB in {GPU_MIRROR} and {GPU_CACHE}")
    p = prepare_deps(DEPS, CONFIG_DEPS + (TEST_DEPS if args.test_deps else ()))
    say(f"packages: {', '.join(p['copied'])} ({p['bytes'] / 2 ** 20:.1f} MiB) in {DEPS}"
        + (f"; not in this interpreter (fine if the GPU's Python is >= 3.11): {', '.join(p['absent'])}"
           if p["absent"] else ""))
    q = {"files": [], "bytes": 0, "failed": []}
    if args.peers:
        q = prepare_peers(PEERS_DIR)
        say(f"peers: {len(q['files'])} wheels ({q['bytes'] / 2 ** 20:.1f} MiB) in {PEERS_DIR}: {' '.join(q['files'])}")
        for f in q["failed"]:
            say(f"peers: no wheel for {f} (that peer's rows will say it is absent)")
    elif PEERS_DIR.exists():
        shutil.rmtree(PEERS_DIR)  # --no-peers: nothing of them travels
    text, ok = carry_total({"data": d["bytes"], DEPS.name: p["bytes"], PEERS_DIR.name: q["bytes"],
                            "tree": tree_bytes()})
    say(text)
    print("carry: data/gpu_mirror data/gpu_cache .gpu_deps" + (" .gpu_peers" if args.peers else "")
          + "\nrun:   python3 scripts/gpu_check.py --data data/gpu_mirror --out \"$OUT/gpu_check\"")
    return 0 if ok and not q["failed"] else 1
