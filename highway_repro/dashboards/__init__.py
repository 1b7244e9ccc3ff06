"""The kept runs on W&B: offline runs for `wandb sync`, and a dashboard per table.

| module | what |
|---|---|
| `export.py` | `make wandb-export`: every distinct kept run as an offline W&B run, plus one report run per table |
| `spec.py` | a table's dashboard as plain JSON, a pure function of the committed files (no wandb) |
| `publish.py` | the specs as W&B saved views (`wandb-workspaces`, the `wandb` extra), made only when publishing |
| `__main__.py` | `python -m highway_repro.dashboards export|dashboards` |

A run's W&B id, name, group, job type, tags and `row` column come from `report/identity.py`, the one rule that
`logger=wandb` follows too. Tables are built from the run folders, never from W&B: this package only mirrors them. It
reads files only (no torch).
"""
