"""Reports from run folders: tables (Markdown + CSV), claims with 95 % intervals, figures, results/summary.csv.

    from highway_repro.report import load_runs, build_table, write_summary
    md = build_table("hn_table1", load_runs("runs/sweeps/hn_table1-cpu"), Path("results/highway_networks/table1"),
                     {"commands": ["make reproduce-hn-table1 SCALE=cpu"], "scale": "cpu", "wall_s": 3600.0})
    write_summary(Path("results"))

| module | what |
|---|---|
| `runs.py` | run folders -> `Run` (overrides, config, final metrics, history, status, run_info) |
| `stats.py` | t-tests (statsmodels: paired, Welch, TOST), the four verdicts, Holm, quantile tests, seeds needed |
| `papers.py` | the typed records of `papers.yaml`: every paper number, claim, threshold, margin and floor |
| `spec.py` | the one table style: `TableSpec` (rows, columns, claims, floors) and `render` |
| `measures.py` | `Measure` (one number per run), `Row` (the runs of a row), number formats, the column constructors |
| `claims.py` | `Claim` and its tests (paired by seed or Welch, one-sample, a quantile of trials), Holm, floors |
| `tables.py` | `registry()` (name -> spec, built on first use), `build_table`, `findings_path` (kept findings) |
| `header.py` | the one header writer (command, scale, seeds, runs, times, machine from run_info.json) |
| `plots.py` | the one plotting helper |
| `claims_file.py` | `<table>.claims.json`: its rows, claims and floors as data, read back as a kept file |
| `prose.py` | the tables' and pages' prose: the Markdown templates of `prose.md`, filled by name |
| `summary.py` | `results/summary.csv` (each comparison once; the papers' trends as one family), `results/README.md` |
| `power.py` | the power and error of Fig. 1's quantile test, simulated at the measured trial distributions |
| `claims_list.py` | the full claims list of `results/README.md` and the counts of verdicts (standard library only) |
| `forest.py` | `results/claims.png`: every distinct comparison, its interval, delta and the paper's effect |
| `ledger.py` | the append-only ledger, its check of every definition and rule, the verdicts before post-data rules |
| `generic.py` | `python -m highway_repro.report` (generic tables of any sweep) |

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
