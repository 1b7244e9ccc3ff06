"""A table's W&B dashboard as plain JSON: a pure function of the committed files (kept runs, results/summary.csv).

One spec per table and scale (every report of `targets.REPORTS` that has kept runs):

- `filter`: the runs the table compares: tagged `table:<name>` (the export tags each run with every table that reads
  it) and `device:<d>` for a device `d` of those runs (the report compares one device's runs, `report.runs.one_device`:
  the runs of the table made on the other device, kept apart, are on no dashboard), grouped by
  the config column `row` (`identity.row_of`; the gate zoo, whose rows repeat across its models: by `name`, the
  experiment, then `row`);
- `panels`: the table's metric over the steps (validation, then training), each row's mean with a band from the
  lowest to the highest of its runs (no standard deviation band: the report's intervals are in the table panel), with
  the paper's number of each row it reports as a flat line (`paper/<split>_<metric>/<row>`, logged by the table's
  report run); the metric at the end of each run, the row's mean; the report's rows, intervals and verdicts
  (`report/claims`, a W&B Table of the table's lines of results/summary.csv). A random search whose claims test a
  quantile of its trials (Fig. 1): the curves of each row's lowest trial (the figure's best trial), and at the end
  the quantile itself, per row, over all of its trials, a diverged one counted at the worst final value a finished
  trial of its depth reached, as the figure counts it (`quantiles`, logged by the report run: W&B's groups have no
  quantile and drop a run without the metric);
- `references`, `quantiles` and `claims`: what the table's report run logs (`export.py` writes it from the spec).

No wandb import here: `publish.py` turns a spec into W&B objects, and only when publishing.
"""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path

from highway_repro import files
from highway_repro.grids import kept_folders
from highway_repro.report.identity import SUMMARIES
from highway_repro.report.runs import Run, load_run, one_device
from highway_repro.targets import REPORTS, SCALES, TARGETS

METRICS = ("acc", "bpc", "ppl", "loss")  # a summary.csv metric names one of these (`mean bpc over evaluations`)
CLAIMS_KEY = "report/claims"
# summary.csv columns that hold numbers (empty: None); the others are text
NUMERIC = {"n_seeds", "mean", "std", "ci_low", "ci_high", "ci_unpaired_low", "ci_unpaired_high", "level", "paper",
           "floor", "delta", "family_size", "compared_mean", "diff", "paper_effect", "runs", "runs_planned"}


DAMAGED: dict[str, str] = {}  # the kept run folders left out of every dashboard and export: {folder: why}


def sound_runs(folders: list[Path], results: Path | None = None) -> list[Run]:
    """The runs of kept run folders (below `results`: no link followed), less the damaged ones
    (`report.runs.load_run`), which are noted in `DAMAGED` (the export names them and exits 1)."""
    runs = [load_run(f, results) for f in folders]
    DAMAGED.update({str(r.path): r.error for r in runs if r.status == "damaged"})
    return [r for r in runs if r.status != "damaged"]


def logged_keys(runs: list[Run]) -> tuple[dict[str, int], set[str]]:
    """What the runs log: {history key: most points one run has of it} (metrics.jsonl) and the metrics.json keys."""
    history: dict[str, int] = {}
    final: set[str] = set()
    for run in runs:
        counts: dict[str, int] = {}
        for record in run.history:
            for k in record:
                counts[k] = counts.get(k, 0) + 1
        for k, n in counts.items():
            history[k] = max(history.get(k, 0), n)
        final |= set(run.final)
    history.pop("step", None)
    return history, final


def summary_lines(results: Path) -> list[dict]:
    """results/summary.csv as dicts (empty without one)."""
    blob = files.read_bytes(results / "summary.csv", results)  # no link, a bounded size
    return list(csv.DictReader(io.StringIO(blob.decode(errors="replace"), newline=""))) if blob else []


def _number(text: str):
    try:
        return float(text)
    except ValueError:
        return text


def claims_table(lines: list[dict]) -> dict:
    """The table's lines of summary.csv as a W&B Table's columns and rows (numbers as numbers, empty cells None)."""
    columns = [c for c in (lines[0] if lines else {}) if c != "table"]
    rows = [[None if line[c] == "" else _number(line[c]) if c in NUMERIC else line[c] for c in columns]
            for line in lines]
    return {"key": CLAIMS_KEY, "columns": columns, "rows": rows}


def _slug(row: str) -> str:
    """A summary row label as a key part: `SDU tanh, all layers (sdu_tanh)` -> `sdu_tanh`."""
    named = re.search(r"\(([\w.-]+)\)$", row)
    return named.group(1) if named else re.sub(r"[^\w.-]+", "_", row).strip("_")


