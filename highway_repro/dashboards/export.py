"""`make wandb-export`: the kept runs as offline W&B runs, for `wandb sync`.

Every distinct kept run of every table (`grids.kept_folders`: a study's reused cells and a target's parts
included) becomes one offline run under `<out>/wandb/offline-run-<time>-<id>/`, with the id, group, name, job type,
tags and config that `logger=wandb` gave the same run (`report/identity.py`: `table:<name>` for each table that reads
it, `scale:<scale>`, `device:<cpu or the GPU's name>`; a run that several tables read is exported once), the history
of its metrics.jsonl at its own steps and the summary of its metrics.json (a validation loss: its lowest and its last
value, `identity.SUMMARIES`). Each table also gets one report run
(`report: <table>`): the paper's numbers as flat lines, the quantile of each row's trials that a random search's
claims test, and the report's rows, intervals and verdicts as a W&B Table (what its dashboard spec names, `spec.py`).

`<out>/exported.json` records each exported run's folder and a digest of what it was made from: a second export
skips a run whose inputs are unchanged, writes a changed one anew (its old folder removed) and removes the runs of
kept runs that are gone. Reads files only: no torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path

from highway_repro.errors import make_folder
from highway_repro import files
from highway_repro.report.identity import JOB_TYPE, SUMMARIES, define_summaries, identity, job_of, run_id
from highway_repro.dashboards.spec import DAMAGED, build_specs, sound_runs
from highway_repro.files import KeptFileError
from highway_repro.grids import kept_folders
from highway_repro.report.runs import Run, load_run
from highway_repro.targets import KEPT_FILES, REPORTS, ROOT, SCALES

EXPORT_DIR = ROOT / "runs" / "wandb_export"
PROJECT = "highway-repro"  # the project of configs/logger/wandb.yaml; WANDB_PROJECT chooses another
FORMAT = 3  # in every digest: a change to what an exported run holds makes the next export write every run anew
CHUNK = 16  # runs per worker task; the record is saved after each


@dataclass
class Item:
    """One W&B run to write: a kept run (`folder`) or a table's report run (`report`: references and claims)."""
    id: str
    name: str
    group: str
    config: dict
    tags: list = field(default_factory=list)
    notes: str = ""
    folder: str | None = None
    report: dict | None = None

    def digest(self) -> str:
        """What the run is made of: its fields and the bytes of its kept files."""
        h = hashlib.sha256(json.dumps([FORMAT, asdict(self)], sort_keys=True, default=str).encode())
        for f in KEPT_FILES if self.folder else ():
            blob = files.read_bytes(Path(self.folder) / f, Path(self.folder).parent)
            h.update(f.encode() + (b"-" if blob is None else blob))
        return h.hexdigest()


def shown(path: Path) -> str:
    """A path as the messages and records show it: relative to the repository where it lies in it."""
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def run_item(run: Run) -> Item:
    """The W&B run of one sound kept run (`spec.sound_runs`; no table tags yet)."""
    folder, config, info = run.path, run.config, run.run_info
    who = identity(config, job_of(folder, run.root)[0], info.get("cuda_device"))
    device = info.get("cuda_device") or "cpu"
    notes = (f"kept run {shown(folder)}: trained on {device} ({info.get('cpu_model')}, {info.get('threads')} "
             f"threads), commit {str(info.get('git_commit'))[:12]}, {info.get('start_time')} to {info.get('end_time')}")
    return Item(who["id"], who["name"], who["group"], who["config"], who["tags"], notes, str(folder))


def kept_items(results: Path, folders: list[Path] | None = None) -> list[Item]:
    """One item per distinct kept run, tagged with every table that reads it (`folders`: only the runs of these)."""
    items, seen = {}, {}
    wanted = None if folders is None else {run_item(r).id for r in sound_runs(list(map(Path, folders)))}
    names = None if folders is None else {Path(f).name for f in folders}  # another job name is another run
    for name in REPORTS:
        for scale in SCALES:
            for run in sound_runs(kept_folders(name, scale, results), results):
                folder = run.path
                if names is not None and folder.name not in names:
                    continue
                if folder not in seen:
                    item = run_item(run)
                    first = items.setdefault(item.id, item)
                    if first is not item and load_run(Path(first.folder)).final != run.final:
                        print(f"warning: {folder} and {first.folder} are one W&B run ({item.id}) but differ; "
                              f"exported: {first.folder}")
                    seen[folder] = item.id
                item = items[seen[folder]]
                item.tags = sorted({*item.tags, f"table:{name}"})
    return [item for item in items.values() if wanted is None or item.id in wanted]


def report_items(specs: list[dict]) -> list[Item]:
    """One report run per dashboard spec: the paper's flat lines, the quantiles and the report's W&B Table; tagged with
    the device of the runs its table compares, so that its dashboard's filter selects it."""
    return [Item(run_id("report", s["scale"], s["table"]), f"report: {s['table']}", "report",
                 {"name": "report", "row": "paper", "table": s["table"], "scale_name": s["scale"]},
                 sorted([f"table:{s['table']}", f"scale:{s['scale']}", "report", *s["filter"]["devices"]]),
                 s["description"],
                 report={"references": s["references"], "quantiles": s.get("quantiles", []),
                         "claims": s["claims"]}) for s in specs]


def _number(v):
    """A metric value as W&B takes it: metrics files write NaN and infinities as strings."""
    return float(v) if v in ("nan", "inf", "-inf") else v


