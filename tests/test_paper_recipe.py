"""scripts/paper_recipe.py: the char-PTB table at the paper's full recipe on one GPU. Its plan (each run priced from
the step times a GPU measured, refused where it cannot fit one command), the guard's projection, the pack that comes
back from the GPU machine, and (slow) its dry run on CPU through the runner."""

from __future__ import annotations

import importlib.util
import io
import json
import random
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from conftest import needs_mirror

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("paper_recipe", REPO / "scripts" / "paper_recipe.py")
pr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pr)

TF32 = {"precision": "fp32", "tf32": True, "max_steps": 99600}
HEADER = "section,case,variant,precision,metric,value,unit,note\n"


def _measured(tmp_path: Path, compiled: str = "") -> dict:
    (tmp_path / "gpu_check.csv").write_text(
        HEADER + "machine,,,,GPU,NVIDIA H200,,\n"
        "throughput,tlm3,baseline,fp32,step_s,0.008,s,\nthroughput,tlm3,sdu_tanh,fp32,step_s,0.0142,s,\n"
        "throughput,tlm3,baseline,bf16,step_s,0.0094,s,\nthroughput,txl6,baseline,fp32,step_s,0.03,s,\n")
    if compiled:
        (tmp_path / "gpu_check_compiled.csv").write_text(HEADER + compiled)
    return pr.read_measured(tmp_path)


def test_plan_prices_each_run_from_the_measured_step_time(tmp_path):
    p = pr.plan(["baseline", "sdu_sigmoid"], 2, TF32, _measured(tmp_path), False, 540)
    assert p["precision"] == "TF32 matrix products, fp32 weights and sums" and p["compile"] == "reduce-overhead"
    base, sig = p["runs"]
    assert base["train_s"] == pytest.approx(99600 * 0.008) and base["fits"] is False  # 13.3 min eager
    assert sig["train_s"] == pytest.approx(99600 * 0.0142) and "sdu_tanh" in sig["how"]  # the same gate's time
    assert "NVIDIA H200" in base["how"]
    # a measured compiled speed-up (the fastest mode) prices every row: 0.008 / 0.004 = 2x
    compiled = ("throughput,tlm3,baseline+compile-default,fp32,step_s,0.004,s,\n"
                "throughput,tlm3,baseline+compile-reduce-overhead,fp32,step_s,0.005,s,\n")
    p = pr.plan(["baseline"], 1, TF32, _measured(tmp_path, compiled), False, 540)
    assert p["compile"] == "default" and p["runs"][0]["train_s"] == pytest.approx(398.4) and p["runs"][0]["fits"]
    # measured not to fit (sdu_tanh at 0.0142 / 2 a step: 11.8 min): refused, unless forced
    with pytest.raises(pr.PlanError, match=r"^--rows sdu_tanh: 11.8 min of training .* than the budget of 9 min"):
        pr.plan(["sdu_tanh"], 1, TF32, _measured(tmp_path, compiled), False, 540)
    assert pr.plan(["sdu_tanh"], 1, TF32, _measured(tmp_path, compiled), False, 540, force=True)["runs"][0]["fits"] \
        is False
    bf16 = pr.plan(["baseline"], 1, {**TF32, "precision": "bf16"}, _measured(tmp_path), False, 540)
    assert bf16["runs"][0]["train_s"] == pytest.approx(99600 * 0.0094)  # the bf16 row, not the TF32 one


def test_plan_refuses_unknown_rows_and_runs_one_after_another(tmp_path):
    m = _measured(tmp_path)
    with pytest.raises(pr.PlanError, match=r"^--rows tanh: not a row of this table \(valid: baseline, sdu_tanh"):
        pr.plan(["tanh"], 1, TF32, m, False, 540)
    with pytest.raises(pr.PlanError, match="2 runs one after another do not fit one command"):
        pr.plan(["baseline", "sdu_tanh"], 1, TF32, m, False, 540)
    assert len(pr.plan(["baseline", "sdu_tanh"], 1, TF32, m, True, 540)["runs"]) == 2  # a dry run may queue them


def test_precision_statement_and_its_comparison_grid():
    assert pr.compare_grid(TF32) == ["trainer.tf32=true,false"]
    assert pr.compare_grid({"precision": "bf16"}) == ["trainer.precision=bf16,fp32", "trainer.tf32=false"]
    assert pr.compare_grid({"precision": "fp32", "tf32": False}) == [] and pr.precision_of({}) == "full fp32"


def test_guard_projects_the_end_from_the_logged_speed(tmp_path):
    # 300 steps in 30 s: 10 steps a second, 600 left -> 60 s more, then the final evaluation
    assert pr.projected_end((10.0, 100), (40.0, 400), 1000) == pytest.approx(40 + 60 + pr.FINAL_EVAL_S)
    assert pr.projected_end((10.0, 100), (40.0, 100), 1000) is None  # not moving: no projection
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 0, "model/params": 5}\n{"step": 100, "train/loss": 3.1}\n{"step": 996, "val/bpc": 2}\n'
                   '{"step": 200, "train/lo')  # the last line is being written
    assert pr.logged_step(log) == 100 and pr.logged_step(tmp_path / "none.jsonl") is None