def quantiles(name: str, runs: list[Run], split: str, metric: str) -> list[dict]:
    """The quantile that `name`'s claims test of each row's trials ([] for a table whose claims test no quantile):
    [{"row", "key", "value", "trials"}], failures at the worst finished value of the row's depth (the first key)."""
    from highway_repro.report.claims import trials
    from highway_repro.report.spec import claims_of, group
    from highway_repro.report.stats import quantile
    from highway_repro.report.tables import registry

    spec = registry()[name]
    rows = group(spec, runs)
    q = next((c.q for c in claims_of(spec, {r.id: r for r in rows}, name) if c.pick == "quantile"), None)
    if q is None:
        return []
    out = []
    for row in rows:
        worst = max((v for other in rows if other.id[0] == row.id[0] for v in other.values(spec.primary)),
                    default=math.nan)
        xs = trials(row, spec.primary, worst)
        if xs:
            out.append({"row": row.label, "key": f"report/{split}_{metric}_q{q * 100:g}/{_slug(row.label)}",
                        "value": quantile(xs, q), "trials": len(xs)})
    return out


def table_spec(name: str, scale: str, runs: list[Run], lines: list[dict]) -> dict:
    """The dashboard of table `name` at `scale` from the kept runs it compares (one device's) and its lines of
    summary.csv."""
    history, final = logged_keys(runs)
    main = next(line for line in lines if line["kind"] == "row")
    metric = next((m for m in METRICS if re.search(rf"\b{m}\b", main["metric"])), main["metric"])
    split = main["split"]
    last = max(int(r.final.get("step") or 0) for r in runs)
    references = [{"row": line["row"], "key": f"paper/{split}_{metric}/{_slug(line['row'])}",
                   "value": float(line["paper"]), "steps": [0, last]}
                  for line in lines if line["kind"] == "row" and line["paper"]]
    curves = [f"{s}/{metric}" for s in ("val", "train") if history.get(f"{s}/{metric}", 0) > 1]
    experiments = {TARGETS[p].experiment for p in TARGETS[name].parts or (name,)}
    end = f"{split}/{metric}"
    last = f"{end}.last" if end in SUMMARIES else end  # W&B's name of the final value of a key with a summary
    qs = quantiles(name, runs, split, metric) if end in final else []
    panels = []
    for i, key in enumerate(curves):
        refs = references if i == 0 else []
        title = (f"{key} by row: the lowest of the row's trials at each step (the figure's best trial)" if qs else
                 f"{key} by row: the mean of the row's runs, band from its lowest to its highest run")
        if refs:
            title += f"; flat lines: the paper's {split} {metric} of the rows it reports"
        panels.append({"kind": "line", "title": title, "x": "Step", "y": [key] + [r["key"] for r in refs],
                       "aggregate": "min" if qs else "mean", "band": "none" if qs else "minmax",
                       "log_y": metric == "loss"})
    if qs:
        panels.append({"kind": "bar", "title": f"{end}: the {qs[0]['key'].split('/')[1].rsplit('_q', 1)[1]} % "
                       "quantile of each row's trials that the claims test, a diverged trial counted at the worst "
                       "final value of its depth (the report run; the intervals: the table below)",
                       "y": [x["key"] for x in qs], "aggregate": "mean", "band": "none"})
    elif end in final:
        panels.append({"kind": "bar", "title": f"{end} at the end of each run: the mean of the row's runs "
                       "(the report's intervals: the table below)", "y": [last], "aggregate": "mean",
                       "band": "none"})
    panels.append({"kind": "table", "title": "the report's rows, intervals and verdicts (results/summary.csv)",
                   "key": CLAIMS_KEY})
    return {"table": name, "scale": scale, "name": f"{name} ({scale})", "description": TARGETS[name].help,
            "filter": {"tags": [f"table:{name}"],  # a run has each of `tags` and one of `devices`
                       "devices": sorted({f"device:{r.run_info.get('cuda_device') or 'cpu'}" for r in runs})},
            "group_by": ["name", "row"] if len(experiments) > 1 else ["row"],
            "columns": ["config:row", f"summary:{last}", "summary:status"], "runs": len(runs),
            "panels": panels, "references": references, "quantiles": qs, "claims": claims_table(lines)}


def build_specs(results: Path) -> list[dict]:
    """Every table's dashboard at every scale it has kept runs and summary lines of (`targets.REPORTS` order)."""
    lines = summary_lines(results)
    specs = []
    for name in REPORTS:
        for scale in SCALES:
            mine = [line for line in lines if line["table"] == name and line["scale"] == scale]
            runs = one_device(sound_runs(kept_folders(name, scale, results), results))[0]
            if runs and any(line.get("kind") == "row" for line in mine):
                try:
                    specs.append(table_spec(name, scale, runs, mine))
                except (KeyError, ValueError, TypeError, StopIteration) as e:  # summary.csv damaged on its lines
                    DAMAGED[f"results/summary.csv ({name})"] = f"its lines cannot be read ({type(e).__name__}: {e})"
    return specs
