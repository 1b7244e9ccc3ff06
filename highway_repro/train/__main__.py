"""`python -m highway_repro.train`: `highway_repro.train.cli`, the imported package's function (launchers such as
joblib and submitit pickle it by reference, so it must not be this module's)."""

from highway_repro.train import cli

cli()
