"""End to end: smoke runs, resume equality, W&B offline, reports on a tiny sweep."""

from __future__ import annotations

import csv
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, compose, needs_mirror
from highway_repro import report
from highway_repro.train import run

VOLATILE = ("perf/", "time/")


def _stable(d: dict) -> dict:
    return {k: v for k, v in d.items() if not k.startswith(VOLATILE)}


def _history(out: Path) -> list[dict]:
    return [_stable(json.loads(x)) for x in (out / "metrics.jsonl").read_text().splitlines()]


class Crash(RuntimeError):
    pass


def _run_with_crash(cfg, out: Path, crash_at: int, monkeypatch):
    """Run, dying with an exception when the data is asked for step `crash_at` (a crash mid-run)."""
    from highway_repro.engine.trainer import Trainer

    original = Trainer._forward

    def dying(self, batch, mems, score_len):
        if self.model.training and self.step == crash_at:
            raise Crash(f"simulated crash at step {crash_at}")
        return original(self, batch, mems, score_len)

    monkeypatch.setattr(Trainer, "_forward", dying)
    with pytest.raises(Crash):
        run(cfg, out)
    monkeypatch.setattr(Trainer, "_forward", original)


RESUME_CASES = {
    "image": ["experiment=demo", "scale=smoke", "model.depth=3", "trainer.max_steps=8", "trainer.checkpoint_every=3",
              "trainer.eval_every=4", "trainer.log_every=2"],
    "lm_memory": ["model=transformer_xl", "data=enwik8_prefix", "optim=adam", "scale=smoke", "model.n_layers=2",
                  "model.d_model=16", "model.n_heads=2", "model.d_head=8", "model.d_ff=32", "model.tgt_len=8",
                  "model.mem_len=8", "model.eval_tgt_len=8", "model.eval_mem_len=8", "data.seq_len=8",
                  "data.batch_size=2", "data.eval_batch_size=2", "+data.train_limit_tokens=2000",
                  "trainer.max_steps=8", "trainer.checkpoint_every=3", "trainer.eval_every=4", "trainer.log_every=2",
                  "trainer.grad_clip=0.25"],
}


@needs_mirror
@pytest.mark.parametrize("case", sorted(RESUME_CASES))
def test_resume_after_crash_equals_uninterrupted(case, tmp_path, monkeypatch):
    overrides = RESUME_CASES[case] + ["deterministic=true", "logger=jsonl"]
    cfg = compose(overrides)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    full = run(cfg, a)
    assert full["status"] == "done"
    _run_with_crash(cfg, b, crash_at=7, monkeypatch=monkeypatch)  # last checkpoint at step 6
    assert not (b / "metrics.json").exists()
    resumed = run(compose(overrides + ["resume=auto"]), b)
    assert _stable(resumed) == _stable(full)
    assert _history(b) == _history(a)


@needs_mirror
def test_wall_and_cpu_time_are_carried_across_a_resume(tmp_path, monkeypatch):
    """time/wall_s and time/cpu_s count the training of every process of a run: a resumed run adds its own time to
    what the checkpoint holds (set to 1000 s each here)."""
    import torch

    from highway_repro.engine import checkpoint as ckpt_lib

    overrides = RESUME_CASES["image"] + ["logger=jsonl"]
    _run_with_crash(compose(overrides), tmp_path, crash_at=7, monkeypatch=monkeypatch)
    last = tmp_path / "ckpt" / "last.pt"
    ckpt = ckpt_lib.load(last)
    assert ckpt["step"] == 6 and ckpt["extra"]["wall_time"] > 0 and ckpt["extra"]["cpu_time"] >= 0
    ckpt["extra"].update(wall_time=1000.0, cpu_time=1000.0)
    torch.save(ckpt, last)
    final = run(compose(overrides + ["resume=auto"]), tmp_path)
    assert 1000 <= final["time/wall_s"] < 1600 and 1000 <= final["time/cpu_s"] < 1600, final