def test_guard_stops_a_run_projected_past_the_budget(tmp_path):
    """A fake run logging 100 steps every 0.05 s (2,000 steps a second) of 10,000,000: projected far past a 3 s
    budget once it has logged for 0.4 s, so the guard stops it then, long before the budget."""
    run = tmp_path / "sweep" / "job"
    run.mkdir(parents=True)
    writer = ("import json, time\nfor i in range(1, 10**6):\n    with open('metrics.jsonl', 'a') as f:\n"
              "        f.write(json.dumps({'step': 100 * i, 'train/loss': 1.0}) + '\\n')\n    time.sleep(0.05)\n")
    proc = subprocess.Popen([sys.executable, "-c", writer], cwd=run, start_new_session=True)
    t0 = time.monotonic()
    events = pr.guard(proc, tmp_path / "sweep", ["job"], 10_000_000, budget_s=3.0, probe_s=0.4, t0=t0, poll_s=0.05)
    assert proc.poll() is not None and time.monotonic() - t0 < 2.5
    projected, stopped = events
    assert stopped["what"] == "stopped" and "job projected to end at" in stopped["why"]
    assert projected["step_s"] == pytest.approx(0.0005, rel=0.3) and projected["end_s"] > 3000


def test_pack_leaves_checkpoints_out_splits_and_unpacks_only_results(tmp_path):
    src = tmp_path / "gpu"
    files = {"results/t/runs/x/metrics.json": b"{}", "results/t/runs/x/ckpt/last.pt": b"w" * 100,
             "results/t/log.jsonl": random.Random(0).randbytes(10_000)}  # gzip cannot shrink it
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    parts = pr.pack(src, list(files), tmp_path / "out", max_bytes=4096)
    assert len(parts) > 1 and all(p.stat().st_size <= 4096 for p in parts)
    written = pr.unpack(tmp_path / "out", tmp_path / "here")
    assert sorted(written) == ["results/t/log.jsonl", "results/t/runs/x/metrics.json"]
    assert (tmp_path / "here/results/t/log.jsonl").read_bytes() == files["results/t/log.jsonl"]
    with pytest.raises(ValueError, match="more than 8 files"):
        pr.pack(src, list(files), tmp_path / "out2", max_bytes=64)
    bad = io.BytesIO()
    with tarfile.open(fileobj=bad, mode="w:gz") as tar:
        for name in ("results/ok.json", "results/../../evil"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"{}"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / pr.PACK).write_bytes(bad.getvalue())
    with pytest.raises(pr.PlanError, match="'results/../../evil' is not a plain file under results/"):
        pr.unpack(tmp_path / "bad", tmp_path / "there")
    assert not (tmp_path / "there").exists()  # nothing written


@needs_mirror
@pytest.mark.slow
def test_dry_run_trains_keeps_packs_and_unpacks(tmp_path):
    """compare and run on CPU at the smoke scale through the runner (4 steps a run), then unpack: the kept runs,
    the comparison and the log come back, no checkpoint, at most 8 files."""
    root = tmp_path / "root"
    assert pr.main(["compare", "--dry-run", "--root", str(root), "--out", str(tmp_path / "c")]) == 0
    assert pr.main(["run", "--rows", "baseline,sdu_tanh", "--dry-run", "--root", str(root),
                    "--out", str(tmp_path / "r")]) == 0
    compared = pr.unpack(tmp_path / "c", tmp_path / "here")
    written = pr.unpack(tmp_path / "r", tmp_path / "here")
    assert len(list((tmp_path / "r").iterdir())) <= pr.MAX_FILES and not any("ckpt" in w for w in compared + written)
    kept = sorted({Path(w).parent.name for w in written if w.endswith("/metrics.json")})
    assert kept == ["seed=0,variant=baseline", "seed=0,variant=sdu_tanh"], written
    for w in written:
        if w.endswith("/metrics.json"):
            m = json.loads((tmp_path / "here" / w).read_text())
            assert m["status"] == "done" and m["step"] == pr.DRY_STEPS
    log = [json.loads(line) for line in (tmp_path / "here" / pr.LOG).read_text().splitlines()]
    assert [r["part"] for r in log] == ["compare", "run"] and log[1]["runner_exit"] == 0
    assert log[0]["precision"].startswith("TF32")  # the paper recipe's precision, stated in its scale file
    md = (tmp_path / "here" / pr.OUT_DIR / "char_ptb_l3_smoke_precision.md").read_text()
    assert md.count("| the same |") + md.count("| DIFFERENT |") == 2, md  # both rows compared (CPU: TF32 a no-op)
    assert sum("_precision_runs/" in w and w.endswith("/metrics.json") for w in compared) == 4
