"""The tables' runner behind `make reproduce-<table>` and `make tables`, in rooms:

- `plan`: a table's sweep files to its runs (their folder names);
- `keep`: the kept-run store under results/ (restore, keep, the recipe guard);
- `estimate`: what the runs cost (time, memory), by one rule;
- `progress`: the progress lines;
- `table`: one table's plan, its commands and its record;
- `queue`: the commands N at a time (process groups, signals, memory, one GPU per job);
- `slurm`: the queue's commands as SLURM jobs, through submitit;
- `cli`: `python -m highway_repro.runner` (`__main__.py`; train what is missing, then the reports).
"""
