"""`python -m highway_repro.runner`: what `make reproduce-<table>`, `make estimate-<table>` and `make tables` call
(`runner.cli.main`; `--help` lists the options)."""

from highway_repro.runner.cli import main

raise SystemExit(main())