@needs_mirror
@pytest.mark.cuda
def test_cuda_run_logs_mfu_against_the_gpu_datasheet_peak(tmp_path):
    import torch

    from highway_repro.engine.flops import peak_flops

    peak = peak_flops(torch.device("cuda"), "fp32")
    if peak is None:
        pytest.skip(f"no datasheet peak for {torch.cuda.get_device_name()} (engine/flops.py PEAK_FLOPS)")
    out = run(compose(["experiment=demo", "scale=smoke", "trainer.device=cuda", "logger=jsonl"]), tmp_path)
    assert out["status"] == "done"
    logged = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines() if '"train/loss"' in x]
    assert logged
    for x in logged:
        assert 0 < x["perf/mfu"] < 1 and x["perf/mfu"] == pytest.approx(x["perf/flops_per_s"] / peak)


@needs_mirror
def test_smoke_run_writes_metrics_and_config(tmp_path):
    out = run(compose(["experiment=demo", "scale=smoke"]), tmp_path)
    assert out["status"] == "done" and 0 <= out["test/acc"] <= 1
    final = json.loads((tmp_path / "metrics.json").read_text())
    assert final["model/params"] == 85_660  # 784*71+71 + 9*2*(50*50+50)... see test_highway for the arithmetic
    hist = _history(tmp_path)
    assert hist[0]["model/params"] == 85_660
    assert any("train/loss" in h for h in hist)
    assert (tmp_path / "config_resolved.yaml").exists() and (tmp_path / "ckpt" / "last.pt").exists()
    # CPU time per training step, per log interval: summed over the intervals it is the CPU time of the training
    # steps, part of the run's CPU time (which adds start-up of the loop, evaluations and saves)
    logs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines() if '"train/loss"' in x]
    steps = [b["step"] - a for a, b in zip([0] + [h["step"] for h in logs], logs)]
    spent = sum(h["perf/cpu_s_per_step"] * n for h, n in zip(logs, steps))
    assert all(h["perf/cpu_s_per_step"] > 0 for h in logs) and 0 < spent <= final["time/cpu_s"]


@needs_mirror
def test_resume_auto_refuses_a_run_folder_of_another_recipe(tmp_path):
    """A finished run is reused by resume=auto only under the same recipe: speed and logging keys may differ, a
    changed max_steps is a one-line error naming the key (exit 2) that leaves the folder's metrics as they were."""
    from highway_repro.train.config import ConfigError
    from highway_repro.train import run_job
    from highway_repro.train.recipe import check_same_recipe

    base = ["experiment=demo", "scale=smoke", "resume=auto"]
    run(compose(base), tmp_path)
    check_same_recipe(compose(base + ["threads=2", "trainer.log_every=7", "trainer.checkpoint_every=5"]), tmp_path)
    steps = compose(base).trainer.max_steps
    with pytest.raises(ConfigError, match=rf"trainer.max_steps: {steps} there, {steps + 1} here"):
        check_same_recipe(compose(base + [f"trainer.max_steps={steps + 1}"]), tmp_path)
    before = (tmp_path / "metrics.json").read_bytes()
    with pytest.raises(SystemExit) as e:
        run_job(compose(base + [f"trainer.max_steps={steps + 1}"]), tmp_path, False, run)
    assert e.value.code == 2 and (tmp_path / "metrics.json").read_bytes() == before
    check_same_recipe(compose(["experiment=demo", "scale=smoke", f"trainer.max_steps={steps + 1}"]),
                      tmp_path)  # resume=null


def test_recipe_diff_skips_new_options_and_the_matched_width():
    from highway_repro.train.recipe import recipe_diff

    there = {"seed": 0, "model": {"d_ff": 769, "d_model": 128}, "trainer": {"max_steps": 10, "progress": True}}
    here = {"seed": 0, "model": {"d_ff": 512, "d_model": 128}, "trainer": {"max_steps": 10, "progress": False,
                                                                            "memory_format": "contiguous"}}
    assert recipe_diff(there, here) == ["model.d_ff: 769 there, 512 here"]
    assert recipe_diff(there, {**here, "match_params": "sdu_tanh"}) == []
    assert recipe_diff(there, {**here, "seed": 1}) == ["model.d_ff: 769 there, 512 here", "seed: 0 there, 1 here"]


