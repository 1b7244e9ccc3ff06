"""Reports from run folders: tables (Markdown + CSV), claims with 95 % intervals, figures, results/summary.csv.

    from highway_repro.report import load_runs, build_table, write_summary
    md = build_table("hn_table1", load_runs("runs/sweeps/hn_table1-cpu"), Path("results/highway_networks/table1"),
                     {"commands": ["make reproduce-hn-table1 SCALE=cpu"], "scale": "cpu", "wall_s": 3600.0})
    write_summary(Path("results"))

Each module's docstring says what it holds; `generic.py` is `python -m highway_repro.report`.
This package reads files only: it imports neither torch nor the models, the trainer or the runner.
"""

# Imported when first asked for (PEP 562): importing one module of the package (`report.runs`, `report.papers`)
# builds no table spec and loads no other report module.
_NAMES = {"main": "generic", "Run": "runs", "load_runs": "runs", "write_summary": "summary", "build_table": "tables",
          "findings_path": "tables", "registry": "tables"}
__all__ = list(_NAMES)


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module 'highway_repro.report' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"highway_repro.report.{_NAMES[name]}"), name)
