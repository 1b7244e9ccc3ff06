"""Reports from run folders: tables (Markdown + CSV), claims with 95 % intervals, figures, results/summary.csv.
Reads files only: imports neither torch nor the models, the trainer or the runner; `python -m highway_repro.report`
is `generic.py`."""

import importlib

# Imported when first asked for (PEP 562): importing one module of the package builds no table spec.
_NAMES = {"main": "generic", "Run": "runs", "load_runs": "runs", "write_summary": "summary", "build_table": "tables",
          "findings_path": "tables", "registry": "tables"}
__all__ = list(_NAMES)


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module 'highway_repro.report' has no attribute {name!r}")
    return getattr(importlib.import_module(f"highway_repro.report.{_NAMES[name]}"), name)
