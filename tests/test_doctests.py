"""Every `>>>` example in the package's docstrings runs and prints what it shows.

Examples that are not meant to run are written without `>>>` (an indented block).
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import highway_repro


def _modules():
    yield highway_repro
    for info in pkgutil.walk_packages(highway_repro.__path__, prefix="highway_repro."):
        if info.name.endswith(".__main__"):  # runs its command line when imported
            continue
        yield importlib.import_module(info.name)


def test_docstring_examples_run():
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    failed, examples = [], 0
    for module in _modules():
        for test in finder.find(module, module.__name__):
            result = runner.run(test, out=lambda text: failed.append(text))
            examples += result.attempted
    assert not failed, "".join(failed)
    assert examples > 0  # the examples were found (resolve_placement's, at least)
