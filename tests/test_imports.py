"""The package's import rules (docs/DESIGN.md), read from the source with `ast`: module-level and
function-level imports alike (only `if TYPE_CHECKING:` blocks are left out).

- no import cycle between modules of `highway_repro`;
- data flows one way: `models` and `data` never import the engine, the reporting or the entry points (`train`,
  `cli`, the runner) and the modules beside them (`recipe`, `runtime`);
  neither imports the other; the engine never imports `models` (train.py hands it the model and the
  gate recorder); the reporting (`report`, module or package) never imports the runner, `train` or
  `models`;
- nothing in the package imports the benchmarks (`bench/`, development tooling outside the package).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

PKG = "highway_repro"

# importer (a module or package, with everything under it) -> what it must never import; a trailing * is a prefix
# of module names (`highway_repro.report*`: report.py, a report/ package, report_x.py)
ENTRY = ("highway_repro.reproduce", "highway_repro.runner", "highway_repro.train",
         "highway_repro.cli")  # the commands and their job
FORBIDDEN = {
    "highway_repro.models": ("highway_repro.engine", "highway_repro.report*", "highway_repro.tables*", *ENTRY,
                             "highway_repro.recipe", "highway_repro.runtime", "highway_repro.data"),
    "highway_repro.data": ("highway_repro.engine", "highway_repro.report*", "highway_repro.tables*", *ENTRY,
                           "highway_repro.recipe", "highway_repro.runtime", "highway_repro.models"),
    "highway_repro.engine": ("highway_repro.models", "highway_repro.report*", "highway_repro.tables*", *ENTRY,
                             "highway_repro.recipe"),
    "highway_repro.report": (*ENTRY, "highway_repro.models", "highway_repro.runtime"),
    # the W&B mirror of the kept runs reads files only, as the report does
    "highway_repro.dashboards": ("highway_repro.train", "highway_repro.cli", "highway_repro.models",
                                 "highway_repro.engine", "highway_repro.runtime"),
    # the modules around the entry point know no model, data or engine code (train.py builds those)
    "highway_repro.recipe": ("highway_repro.models", "highway_repro.data", "highway_repro.engine", *ENTRY),
    "highway_repro.runtime": ("highway_repro.models", "highway_repro.data", "highway_repro.engine", *ENTRY),
    "highway_repro.resolvers": ("highway_repro.models", "highway_repro.data", "highway_repro.engine", *ENTRY),
    "highway_repro": ("bench",),
}


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by the name of its __init__)."""
    out = {}
    for path in sorted((REPO / PKG).rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imported(name: str, path: Path, modules) -> list[tuple[str, int]]:
    """(imported module, line) for every import of the module, at any depth: `from a import b` names a.b when that
    is a module of the package, else a; `import a.b` names a.b."""
    is_package = path.name == "__init__.py"
    found = []

    def visit(node):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module
            if node.level:  # relative: from the module's package, one level up per extra dot
                base = name.split(".") if is_package else name.split(".")[:-1]
                module = ".".join(base[: len(base) - (node.level - 1)] + ([module] if module else []))
            found.extend((f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module, node.lineno)
                         for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return found


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported module of the package, or the top-level name of one outside it: line of the import}."""
    modules = _modules()
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges: dict[str, int] = {}
        for target, line in _imported(name, path, modules):
            if not (target == PKG or target.startswith(PKG + ".")):
                target = target.split(".")[0]
            if target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def _matches(module: str, pattern: str) -> bool:
    if pattern.endswith("*"):
        return module.startswith(pattern[:-1])
    return module == pattern or module.startswith(pattern + ".")


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (a list of modules, first == last) per strongly connected component with more than one module."""
    index, low, stack, on_stack, comps = {}, {}, [], set(), []

    def strongconnect(v):  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in graph:
                continue
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    out = []
    for comp in comps:  # a concrete cycle through the component's first module (breadth-first: a shortest one)
        start, members = comp[0], set(comp)
        paths, seen = {start: [start]}, {start}
        queue = [start]
        while queue:
            v = queue.pop(0)
            for w in sorted(graph[v]):
                if w == start:
                    out.append(paths[v] + [start])
                    queue = []
                    break
                if w in members and w not in seen:
                    seen.add(w)
                    paths[w] = paths[v] + [w]
                    queue.append(w)
    return out


def _describe(cycle: list[str], graph) -> str:
    """The cycle, then every import between the modules of its component (what has to go to break it)."""
    members = set(cycle)
    for a in list(graph):  # the whole strongly connected component: modules on a cycle through cycle[0]
        if a not in members and _reaches(graph, cycle[0], a) and _reaches(graph, a, cycle[0]):
            members.add(a)
    edges = [f"  {a}:{graph[a][b]} imports {b}" for a in sorted(members) for b in sorted(graph[a]) if b in members]
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}\n" + \
        "\n".join(edges)


def _reaches(graph, a: str, b: str) -> bool:
    seen, todo = {a}, [a]
    while todo:
        for w in graph.get(todo.pop(), {}):
            if w == b:
                return True
            if w in graph and w not in seen:
                seen.add(w)
                todo.append(w)
    return False


def test_the_parser_sees_module_and_function_level_and_relative_imports():
    g = import_graph()
    assert "highway_repro.engine.trainer" in g["highway_repro.train"]  # inside run()
    assert "highway_repro.config" in g["highway_repro.train"]  # module level
    assert "highway_repro.data.sources" in g["highway_repro.data.text"]  # `from . import sources`
    assert "highway_repro.errors" in g["highway_repro.engine.checkpoint"]
    assert "torch" in g["highway_repro.engine.trainer"]  # outside the package: by top-level name
    toy = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3, "d": 4}, "d": {}}
    assert cycles(toy) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b": 1}, "b": {}}) == []


def test_forbidden_directions():
    g = import_graph()
    bad = []
    for importer, forbidden in FORBIDDEN.items():
        for module, edges in g.items():
            if not _matches(module, importer):
                continue
            bad += [f"{module} imports {target} (line {line}; {importer} must never import {pattern})"
                    for target, line in edges.items() for pattern in forbidden if _matches(target, pattern)]
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    g = import_graph()
    found = cycles(g)
    assert not found, "import cycles:\n" + "\n".join(_describe(c, g) for c in found)


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


def test_no_python_file_of_the_package_scripts_or_benchmarks_is_over_500_lines():
    """Each file reads alone: the package, the scripts and the benchmarks are split by concept below 500 lines."""
    root = Path(__file__).resolve().parents[1]
    long = {str(p.relative_to(root)): n for d in ("highway_repro", "scripts", "bench") for p in (root / d).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long
    assert len((root / "highway_repro" / "train.py").read_text().splitlines()) < 150


def test_the_runner_and_the_gpu_check_start_without_the_statistics_libraries():
    """scipy and statsmodels are imported inside the report's functions that test claims, never at module level
    anywhere in the package: the runner, the report's constants and the GPU check's entry load neither (nor torch,
    which the runner leaves to the jobs it launches)."""
    code = ("import sys; sys.path.insert(0, 'scripts'); import highway_repro.reproduce, highway_repro.runner, "
            "highway_repro.report, highway_repro.report.stats, gpucheck.cli; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'scipy', 'statsmodels', 'torch'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    from highway_repro.report import stats
    assert stats.t_test([1.0, 2.0], [3.0, 5.0])["ci"] and {"scipy", "statsmodels"} <= set(sys.modules)
