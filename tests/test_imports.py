"""What the code says of itself and how it loads: no tracker numbers or dates in the code, configs, docs and
README; the runner, the reports and the GPU check start without torch or the statistics libraries; a training run
loads no report. The import rules themselves (six layers, no cycle, the reports read files only, a run never imports
the reports) are import-linter's contracts in pyproject.toml, and the length rules scripts/check_lengths.py, both
run by `make lint`.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import REPO, needs_mirror


# a tracker's or a work log's number (the word, then a number: the examples below), and a calendar date
TRACKER = re.compile(r"\b(issues?|sessions?)[ -]?#?\d", re.IGNORECASE)
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def _lines(paths):
    return [(p, i, line) for p in paths for i, line in enumerate(p.read_text().splitlines(), 1)]


def _where(hits) -> str:
    return "\n".join(f"{p.relative_to(REPO)}:{i}: {line.strip()}" for p, i, line in hits)


def speaking_files():
    """(every file the tracker check reads, those of them that may hold no date either): the code (the package,
    scripts, benchmarks, tests, Makefile), the configs, the docs and the README. A test may hold a date as data
    (a run's start time), and docs/pilots.md dates its pilots; neither may name a tracker or work-log number."""
    code = [p for d in ("highway_repro", "scripts", "bench") for p in (REPO / d).rglob("*.py")] + [REPO / "Makefile"]
    configs = sorted((REPO / "configs").rglob("*.yaml"))
    tests = sorted((REPO / "tests").rglob("*.py"))
    docs = sorted((REPO / "docs").rglob("*.md")) + [REPO / "README.md"]
    return code + configs + tests + docs, code + configs


def test_the_code_speaks_of_itself():
    """The code, configs, docs and README say what is true of the project now: no numbers of a tracker or a work
    log, which a reader cannot look up, and no dates in code or configs (a measurement names its machine by its
    kind; its history lives in docs/pilots.md)."""
    every, undated = speaking_files()
    assert len(every) > 100 and REPO / "docs" / "pilots.md" in every and REPO / "configs" / "train.yaml" in undated
    tracker = [h for h in _lines(every) if TRACKER.search(h[2])]
    assert not tracker, _where(tracker)
    dated = [h for h in _lines(undated) if DATE.search(h[2])]
    assert not dated, _where(dated)


@pytest.mark.parametrize("line, caught", [
    ("# session {} found it", True), ("(issue {})", True), ("see issues #{} and #4", True), ("sessions {}-22", True),
    ("the session-{} machine", True), ("Session {}", True), ("proc = Popen(cmd, start_new_session=True)  # {}", False),
    ("an issue with {} seeds", False), ("measured 2026-12-{}", None)])
def test_tracker_pattern(line, caught):
    """The patterns above catch the words that must not come back and let genuine uses of the words through (the
    number is put in here, so this file holds none of the lines it tests)."""
    line = line.format(12)
    if caught is None:
        assert DATE.search(line) and not TRACKER.search(line)
    else:
        assert bool(TRACKER.search(line)) == caught


def test_the_length_rules_name_each_file_over_its_limit(tmp_path):
    """`make lint` runs scripts/check_lengths.py: the tree passes, and a file over its limit is named."""
    from conftest import load_script

    lengths = load_script("check_lengths")
    assert lengths.over() == []
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "DESIGN.md").write_text("x\n" * 121)
    (tmp_path / "README.md").write_text("x\n" * 150)
    assert lengths.over(tmp_path) == ["docs/DESIGN.md: 121 lines (at most 120)"]


def test_the_runner_and_the_gpu_check_start_without_the_statistics_libraries():
    """scipy and statsmodels are imported inside the report's functions that test claims, never at module level
    anywhere in the package: the runner, the report's constants and the GPU check's entry load neither (nor torch,
    which the runner leaves to the jobs it launches)."""
    code = ("import sys; sys.path.insert(0, 'scripts'); import highway_repro.runner.cli, "
            "highway_repro.report, highway_repro.report.stats, gpucheck.cli; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'scipy', 'statsmodels', 'torch'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    from highway_repro.report import stats
    assert stats.t_test([1.0, 2.0], [3.0, 5.0])["ci"] and {"scipy", "statsmodels"} <= set(sys.modules)


def test_importing_the_reports_reads_no_sweep_file():
    """The table registry (its rows' order from configs/sweep/) is built on first use, not at import: importing
    the reports opens no sweep file and loads no Hydra; the first `registry()` call reads them."""
    code = ("import builtins, io, sys; opened = []; real = io.open\n"
            "def spy(f, *a, **k):\n    opened.append(str(f)); return real(f, *a, **k)\n"
            "builtins.open = io.open = spy\n"
            "import highway_repro.report\n"
            "print(sum('configs/sweep' in f for f in opened), 'hydra' in sys.modules)\n"
            "highway_repro.report.registry()\n"
            "print(sum('configs/sweep' in f for f in opened) > 0)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0", "False", "True"]


@needs_mirror
def test_a_smoke_training_run_loads_a_few_modules_and_no_report(tmp_path):
    """`python -m highway_repro.train` of a smoke run imports at most 40 of the package's modules and none of the
    reports or the runner (no table spec is built): the package, `highway_repro.train` and `highway_repro.report`
    import nothing eagerly, and a run never imports the reports (import-linter's contract)."""
    code = ("import sys\nfrom highway_repro.train import cli\n"
            f"sys.argv = ['train', *{SMOKE!r}, 'hydra.run.dir={tmp_path}']\n"
            "try:\n    cli()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print(sorted(m for m in sys.modules if m.startswith('highway_repro')))")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    mods = eval(p.stdout.strip().splitlines()[-1])
    assert (tmp_path / "metrics.json").exists() and 20 <= len(mods) <= 40, mods
    assert not [m for m in mods if m.startswith(("highway_repro.report", "highway_repro.runner"))], mods


SMOKE = ["experiment=demo", "scale=smoke", "model.depth=2", "trainer.max_steps=1", "threads=1", "logger=jsonl"]
