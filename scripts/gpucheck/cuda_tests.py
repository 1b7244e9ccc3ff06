"""Phase 7, the CUDA tests (`pytest -m cuda`): their counts and names, read from pytest's JUnit XML."""

from __future__ import annotations

import sys

from .common import REPO
from .phases import Ctx, run_child, tail


def cuda_tests(ctx: Ctx) -> dict:
    import xml.etree.ElementTree as ET

    files = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py") if "mark.cuda" in p.read_text())
    if not files:
        raise RuntimeError("no test file under tests/ uses the `cuda` marker")
    xml = ctx.runs / "cuda_tests.xml"
    xml.parent.mkdir(parents=True, exist_ok=True)
    xml.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
           f"--junitxml={xml}", *files]
    rc, out = run_child(ctx, cmd, timeout=min(120.0, max(20.0, ctx.left() - 15)))  # ~30 s on a GPU
    if not xml.exists():
        raise RuntimeError(f"pytest exited {rc} without a result: {tail(out, 6)}")
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failed, skipped = [], set()
    for tc in ET.parse(xml).getroot().iter("testcase"):
        counts["tests"] += 1
        name = f"{tc.get('classname', '')}::{tc.get('name')}"
        if tc.find("failure") is not None or tc.find("error") is not None:
            bad = tc.find("failure") if tc.find("failure") is not None else tc.find("error")
            counts["failures" if tc.find("failure") is not None else "errors"] += 1
            failed.append(f"`{name}`: {(bad.get('message') or '').splitlines()[0][:200] if bad.get('message') else ''}")
        elif tc.find("skipped") is not None:
            counts["skipped"] += 1
            skipped.add((tc.find("skipped").get("message") or "").splitlines()[0][:120])
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    for k, v in {**counts, "passed": passed, "exit_code": rc}.items():
        ctx.rep.row("tests", "pytest -m cuda", "", "", k, v)
    lines = [f"`{' '.join(['python', *cmd[1:]])}`: exit code {rc}; {passed} passed, {counts['failures']} failed, "
             f"{counts['errors']} errors, {counts['skipped']} skipped of {counts['tests']}."]
    lines += [f"- failed: {f}" for f in failed] + [f"- skipped: {s}" for s in sorted(skipped)]
    ctx.rep.section("tests", "CUDA tests (pytest -m cuda)", lines)
    ok = None if ctx.dry else (counts["tests"] > 0 and passed == counts["tests"])
    ctx.rep.target("tests", "CUDA tests (pytest -m cuda)", f"{passed} of {counts['tests']} passed", "all pass", ok,
                   "dry run: skipped without CUDA" if ctx.dry else "")
    return counts
