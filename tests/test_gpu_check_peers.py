"""The GPU check's peers (scripts/gpucheck/peers.py): ours / peer tokens/s and the HF target, a peer whose packages
import nowhere reported as absent with its reason (not a problem), the wheels `--prepare` carries and the size cap of
what travels; the dry run of phase 4 with the peers (slow)."""

from __future__ import annotations

import csv
import os
import sys
import zipfile
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import REPO, mirror, needs_mirror

sys.path.insert(0, str(REPO / "scripts"))  # the parts of scripts/gpu_check.py, as the script itself finds them
from gpucheck import cli, data, peers  # noqa: E402
from gpucheck.phases import Ctx  # noqa: E402
from gpucheck.report import Report  # noqa: E402

MiB = 2 ** 20


def _ctx(tmp_path) -> Ctx:
    args = cli.parse(["--dry-run", "--out", str(tmp_path / "gpu_check"), "--runs", str(tmp_path / "runs")])
    return Ctx(args, Report(Path(args.out), True, "test"))


def _run(step_s: float, items: int = 22 * 512) -> dict:
    return {"step_s": step_s, "rate": items / step_s, "items": items, "params": 1000, "batch": (22, 512),
            "flops": 1e12, "mfu": 0.1, "mem": MiB, "unit": "tokens", "loss_last": 1.0}


def _peer(step_s: float, items: int = 22 * 512) -> dict:
    return {**_run(step_s, items), "version": "4.36.2", "source": "test", "loss": 1.0, "mem_reserved": MiB}


def test_ratio_is_ours_over_the_peer_in_the_same_precision_and_mode(tmp_path):
    """ours / peer tokens/s from the runs of the same case, precision and mode (eager: phase 4's run; default: phase
    `compiled`'s); the HF target (>= 2x, bf16) is met or not by that ratio; no ratio without our run."""
    ctx = _ctx(tmp_path)
    ctx.results[("txl6", "baseline", "bf16")] = _run(0.030)
    ctx.results[("txl6", "baseline+compile-default", "bf16")] = _run(0.020)
    ctx.peers[("hf", "eager", "bf16")] = _peer(0.075)
    ctx.peers[("hf", "default", "bf16")] = _peer(0.030)
    ctx.peers[("hf", "eager", "fp32")] = _peer(0.090)  # our fp32 run not measured
    assert peers.ratio(ctx, peers.HF, "bf16", "eager") == pytest.approx(2.5)
    assert peers.ratio(ctx, peers.HF, "bf16", "default") == pytest.approx(1.5)
    assert peers.ratio(ctx, peers.HF, "fp32", "eager") is None
    peers.peers_section(ctx)
    body = "\n".join(ctx.rep.sections["peers"][1])
    assert "| HF transformers TransfoXLLMHeadModel 4.36.2 | bf16 | eager | 1,000 | 22x512 | 75.0 | " in body
    assert "| **2.50x** |" in body and "| **1.50x** |" in body and "ours not measured" in body
    targets = {t[0]: t[4] for t in ctx.rep.targets}
    assert targets == {"peer_hf_eager": "met", "peer_hf_default": "**NOT met**"}


def test_a_peer_that_imports_nowhere_is_absent_with_its_reason(tmp_path, monkeypatch):
    """The HF worker started with a transformers that fails to import replies why; the peer's rows say it, the check
    records no problem and does not try that source again; x-transformers missing likewise."""
    site = tmp_path / "site"
    (site / "transformers").mkdir(parents=True)
    (site / "transformers" / "__init__.py").write_text("import safetensors_not_here\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    ctx = _ctx(tmp_path)
    monkeypatch.setattr(peers, "hf_sources", lambda c: ([("a site without safetensors", sys.executable, env)],
                                                        ["no .venv-bench-hf"]))
    cfg = OmegaConf.create({"model": {"d_model": 8, "n_heads": 2, "d_head": 4, "d_ff": 16, "n_layers": 1,
                                      "mem_len": 4, "dropout": 0.0, "attn_dropout": 0.0},
                            "optim": {"optimizer": {"_target_": "torch.optim.Adam", "_partial_": True, "lr": 1e-3}},
                            "trainer": {"grad_clip": 0.25}, "seed": 0})
    import torch

    batch = (torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long))
    monkeypatch.setattr(peers, "composed", lambda c, key, precision: (cfg, 11, batch))
    monkeypatch.setitem(sys.modules, "x_transformers", None)  # an import of it fails
    monkeypatch.setattr(peers, "PEERS_DIR", tmp_path / "no_peers")
    for precision in ("bf16", "fp32"):
        for peer in peers.PEERS:
            peers.peer_run(ctx, peer, precision, "eager")
    why = "ModuleNotFoundError: No module named 'safetensors_not_here'"
    assert ctx.peers[("hf", "eager", "fp32")]["absent"] == f"a site without safetensors: {why}; no .venv-bench-hf"
    assert ctx.hf_failed == {"a site without safetensors": why}
    xt = ctx.peers[("xt", "eager", "bf16")]["absent"]
    assert xt.startswith("x-transformers does not import: ModuleNotFoundError") and "no_peers/xt" in xt
    assert ctx.rep.problems == []
    absent = [r for r in ctx.rep.rows if r[0] == "peers" and r[4] == "absent"]
    assert {(r[1], r[2], r[3]) for r in absent} == {(p.case, p.key, pr) for p in peers.PEERS for pr in ("bf16", "fp32")}
    body = "\n".join(ctx.rep.sections["peers"][1])
    assert "| HF transformers TransfoXLLMHeadModel | bf16 | eager |  |  |  | absent: a site without" in body


