"""The tables' runner behind `make reproduce-<table>` and `make tables` (`python -m highway_repro.runner`): `plan`
(sweep files to runs), `keep` (the kept-run store), `estimate` (the one cost rule), `progress`, `table` (a table's
plan and record), `queue` (local processes) and `slurm` (SLURM jobs through submitit), `cli`."""