def history(run: Run) -> dict[int, dict]:
    """metrics.jsonl as W&B logs it: {step: its numbers}, the lines of one step (training, evaluation) merged."""
    rows: dict[int, dict] = {}
    for record in run.history:  # (lines cut by a kill, or not a record with a whole step, left out)
        values = {k: _number(v) for k, v in record.items() if k != "step"}
        rows.setdefault(int(record.get("step", 0)), {}).update(
            {k: v for k, v in values.items() if isinstance(v, (int, float))})
    return rows


def write_run(wandb, item: Item, out: Path, project: str) -> str:
    """Write one offline run under `<out>/wandb/` (any earlier folder of its id removed); its folder, relative."""
    for old in (out / "wandb").glob(f"offline-run-*-{item.id}*"):
        shutil.rmtree(old)
    settings = wandb.Settings(console="off", disable_git=True, save_code=False, x_disable_stats=True,
                              x_disable_meta=True, x_disable_machine_info=True)
    run = wandb.init(project=project, id=item.id, name=item.name, group=item.group, tags=item.tags,
                     notes=item.notes, config=item.config, job_type="report" if item.report else JOB_TYPE,
                     dir=str(out), mode="offline", settings=settings, reinit="finish_previous")
    if item.folder:
        define_summaries(run)
        kept = load_run(Path(item.folder))
        for step, values in history(kept).items():  # each step committed, so the summary below is the last word
            run.log(values, step=step, commit=True)
        final = kept.final
        run.summary.update({k: _number(v) for k, v in final.items()
                            if isinstance(v, (int, float, str)) and k not in SUMMARIES})  # those: lowest and last
    else:
        refs, claims = item.report["references"], item.report["claims"]
        steps = refs[0]["steps"] if refs else [0]
        table = wandb.Table(columns=claims["columns"], data=claims["rows"], allow_mixed_types=True)
        at_end = {claims["key"]: table, **{q["key"]: q["value"] for q in item.report["quantiles"]}}
        for step in steps:
            run.log({**{r["key"]: r["value"] for r in refs}, **(at_end if step == steps[-1] else {})},
                    step=step, commit=True)
    where = Path(run.dir).parent.relative_to(out).as_posix()  # run.dir: <out>/wandb/offline-run-.../files
    run.finish()
    return where


def write_chunk(items: list[Item], out: Path, project: str) -> dict[str, dict]:
    """Write some runs (in a worker process); {id: its record}."""
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    return {i.id: {"run": write_run(wandb, i, out, project), "digest": i.digest(),
                   "source": shown(Path(i.folder)) if i.folder else i.name} for i in items}


def _save(index_path: Path, index: dict) -> None:
    files.write_atomic(index_path, json.dumps(index, indent=1, sort_keys=True), index_path.parent)


def read_index(out: Path) -> dict:
    """`<out>/exported.json` ({} when absent): each entry's `run` must be `wandb/<a plain folder name>` and its
    `digest` a string, else KeptFileError (nothing is removed by a record's say-so)."""
    index = files.read_json(out / "exported.json", out, kind=dict) or {}
    for run, entry in index.items():
        where = entry.get("run") if isinstance(entry, dict) else None
        parts = where.split("/") if isinstance(where, str) else []
        if len(parts) != 2 or parts[0] != "wandb" or not isinstance(entry.get("digest"), str):
            raise KeptFileError(f"{out / 'exported.json'}: {run}={entry!r} is not allowed (valid: run, "
                                "wandb/<folder name>; digest, a string); delete the file to export every run anew")
        files.plain_name(parts[1], f"{out / 'exported.json'}: {run}.run")
    return index


def export(results: Path, out: Path, jobs: int = 2, project: str | None = None,
           folders: list[Path] | None = None) -> dict:
    """Export the kept runs under `results` (or only `folders`, then without report runs) into `out`.
    A damaged kept run is left out and named (`spec.sound_runs`). Returns {"runs", "written", "skipped", "removed",
    "seconds", "damaged": {folder: why}}."""
    start = time.perf_counter()
    project = project or os.environ.get("WANDB_PROJECT") or PROJECT
    items = kept_items(results, folders)
    if folders is None:
        items += report_items(build_specs(results))
    make_folder(out)
    index_path = out / "exported.json"
    index = read_index(out)
    todo = [i for i in items if index.get(i.id, {}).get("digest") != i.digest()
            or not (out / index[i.id]["run"]).is_dir()]
    gone = set(index) - {i.id for i in items} if folders is None else set()
    for run in gone:
        old = files.below(out / index.pop(run)["run"], out)  # never through a link
        shutil.rmtree(old, ignore_errors=True)
    chunks = [todo[k:k + CHUNK] for k in range(0, len(todo), CHUNK)]
    done = []

    def record(records: dict) -> None:  # saved after each chunk: a stopped export keeps what it wrote
        index.update(records)
        _save(index_path, index)
        done.extend(records)
        if len(chunks) > 1:
            print(f"  {len(done)}/{len(todo)} runs written ({time.perf_counter() - start:.0f} s)", flush=True)

    if jobs == 1 or len(chunks) < 2:
        for chunk in chunks:
            record(write_chunk(chunk, out, project))
    else:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
            for f in as_completed([pool.submit(write_chunk, chunk, out, project) for chunk in chunks]):
                record(f.result())
    _save(index_path, index)
    return {"runs": len(items), "written": len(todo), "skipped": len(items) - len(todo), "removed": len(gone),
            "seconds": time.perf_counter() - start, "damaged": dict(DAMAGED)}