@needs_mirror
def test_wandb_offline_run_contains_the_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = compose(["experiment=demo", "scale=smoke", "logger=wandb", "logger.name=smoke-run", "logger.group=tests"])
    out = run(cfg, tmp_path)
    files = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    for _ in range(100):  # W&B's service may still be writing the file when finish() returns (seen under load)
        blob = files[0].read_bytes()
        if b"test/acc" in blob:
            break
        time.sleep(0.1)
    for key in ("train/loss", "test/acc", "model/params", "smoke-run", "tests"):
        assert key.encode() in blob, key
    assert json.dumps(out["test/acc"]).encode() in blob


@needs_mirror
def test_a_resumed_run_logs_into_its_wandb_run(tmp_path, monkeypatch):
    """resume=auto continues the W&B run its checkpoint names (the offline run folders end in the run id)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = compose(["experiment=demo", "scale=smoke", "logger=wandb", "logger.name=resumed", "resume=auto"])
    run(cfg, tmp_path)
    from highway_repro.engine import checkpoint as ckpt_lib

    reads = []
    load_latest = ckpt_lib.load_latest
    monkeypatch.setattr(ckpt_lib, "load_latest", lambda *a, **k: reads.append(a) or load_latest(*a, **k))
    run(cfg, tmp_path)  # from its last checkpoint: only the final evaluation again
    assert len(reads) == 1  # one read serves the W&B run id and the trainer's state
    # offline-run-<date>_<time>-<id>, with "-1" appended when both start in the same second
    ids = {p.name.split("-")[3] for p in (tmp_path / "wandb").glob("offline-run-*")}
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == 2 and len(ids) == 1


@needs_mirror
@pytest.mark.slow  # the same pipeline is covered for every Highway Networks target in test_hn_pipelines.py
def test_reproduce_smoke_sweep_and_report(tmp_path):
    r = subprocess.run([sys.executable, "-m", "highway_repro.runner", "demo", "--scale", "smoke",
                        "--runs", str(tmp_path / "runs"), "--results", str(tmp_path / "results")],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    md = (tmp_path / "results" / "demo" / "demo.md").read_text()
    for depth, kind in ((10, "plain"), (10, "highway"), (50, "plain"), (50, "highway")):
        assert f"| {depth} | {kind} |" in md
    assert "- command: `make demo`" in md and "wall time" in md
    assert (tmp_path / "results" / "demo" / "demo.png").stat().st_size > 1000
    csv = (tmp_path / "results" / "demo" / "demo.csv").read_text().splitlines()
    assert len(csv) == 5


def _fake_job(root: Path, name: str, overrides: list[str], final: dict, history=()):
    job = root / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if final is not None:
        (job / "metrics.json").write_text(json.dumps(final))
    (job / "metrics.jsonl").write_text("".join(json.dumps(h) + "\n" for h in history))


def test_report_mean_std_and_failed_cells(tmp_path, capsys):
    for i, (kind, seed, loss) in enumerate([("a", 0, 1.0), ("a", 1, 3.0), ("b", 0, 2.0)]):
        _fake_job(tmp_path, f"j{i}", [f"model.kind={kind}", f"seed={seed}"], {"status": "done", "val/loss": loss},
                  [{"step": 1, "val/loss": loss + 1}, {"step": 2, "val/loss": loss}])
    _fake_job(tmp_path, "j3", ["model.kind=c", "seed=0"], {"status": "failed", "error": "ValueError: boom"})
    _fake_job(tmp_path, "j4", ["model.kind=d", "seed=0"], None)
    out = tmp_path / "out" / "t"
    assert report.main([str(tmp_path), "--group-by", "model.kind", "--metrics", "val/loss", "--curve", "val/loss",
                        "--out", str(out)]) == 0
    md = out.with_suffix(".md").read_text()
    assert "| a | 2 | 2.0000 ± 1.4142 |" in md and "| b | 1 | 2.0000 |" in md  # std of (1, 3): sqrt 2
    assert "| c | 0 (1 failed) | failed: j3: ValueError: boom |" in md and "no metrics.json" in md
    rows = {r["model.kind"]: r for r in csv.DictReader(out.with_suffix(".csv").read_text().splitlines())}
    assert (rows["a"]["n"], float(rows["a"]["val/loss_mean"]), float(rows["a"]["val/loss_std"])) == (
        "2", 2.0, pytest.approx(2 ** 0.5))
    assert rows["c"]["n"] == "0" and "ValueError: boom" in rows["c"]["failed"]
    assert out.with_suffix(".png").exists()
    # a misspelt key is an error naming it, not a table of dashes or one pooled row
    for flag, value, says in (("--group-by", "model.knd", "--group-by model.knd: no run has this config key"),
                              ("--metrics", "val/los", "--metrics val/los: no run's metrics.json has it (valid: "
                                                       "val/loss)"),
                              ("--curve", "val/los", "--curve val/los: no run's metrics.jsonl has it")):
        args = [str(tmp_path), "--group-by", "model.kind", "--metrics", "val/loss", flag, value]
        with pytest.raises(SystemExit) as e:
            report.main(args)
        assert e.value.code == 2 and says in capsys.readouterr().err


@needs_mirror
def test_bf16_autocast_is_on_and_best_checkpoint_eval_runs(tmp_path):
    """trainer.precision=bf16 trains under autocast: the same run in fp32 ends with a close but different loss.
    (Which weights final_eval=best reloads: test_engine.py::test_best_checkpoint_is_chosen_on_the_evaluation_...)"""
    over = ["experiment=demo", "scale=smoke", "data.val_size=200", "trainer.final_eval=best",
            "trainer.splits=[val,test]"]
    (tmp_path / "bf16").mkdir()
    (tmp_path / "fp32").mkdir()
    bf16 = run(compose(over + ["trainer.precision=bf16"]), tmp_path / "bf16")
    fp32 = run(compose(over), tmp_path / "fp32")
    assert bf16["status"] == fp32["status"] == "done" and (tmp_path / "bf16" / "ckpt" / "best.pt").exists()
    assert bf16["test/loss"] != fp32["test/loss"] and bf16["test/loss"] == pytest.approx(fp32["test/loss"], rel=0.05)


_FAULTS = """
import ctypes, resource, torch
from highway_repro.runtime import keep_freed_memory

