"""`make gpu-check` (scripts/gpu_check.py, its parts in scripts/gpucheck/): its dry run on CPU takes the code path of
the GPU run (slow tests: about 30 s each); its pieces (run counts per paper table, the table-time formula, the cuDNN
RNN FLOP formula, the carried data subset, the fail-fast module check) against hand-computed facts."""

from __future__ import annotations

import csv
import math
import os
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, mirror, needs_mirror


sys.path.insert(0, str(REPO / "scripts"))  # the parts of scripts/gpu_check.py, as the script itself finds them
from gpucheck import cases, cli, common, compiled, cuda_tests, tables, throughput  # noqa: E402
from gpucheck.data import prepare_data  # noqa: E402
from gpucheck.phases import Ctx  # noqa: E402
from gpucheck.report import Report  # noqa: E402


def _rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def _value(rows, section, metric, case=None, variant=None, precision=None) -> str:
    hits = [r["value"] for r in rows if r["section"] == section and r["metric"] == metric
            and (case is None or r["case"] == case) and (variant is None or r["variant"] == variant)
            and (precision is None or r["precision"] == precision)]
    assert len(hits) == 1, (section, metric, case, variant, precision, hits)
    return hits[0]


@pytest.mark.slow
@needs_mirror
def test_dry_run_writes_every_section_of_the_report(tmp_path, monkeypatch):
    """The GPU run's code path on CPU at smoke sizes, as `make gpu-check DRY=1` runs it, in-process (torchrun is a
    subprocess); two speed cases here, a memory LM and an image net (the others differ by config), without the
    pytest-in-pytest phase, the table times and the peers (the tests below and test_gpu_check_peers.py cover them)."""
    # the script sets these for itself and its children: restored after the test
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("HIGHWAY_DATA_OFFLINE", "1")
    monkeypatch.setenv("HIGHWAY_DATA_MIRROR", str(mirror()))
    monkeypatch.setattr(sys, "path", list(sys.path))
    out = tmp_path / "report" / "gpu_check"
    assert cli.main(["--dry-run", "--cases", "txl6,mnist_conv", "--skip", "tests,tables,compiled,peers",
                    "--data", str(mirror()), "--out", str(out), "--runs", str(tmp_path / "runs")]) == 0
    md = out.with_suffix(".md").read_text()
    for heading in ("# GPU check (DRY RUN)", "## Targets", "Machine", "## 2. Data", "Matmul peak", "NaN policy",
                    "Training speed, MFU and memory", "Learning curve: enwik8 6 layers, 4 steps",
                    "torchrun --nproc_per_node=1 with gloo"):
        assert heading in md, heading
    assert md.split("## Errors and skipped parts")[1].split("##")[0].strip() == "none"
    assert "(incomplete" not in md

    rows = _rows(out.with_suffix(".csv"))
    assert set(rows[0]) == {"section", "case", "variant", "precision", "metric", "value", "unit", "note"}
    for case, variants in (("txl6", ("baseline", "sdu_tanh")), ("mnist_conv", ("plain", "highway"))):
        for variant in variants:
            for precision in ("bf16", "fp32"):
                get = lambda m: float(_value(rows, "throughput", m, case, variant, precision))  # noqa: E731
                assert get("step_s") > 0 and get("rate") > 0 and get("flops") > 0 and get("mfu") > 0
                assert math.isfinite(get("loss_last")) and get("params") > 0
    # the gated variants count more FLOPs and parameters than their baselines
    flops = {v: float(_value(rows, "throughput", "flops", "txl6", v, "bf16")) for v in ("baseline", "sdu_tanh")}
    assert flops["sdu_tanh"] > flops["baseline"]
    assert _value(rows, "nan", "status") == "diverged" and _value(rows, "nan", "step") == "12"
    assert _value(rows, "nan", "ckpt_step") == "10" and _value(rows, "nan", "deferred") == "True"
    assert _value(rows, "ddp", "backend") == "gloo" and _value(rows, "ddp", "resumed_step") == "4"
    assert float(_value(rows, "ddp", "max_rel_diff")) == 0.0  # CPU: the resumed run is exact
    for variant in ("baseline", "sdu_tanh"):
        assert math.isfinite(float(_value(rows, "curve", "val_bpc_step4", variant=variant)))
    met = {r["case"]: r["value"] for r in rows if r["section"] == "targets"}
    assert met["nan"] == "1" and met["ddp"] == "1" and met["finite"] == "1"
    curves = _rows(out.with_name("gpu_check_curves.csv"))
    assert {(c["variant"], c["split"]) for c in curves} == {
        (v, s) for v in ("baseline", "sdu_tanh") for s in ("train", "val", "official_val")}
    assert out.with_name("gpu_check_curves.png").stat().st_size > 10_000


