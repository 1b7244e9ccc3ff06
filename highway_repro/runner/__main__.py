"""`python -m highway_repro.runner` (`make reproduce-<table>`, `make tables`): `runner.cli.main`; see `--help`."""

from highway_repro.runner.cli import main

raise SystemExit(main())
