"""The tables' runner (`python -m highway_repro.runner`): plan, keep, estimate, progress, table, queue, slurm, cli."""