def test_paper_plan_counts_the_runs_of_each_table():
    """Runs and steps per table at scale=paper (REFERENCE.md: 100 random-search runs per depth and kind in Fig. 1,
    5 runs per net in Tables 1-3, 40,000 steps for enwik8 6 layers; one seed (1111) per HT variant)."""
    plan = {p["table"]: p for p in tables.paper_plan()}
    assert (plan["hn_fig1"]["runs"], plan["hn_fig1"]["base_runs"],
            plan["hn_fig1"]["steps"]) == (4 * 3 * 100, 400, 60000)
    assert (plan["hn_table1"]["runs"], plan["hn_table1"]["steps"]) == (2 * 5, 180000)
    assert (plan["hn_cifar"]["runs"], plan["hn_cifar"]["base_runs"], plan["hn_cifar"]["steps"]) == (10, 5, 200000)
    assert (plan["hn_analysis"]["runs"], plan["hn_analysis"]["base_runs"]) == (1, 0)
    assert (plan["ht_enwik8_l6"]["runs"], plan["ht_enwik8_l6"]["base_runs"],
            plan["ht_enwik8_l6"]["steps"]) == (8, 1, 40000)
    assert plan["ht_enwik8_l6"]["eval_every"] == 400
    assert (plan["ht_enwik8_l12"]["runs"], plan["ht_enwik8_l12"]["steps"]) == (5, 400000)
    assert (plan["ht_char_ptb"]["runs"], plan["ht_word_ptb"]["runs"]) == (5, 3)
    assert {p["case"] for p in plan.values()} <= set(cases.CASE_BY_KEY)


def test_table_time_is_steps_times_step_time_plus_evaluation_passes():
    plan = {"runs": 3, "base_runs": 1, "steps": 100, "eval_every": 50, "eval_cap": None, "splits": ["val", "test"]}
    ev = {"batch_s": 0.01, "sizes": {"val": (10, 1000), "test": (20, 2000)}, "data_name": "ptb_word"}
    base, gated = {"step_s": 0.1, "eval": ev}, {"step_s": 0.2, "eval": ev}
    # per run: val at steps 50 and 100 (10 batches each) + one test pass (20 batches)
    assert tables.table_time(plan, base, gated) == pytest.approx(1 * (100 * 0.1 + 40 * 0.01)
                                                                 + 2 * (100 * 0.2 + 40 * 0.01))
    capped = {**plan, "eval_cap": 4}  # the evaluation at step 50 is capped, the final one is not
    assert tables.table_time(capped, base, None) == pytest.approx(3 * (100 * 0.1 + (4 + 10 + 20) * 0.01))
    prefix = {"batch_s": 0.01, "sizes": {"val": (10, 1000)}, "data_name": "enwik8_prefix"}
    one = {"runs": 1, "base_runs": 1, "steps": 10, "eval_every": 0, "eval_cap": None, "splits": ["val"]}
    # the enwik8 prefix's validation split scaled to the 5M bytes of the full corpus: 50,000 batches
    assert tables.table_time(one, {"step_s": 1.0, "eval": prefix}, None) == pytest.approx(10 + 50000 * 0.01)