def _fake_download(calls):
    def download(spec: str, folder: Path) -> str:
        calls.append(spec)
        name, version = spec.split("==")
        if name == "loguru":
            return "ERROR: No matching distribution found for loguru==0.7.3"
        (folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl").write_bytes(b"w" * 1000)
        return ""
    return download


def test_prepare_carries_each_pinned_wheel_once_and_nothing_else(tmp_path):
    """Every peer's pinned wheels in .gpu_peers/<peer>/, each downloaded once (a second --prepare downloads
    nothing), another version of a pin removed; a wheel that does not come is named."""
    dst = tmp_path / ".gpu_peers"
    (dst / "hf").mkdir(parents=True)
    (dst / "hf" / "transformers-4.30.0-py3-none-any.whl").write_bytes(b"old")  # an older pin
    calls = []
    out = peers.prepare_peers(dst, _fake_download(calls))
    expected = ["hf/huggingface_hub-0.20.3-py3-none-any.whl", "hf/transformers-4.36.2-py3-none-any.whl",
                "xt/einops-0.8.2-py3-none-any.whl", "xt/einx-0.4.3-py3-none-any.whl",
                "xt/frozendict-2.5.1-py3-none-any.whl", "xt/torch_einops_utils-0.2.0-py3-none-any.whl",
                "xt/x_transformers-2.31.10-py3-none-any.whl"]
    assert out["files"] == expected and out["bytes"] == 7 * 1000
    assert out["failed"] == ["loguru==0.7.3: ERROR: No matching distribution found for loguru==0.7.3"]
    assert sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*.whl")) == expected
    assert len(calls) == 8
    calls.clear()
    assert peers.prepare_peers(dst, _fake_download(calls))["files"] == expected and calls == ["loguru==0.7.3"]
    from bench.peers import HF_VERSION

    assert f"transformers=={HF_VERSION}" in peers.HF.wheels  # the version `make bench` uses


def test_carry_total_names_each_part_and_holds_the_64_mib_limit():
    text, ok = data.carry_total({"data": 38 * MiB, ".gpu_deps": MiB, ".gpu_peers": 9 * MiB, "tree": 14 * MiB})
    assert ok and text == ("data 38.0 MiB, .gpu_deps 1.0 MiB, .gpu_peers 9.0 MiB, tree 14.0 MiB: 62.0 MiB to carry "
                           "(limit 64 MiB)")
    assert not data.carry_total({"data": 38 * MiB, ".gpu_peers": 26 * MiB + 1})[1]
    assert data.tree_bytes() > MiB  # this checkout's files


def test_carried_wheels_unpack_once_into_a_site(tmp_path):
    src, runs = tmp_path / "peers", tmp_path / "runs"
    assert peers.site(runs, peers.XT, src) is None  # nothing carried
    (src / "xt").mkdir(parents=True)
    with zipfile.ZipFile(src / "xt" / "einops-0.8.2-py3-none-any.whl", "w") as z:
        z.writestr("einops/__init__.py", "X = 1\n")
        z.writestr("einops-0.8.2.dist-info/METADATA", "Name: einops\nVersion: 0.8.2\n")
    target = peers.site(runs, peers.XT, src)
    assert target == runs / "peer_site" / "xt" and (target / "einops" / "__init__.py").read_text() == "X = 1\n"
    (target / "einops" / "__init__.py").write_text("changed")
    assert peers.site(runs, peers.XT, src) == target and (target / "einops" / "__init__.py").read_text() == "changed"


@needs_mirror
@pytest.mark.slow
def test_dry_run_of_phase_4_with_the_peers_reports_no_problem(tmp_path, monkeypatch):
    """Phase 4 with the peers on CPU at smoke sizes: each peer measured beside ours (a ratio row) or absent with its
    reason (HF needs a transformers 4.36.2: .gpu_peers, .venv-bench-hf), and no problem either way."""
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("HIGHWAY_DATA_OFFLINE", "1")
    monkeypatch.setattr(sys, "path", list(sys.path))
    out = tmp_path / "gpu_check"
    assert cli.main(["--dry-run", "--cases", "txl6,tlm3", "--skip", "nan,curve,ddp,tests,grouped,tables,compiled",
                     "--data", str(mirror()), "--out", str(out), "--runs", str(tmp_path / "runs")]) == 0
    md = out.with_suffix(".md").read_text()
    assert md.split("## Errors and skipped parts")[1].split("##")[0].strip() == "none", md
    assert "Ours beside the peers on the same device" in md
    with open(out.with_suffix(".csv")) as f:
        rows = [r for r in csv.DictReader(f) if r["section"] == "peers"]
    for peer in peers.PEERS:
        for precision in ("bf16", "fp32"):
            mine = {r["metric"]: r for r in rows if r["variant"] == peer.key and r["precision"] == precision}
            assert ("absent" in mine and mine["absent"]["note"]) or float(mine["ours_over_peer"]["value"]) > 0, mine