def faults_per_step():  # two 10 MB tensors and their sum, freed each step: the pattern of a training step
    def step():
        a = torch.ones(2_500_000); b = torch.ones(2_500_000); return (a + b).sum()
    for _ in range(3):  # the heap grows to the step's size (up to 3 steps)
        step()
    counts = []
    for _ in range(9):  # the median step: a one-time growth of the heap in one step is not the step's pattern
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        step()
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    return sorted(counts)[4]

mallopt = ctypes.CDLL(None).mallopt
mallopt(-3, 128 * 1024)  # glibc's starting mmap threshold, fixed: every large tensor is a fresh mmap
before = faults_per_step()
print(keep_freed_memory(), before, faults_per_step())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_keep_freed_memory_stops_the_page_faults_of_large_tensors():
    """keep_freed_memory (called by every run) keeps freed tensors' memory in the process: with glibc's mmap
    threshold at its start value, each step of two 10 MB tensors faults in ~7,300 fresh pages; after, none (the
    median of 9 steps: the heap sometimes grows once more, ~4,900 pages in one step, which a mean over 5 steps read
    as ~1,000 a step)."""
    out = subprocess.run([sys.executable, "-c", _FAULTS], capture_output=True, text=True, check=True, cwd=REPO)
    ok, before, after = out.stdout.split()
    assert ok == "True"
    assert float(before) > 5000  # 3 x 10 MB / 4 KiB pages
    assert float(after) < 50