def test_cudnn_rnn_flop_formula_counts_what_the_cpu_formula_counts():
    """2 * tokens * G * (in + hidden) per layer: LSTM G = 4H, GRU G = 3H; torch's counter lacks cuDNN RNNs."""
    from torch.utils.flop_counter import FlopCounterMode

    from highway_repro.engine.flops import cudnn_rnn_flops

    torch.manual_seed(0)
    lstm = torch.nn.LSTM(3, 5, num_layers=2, batch_first=True)
    x = torch.randn(2, 7, 3)
    weights = [p for p in lstm._flat_weights]  # per layer: w_ih, w_hh, b_ih, b_hh
    expected = 2 * 7 * 2 * 20 * (3 + 5) + 2 * 7 * 2 * 20 * (5 + 5)
    assert cudnn_rnn_flops(x.shape, weights, 4) == expected
    gru = torch.nn.GRU(3, 5, bias=False)
    assert cudnn_rnn_flops((7, 2, 3), list(gru._flat_weights), 2) == 2 * 14 * 15 * 8
    assert cudnn_rnn_flops((14, 3), list(gru._flat_weights), 2, batch_sizes=(2,) * 7) == 2 * 14 * 15 * 8  # packed
    assert throughput.register_flop_formulas() == "highway_repro.engine.flops"
    with FlopCounterMode(display=False) as counter:
        lstm(x)
    assert counter.get_total_flops() == expected  # the project's CPU formula agrees


@needs_mirror
def test_prepared_subset_is_data_the_data_layer_verifies(tmp_path, monkeypatch):
    """--prepare: the files the check reads as they are in a mirror, CIFAR-10 cut to its first images in a data
    cache with the `.sha256` records the data layer checks them against (the committed sums know no cut); only files
    that match the committed sums are copied or cut."""
    import dataclasses

    from highway_repro import data
    from highway_repro.data.vision import read_cifar_pickle

    full, dst, cache = mirror(), tmp_path / "gpu_mirror", tmp_path / "gpu_cache"
    prepare_data(full, dst, cache, n_train=50, n_test=20)
    sums = (dst / "SHA256SUMS").read_text().splitlines()
    assert sorted(x.split("  ./")[1] for x in sums) == sorted(cases.ENWIK8 + cases.PTB + cases.MNIST + cases.CIFAR[2:])
    assert sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*") if p.is_file()) == sorted(
        f"{rel}{suffix}" for rel in cases.CIFAR[:2] for suffix in ("", ".sha256"))
    monkeypatch.setenv("HIGHWAY_DATA_MIRROR", str(dst))
    monkeypatch.setenv("HIGHWAY_DATA_DIR", str(cache))
    monkeypatch.setenv("HIGHWAY_DATA_OFFLINE", "1")
    d = data.build("cifar10", allow_partial=True, batch_size=10, eval_batch_size=10, augment=False)
    assert d.num_examples("train") == 50 and d.num_examples("test") == 20
    src, labels = read_cifar_pickle(full / cases.CIFAR[0], b"labels")
    cut, cut_labels = read_cifar_pickle(cache / cases.CIFAR[0], b"labels")
    assert (cut == src[:50]).all() and (cut_labels == labels[:50]).all()
    assert data.build("enwik8_prefix", batch_size=4, seq_len=16).meta["vocab_size"] > 100  # checksum verified
    (dst / cases.ENWIK8[0]).write_bytes(b"x" * 100)  # a damaged file is refused by name
    with pytest.raises(data.ChecksumError, match="enwik8.prefix"):
        data.sources.fetch(cases.ENWIK8[0])
    cut_test = bytearray((cache / cases.CIFAR[1]).read_bytes())
    cut_test[1000] ^= 1  # one pixel
    (cache / cases.CIFAR[1]).write_bytes(bytes(cut_test))  # a changed cut is refused too
    with pytest.raises(data.ChecksumError, match=f"test_batch at {cache / cases.CIFAR[1]}: sha256 expected .* "
                                                 f"\\(recorded in {cache / cases.CIFAR[1]}.sha256\\)"):
        data.sources.fetch(cases.CIFAR[1])
    other = dataclasses.replace(data.sources.FILES[cases.CIFAR[0]], sha256="0" * 64)
    monkeypatch.setitem(data.sources.FILES, cases.CIFAR[0], other)  # the mirror's file is not the committed one
    with pytest.raises(data.ChecksumError, match=f"data_batch_1 at {full / cases.CIFAR[0]}: sha256 expected 0+ "):
        prepare_data(full, dst, cache, n_train=50, n_test=20)


