"""`make wandb-export`: the kept runs as offline W&B runs, for `wandb sync`.

Every distinct kept run of every table (`report.grids.kept_folders`: a study's reused cells and a target's parts
included) becomes one offline run under `<out>/wandb/offline-run-<time>-<id>/`, with the id, group, name and config that
`logger=wandb` gives the same run (`engine/identity.py`; a run that several tables read is exported once and tagged with
each of them), the history of its metrics.jsonl at its own steps, the summary of its metrics.json, and tags
`table:<name>` (each table that reads it), `scale:<scale>` and `device:<cpu or the GPU's name>` (run_info.json). Each
table also gets one report run (`report: <table>`): the paper's numbers as flat lines and the report's rows,
intervals and verdicts as a W&B Table (what its dashboard spec names, `spec.py`).

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

from highway_repro.engine.identity import identity, job_name, run_id
from highway_repro.dashboards.spec import build_specs
from highway_repro.report.grids import kept_folders
from highway_repro.report.runs import read_yaml
from highway_repro.targets import CONFIG_DIR, KEPT_FILES, REPORTS, ROOT, SCALES

EXPORT_DIR = ROOT / "runs" / "wandb_export"
PROJECT = "highway-repro"  # the project of configs/logger/wandb.yaml; WANDB_PROJECT chooses another
FORMAT = 1  # in every digest: a change to what an exported run holds makes the next export write every run anew
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
            path = Path(self.folder) / f
            h.update(f.encode() + (path.read_bytes() if path.exists() else b"-"))
        return h.hexdigest()


def shown(path: Path) -> str:
    """A path as the messages and records show it: relative to the repository where it lies in it."""
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def excluded_keys() -> list[str]:
    """The keys Hydra leaves out of a job's name (configs/train.yaml, `override_dirname.exclude_keys`)."""
    return list(read_yaml(CONFIG_DIR / "train.yaml")["hydra"]["job"]["config"]["override_dirname"]["exclude_keys"])


def run_item(folder: Path, exclude: list[str]) -> Item:
    """The W&B run of one kept run folder (no table tags yet)."""
    config = read_yaml(folder / "config_resolved.yaml") or {}
    overrides = read_yaml(folder / ".hydra" / "overrides.yaml")
    info = json.loads((folder / "run_info.json").read_text()) if (folder / "run_info.json").exists() else {}
    who = identity(config, job_name(overrides, exclude) if overrides is not None else folder.name,
                   on_gpu=bool(info.get("cuda_device")))
    device = info.get("cuda_device") or "cpu"
    notes = (f"kept run {shown(folder)}: trained on {device} ({info.get('cpu_model')}, {info.get('threads')} "
             f"threads), commit {str(info.get('git_commit'))[:12]}, {info.get('start_time')} to {info.get('end_time')}")
    return Item(who["id"], who["name"], who["group"], who["config"],
                [f"scale:{config.get('scale_name')}", f"device:{device}"], notes, str(folder))


def kept_items(results: Path, folders: list[Path] | None = None) -> list[Item]:
    """One item per distinct kept run, tagged with every table that reads it (`folders`: only the runs of these)."""
    exclude, items, seen = excluded_keys(), {}, {}
    wanted = None if folders is None else {run_item(Path(f), exclude).id for f in folders}
    names = None if folders is None else {Path(f).name for f in folders}  # another job name is another run
    for name in REPORTS:
        for scale in SCALES:
            for folder in kept_folders(name, scale, results):
                if names is not None and folder.name not in names:
                    continue
                if folder not in seen:
                    item = run_item(folder, exclude)
                    first = items.setdefault(item.id, item)
                    if first is not item and (Path(first.folder) / "metrics.json").read_bytes() != \
                            (folder / "metrics.json").read_bytes():
                        print(f"warning: {folder} and {first.folder} are one W&B run ({item.id}) but differ; "
                              f"exported: {first.folder}")
                    seen[folder] = item.id
                item = items[seen[folder]]
                item.tags = sorted({*item.tags, f"table:{name}"})
    return [item for item in items.values() if wanted is None or item.id in wanted]


def report_items(specs: list[dict]) -> list[Item]:
    """One report run per dashboard spec: the paper's flat lines and the report's W&B Table."""
    return [Item(run_id("report", s["scale"], s["table"]), f"report: {s['table']}", "report",
                 {"name": "report", "row": "paper", "table": s["table"], "scale_name": s["scale"]},
                 sorted([f"table:{s['table']}", f"scale:{s['scale']}", "report"]), s["description"],
                 report={"references": s["references"], "claims": s["claims"]}) for s in specs]


def _number(v):
    """A metric value as W&B takes it: metrics files write NaN and infinities as strings."""
    return float(v) if v in ("nan", "inf", "-inf") else v


def history(folder: Path) -> dict[int, dict]:
    """metrics.jsonl as W&B logs it: {step: its numbers}, the lines of one step (training, evaluation) merged."""
    rows: dict[int, dict] = {}
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a kill
            continue
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
                     notes=item.notes, config=item.config, job_type="report" if item.report else "train",
                     dir=str(out), mode="offline", settings=settings, reinit="finish_previous")
    if item.folder:
        folder = Path(item.folder)
        for step, values in history(folder).items():  # each step committed, so the summary below is the last word
            run.log(values, step=step, commit=True)
        final = json.loads((folder / "metrics.json").read_text())
        run.summary.update({k: _number(v) for k, v in final.items() if isinstance(v, (int, float, str))})
    else:
        refs, claims = item.report["references"], item.report["claims"]
        steps = refs[0]["steps"] if refs else [0]
        table = wandb.Table(columns=claims["columns"], data=claims["rows"], allow_mixed_types=True)
        for step in steps:
            run.log({**{r["key"]: r["value"] for r in refs}, **({claims["key"]: table} if step == steps[-1] else {})},
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
    tmp = index_path.with_name(index_path.name + ".tmp")
    tmp.write_text(json.dumps(index, indent=1, sort_keys=True))
    os.replace(tmp, index_path)


def export(results: Path, out: Path, jobs: int = 2, project: str | None = None,
           folders: list[Path] | None = None) -> dict:
    """Export the kept runs under `results` (or only `folders`, then without report runs) into `out`.
    Returns {"runs", "written", "skipped", "removed", "seconds"}."""
    start = time.perf_counter()
    project = project or os.environ.get("WANDB_PROJECT") or PROJECT
    items = kept_items(results, folders)
    if folders is None:
        items += report_items(build_specs(results))
    out.mkdir(parents=True, exist_ok=True)
    index_path = out / "exported.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    todo = [i for i in items if index.get(i.id, {}).get("digest") != i.digest()
            or not (out / index[i.id]["run"]).is_dir()]
    gone = set(index) - {i.id for i in items} if folders is None else set()
    for run in gone:
        shutil.rmtree(out / index.pop(run)["run"], ignore_errors=True)
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
            "seconds": time.perf_counter() - start}
