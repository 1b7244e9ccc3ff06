"""`python -m highway_repro.reproduce`: what `make reproduce-<table>`, `make estimate-<table>` and `make tables`
call. The runner itself lives in `highway_repro/runner/` (`runner.cli.main`; `--help` lists the options)."""

from highway_repro.runner.cli import main
from highway_repro.runner.plan import plan  # noqa: F401  (a table's runs, for scripts/gpu_check.py)

if __name__ == "__main__":
    raise SystemExit(main())