def test_the_check_reads_the_prepared_cache_beside_the_prepared_mirror(tmp_path, monkeypatch):
    """With data/gpu_mirror as its mirror (the default), the check reads data/gpu_cache as its data cache."""
    found = {m: f"/site/{m}" for m in common.MODULES} | {"torch": None}
    monkeypatch.setattr(cli, "setup_paths", lambda: found)
    monkeypatch.setattr(cli, "GPU_MIRROR", tmp_path / "gpu_mirror")
    monkeypatch.setattr(cli, "GPU_CACHE", tmp_path / "gpu_cache")
    (tmp_path / "gpu_mirror").mkdir(), (tmp_path / "gpu_cache").mkdir()
    for name in ("HIGHWAY_DATA_MIRROR", "HIGHWAY_DATA_DIR"):  # restored after the test, whether set or not
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("HIGHWAY_DATA_OFFLINE", "1")
    assert cli.main(["--out", str(tmp_path / "gpu_check")]) == 2  # no torch: the report, then a stop
    assert os.environ["HIGHWAY_DATA_MIRROR"] == str(tmp_path / "gpu_mirror")
    assert os.environ["HIGHWAY_DATA_DIR"] == str(tmp_path / "gpu_cache")


def test_missing_torch_stops_at_once_with_a_report(tmp_path, monkeypatch):
    found = {m: f"/site/{m}" for m in common.MODULES} | {"torch": None}
    monkeypatch.setattr(cli, "setup_paths", lambda: found)
    monkeypatch.setenv("HIGHWAY_DATA_OFFLINE", "1")
    monkeypatch.delenv("HIGHWAY_DATA_MIRROR", raising=False)
    out = tmp_path / "gpu_check"
    assert cli.main(["--out", str(out), "--data", str(tmp_path)]) == 2
    md = out.with_suffix(".md").read_text()
    assert "missing: torch" in md and "--prepare" in md


def test_a_failed_measurement_keeps_the_compiler_s_own_lines(tmp_path):
    """An InductorError's first line names no cause: the report keeps the lines of the C++ compiler that say one."""
    from gpucheck.phases import phase

    args = cli.parse(["--dry-run", "--out", str(tmp_path / "gpu_check"), "--runs", str(tmp_path / "runs")])
    ctx = Ctx(args, Report(Path(args.out), True, "test"))

    def compile_fails(ctx_):
        raise RuntimeError("CppCompileError: C++ compile error\n\nCommand:\ng++ /tmp/x.cpp -o x.so\n\nOutput:\n"
                           "/tmp/x.cpp:12:5: error: 'Vectorized' was not declared in this scope\nnote: something")

    assert phase(ctx, "compiled x default bf16", 0.0, compile_fails) is None
    (where, msg), = ctx.rep.problems
    assert where == "compiled x default bf16" and msg.startswith("RuntimeError: CppCompileError: C++ compile error")
    assert "/tmp/x.cpp:12:5: error: 'Vectorized' was not declared in this scope" in msg and "note" not in msg


def test_cuda_tests_phase_reads_the_junit_report(tmp_path, monkeypatch):
    """The `pytest -m cuda` phase: its command, and the counts and names it reads from pytest's JUnit XML."""
    args = cli.parse(["--dry-run", "--out", str(tmp_path / "gpu_check"), "--runs", str(tmp_path / "runs")])
    ctx = Ctx(args, Report(Path(args.out), True, "test"))
    ctx.dry = False  # judge the counts as on the GPU
    seen = []

    def fake_child(ctx_, cmd, timeout):
        seen.append(cmd)
        xml = next(c.split("=", 1)[1] for c in cmd if c.startswith("--junitxml="))
        Path(xml).write_text(
            '<testsuites><testsuite name="pytest" tests="3">'
            '<testcase classname="tests.test_cuda" name="test_a" />'
            '<testcase classname="tests.test_cuda" name="test_b">'
            '<failure message="assert 1 == 2">x</failure></testcase>'
            '<testcase classname="tests.test_cuda" name="test_c"><skipped message="needs a CUDA GPU" /></testcase>'
            '</testsuite></testsuites>')
        return 1, "1 failed, 1 passed, 1 skipped"

    monkeypatch.setattr(cuda_tests, "run_child", fake_child)
    counts = cuda_tests.cuda_tests(ctx)
    assert seen[0][1:5] == ["-m", "pytest", "-m", "cuda"] and "tests/test_cuda.py" in seen[0]
    assert counts == {"tests": 3, "failures": 1, "errors": 0, "skipped": 1}
    title, lines = ctx.rep.sections["tests"]
    assert "1 passed, 1 failed, 0 errors, 1 skipped of 3" in lines[0]
    assert any("test_b" in x and "assert 1 == 2" in x for x in lines)
    assert [t for t in ctx.rep.targets if t[0] == "tests"][0][4].startswith("**NOT met**")


def test_table_times_section_uses_the_measured_step_times(tmp_path):
    """Section 8 from measured cases: enwik8 6 layers = 1 baseline run + 7 gated runs of 40,000 steps."""
    args = cli.parse(["--dry-run", "--out", str(tmp_path / "gpu_check"), "--runs", str(tmp_path / "runs")])
    ctx = Ctx(args, Report(Path(args.out), True, "test"))
    no_eval = {"batch_s": 0.0, "sizes": {"val": (1, 1), "test": (1, 1)}, "data_name": "enwik8_prefix"}
    for variant, step_s in (("baseline", 0.1), ("sdu_tanh", 0.2)):
        ctx.results[("txl6", variant, "bf16")] = {"step_s": step_s, "eval": no_eval, "mem": 3 * 2 ** 30}
    tables.tables_section(ctx)
    rows = {(r[1], r[3], r[4]): r[5] for r in ctx.rep.rows if r[0] == "tables"}
    assert rows[("ht_enwik8_l6", "bf16", "table_s")] == pytest.approx(40000 * (0.1 + 7 * 0.2))
    assert ("ht_enwik8_l6", "fp32", "table_s") not in rows and rows[("hn_fig1", "", "runs")] == 1200
    line = next(x for x in ctx.rep.sections["tables"][1] if "reproduce-ht-enwik8-l6" in x)
    assert "16.7 h" in line and "3.2 GB" in line


@pytest.mark.slow
@needs_mirror
def test_dry_run_of_every_case_and_variant_reports_no_problem(tmp_path, monkeypatch):
    """Every speed case of the GPU run (each model, its baseline and gated variant, bf16 and fp32) composes, builds
    and steps in the dry run with no problem: a renamed variant or a broken config fails here, not minutes into
    a GPU lease. The phases the test above covers are skipped."""
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("HIGHWAY_DATA_OFFLINE", "1")
    monkeypatch.setattr(sys, "path", list(sys.path))
    out = tmp_path / "gpu_check"
    cli.main(["--dry-run", "--skip", "peak,nan,peers,curve,ddp,tests,tables,compiled", "--data", str(mirror()),
             "--out", str(out), "--runs", str(tmp_path / "runs")])
    md = out.with_suffix(".md").read_text()
    problems = md.split("## Errors and skipped parts")[1].split("##")[0].strip()
    jobs = {(case.key, variant, precision) for case, variant, _, precision in throughput.throughput_jobs("ABC")}
    # a CPU without bf16 instructions cannot run oneDNN's bf16 LSTM: then those cases, and only they, are problems
    no_bf16 = set() if cases.cpu_bf16_features() else {(c.key, v, "bf16") for c in cases.CASES if c.bf16_lstm
                                                    for v, _ in c.variants}
    found = set() if problems == "none" else {line[2:].split(": ")[0] for line in problems.splitlines()}
    assert found == {f"throughput {k} {v} {p}" for k, v, p in no_bf16}, problems
    rows = _rows(out.with_suffix(".csv"))
    measured = {(r["case"], r["variant"], r["precision"]) for r in rows
                if r["section"] == "throughput" and r["metric"] == "step_s"}
    assert measured == jobs - no_bf16


def test_every_variant_the_check_names_has_a_config():
    names = {variant for case in cases.CASES for variant, _ in case.variants} - {"plain", "highway"}
    assert names <= cases.VARIANTS and "sdu_tanh" in names
    with pytest.raises(ValueError, match="variant='tanh_all'"):
        cases.variant("tanh_all")


def _result(step_s: float, loss: float) -> dict:
    return {"step_s": step_s, "rate": 1000 / step_s, "unit": "tokens", "mfu": 0.1, "mem": 2 ** 30, "loss_last": loss}


def _compiled_section(tmp_path, case: str, runs: dict) -> tuple[str, dict]:
    """Phase `compiled`'s section from bf16 results of `case` (variant -> (step s, last loss)): (its Markdown,
    {CSV metric: value} of its rows)."""
    args = cli.parse(["--dry-run", "--out", str(tmp_path / "gpu_check"), "--runs", str(tmp_path / "runs")])
    ctx = Ctx(args, Report(Path(args.out), True, "test"))
    ctx.results = {(case, variant, "bf16"): _result(*r) for variant, r in runs.items()}
    compiled.compiled_section(ctx)
    return "\n".join(ctx.rep.sections["compiled"][1]), {r[4]: float(r[5]) for r in ctx.rep.rows if r[0] == "compiled"}


def test_compiled_section_compares_each_mode_with_eager(tmp_path):
    """The table of phase `compiled`: each mode's step time against the eager run of the same case and precision
    (speedup = eager step / this step), the last loss against eager's; a mode not measured is left out."""
    body, speedups = _compiled_section(tmp_path, "tlm3", {"baseline": (0.030, 1.500),
                                                          "baseline+compile-default": (0.020, 1.501),
                                                          "baseline+compile-reduce-overhead": (0.012, 1.499)})
    assert "| Transformer-L3, char-PTB | bf16 | default | 20.0 | 50,000 tokens/s | 1.50 |" in body
    assert "| reduce-overhead | 12.0 | 83,333 tokens/s | 2.50 |" in body and "| +1.00e-03 |" in body
    assert "fp32" not in body.split("|---|")[-1]  # no fp32 run measured: no fp32 row
    assert speedups == {"speedup_default": pytest.approx(1.5), "speedup_reduce-overhead": pytest.approx(2.5)}


def test_compiled_phase_times_flex_attention_beside_the_core_on_a_gpu(tmp_path):
    """Transformer-XL's flex run comes after its own modes, on a GPU only (torch's FlexAttention has no CPU
    backward); its row names it and its step time is set against the core's, both compiled alike."""
    assert compiled.runs_of("txl6", compiled.MODES, dry=False)[-1] == ("default", True)
    assert all(not flex for _, flex in compiled.runs_of("txl6", compiled.MODES, dry=True))
    assert all(not flex for _, flex in compiled.runs_of("tlm3", compiled.MODES, dry=False))  # no relative attention
    body, ratios = _compiled_section(tmp_path, "txl6", {"baseline": (0.030, 1.500),
                                                        "baseline+compile-default": (0.020, 1.501),
                                                        "baseline+flex+compile-default": (0.016, 1.502)})
    assert "| bf16 | default, flex attention | 16.0 | 62,500 tokens/s | 1.88 |" in body
    assert ratios["flex_vs_core_default"] == pytest.approx(1.25) and "speedup_default_flex" in ratios


@needs_mirror
@pytest.mark.slow
def test_dry_run_of_the_compiled_phase_reports_no_problem(tmp_path, monkeypatch):
    """Phase `compiled` on CPU at smoke sizes (inductor compiles for the CPU, about a minute a model here): every mode
    and precision of the Transformer-L3 baseline trains with no problem and a finite, falling loss."""
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("HIGHWAY_DATA_OFFLINE", "1")
    monkeypatch.setattr(sys, "path", list(sys.path))
    out = tmp_path / "gpu_check"
    assert cli.main(["--dry-run", "--cases", "tlm3", "--skip", "peak,nan,throughput,peers,curve,ddp,tests,grouped,"
                                                               "tables",
                     "--data", str(mirror()), "--out", str(out), "--runs", str(tmp_path / "runs")]) == 0
    md = out.with_suffix(".md").read_text()
    assert md.split("## Errors and skipped parts")[1].split("##")[0].strip() == "none", md
    assert "The compiled step: eager vs inductor vs CUDA graphs" in md
    rows = _rows(out.with_suffix(".csv"))
    for mode in compiled.MODES:
        for precision in compiled.PRECISIONS:
            name = cases.label("baseline", mode)
            assert float(_value(rows, "throughput", "step_s", "tlm3", name, precision)) > 0
            assert _value(rows, "throughput", "finite", "tlm3", name, precision) == "True"
