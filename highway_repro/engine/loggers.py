"""Run logging: metrics.jsonl (one line per log step), metrics.json (final), run_info.json, W&B.

Every metric is keyed `split/name` (`train/loss`, `val/bpc`, `test/acc`,
`model/params`, `gates/<layer>/mean`). Tables and plots are built from the
files, never from a web API; W&B is an optional mirror (offline by default).
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from highway_repro import files
from highway_repro.errors import HighwayError


def _clean(v):
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return str(v)
    return v


def discard(tmp: Path) -> None:
    """Remove a temp file of a failed write, if it was created (on a read-only folder it never was)."""
    try:
        Path(tmp).unlink(missing_ok=True)
    except OSError:
        pass


def write_json_atomic(path: Path, obj) -> None:
    """`obj` as JSON into `path`, atomically (`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str))


def write_text_atomic(path: Path, text: str) -> None:
    """Write `path` through a temp file, fsync and a rename (`files.write_atomic`), so a reader sees the old file or
    the whole new one, and a link at `path` is replaced, never written through; a write that fails (a full disk, a
    read-only folder: `StorageError` naming `path`) or is cut by a signal leaves no temp file."""
    files.write_atomic(Path(path), text)


def cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo (None where there is none); also used by the benchmarks."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_bf16_features() -> list[str]:
    """The CPU's bf16 features as its flags list them (/proc/cpuinfo: avx512_bf16, amx_bf16); elsewhere oneDNN's own
    check. Used by the GPU check (which bf16 cases a CPU can run) and the benchmarks' precision section."""
    try:
        flags = next((ln.split(":", 1)[1].split() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                      if ln.startswith("flags")), [])
        return [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    except OSError:
        import torch

        return ["mkldnn_bf16"] if torch.ops.mkldnn._is_mkldnn_bf16_supported() else []


def cuda_device() -> str | None:
    """The name of the machine's first CUDA device (None without one): run_info.json's `cuda_device`, which says
    whether a run was made on a GPU (kept apart at the reduced scales, `targets.runs_folder`)."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


@functools.cache
def _git_commit() -> str | None:
    """The commit of the code that runs (None outside a git checkout or without git): the checkout's HEAD when this
    process first asks, at its first run's start; a process trains with the code it loaded, whatever the checkout
    moves to while it runs (a multirun of many jobs, a group)."""
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                           text=True, timeout=10)
        return (r.stdout.strip() or None) if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def write_run_info(out_dir: Path, **extra) -> dict:
    """Write (or update) `<run>/run_info.json`: the machine and software a run trained on, for the reports.

    Fields: machine, cpu_model (/proc/cpuinfo, else null), cpu_count, torch, python, cuda_device (null without
    CUDA), threads (torch.get_num_threads()), git_commit (null when unknown), host, slurm_job (SLURM's job id, with
    `_<array index>` in an array; null outside SLURM), world_size (processes, torchrun's WORLD_SIZE), plus `extra`
    (`highway_repro.train` passes
    start_time at the start, end_time and peak_rss_gb at the end). An existing file is updated: a resumed run keeps
    its first start_time and records the machine of its latest segment.
    """
    import torch

    path = Path(out_dir) / "run_info.json"
    info = files.read_json(path, kind=dict) or {}  # (a received folder's: a damaged one is one KeptFileError line)
    if "start_time" in info:
        extra.pop("start_time", None)
    info.update({
        "machine": platform.machine(), "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
        "torch": torch.__version__, "python": platform.python_version(),
        "cuda_device": cuda_device(),
        "threads": torch.get_num_threads(), "git_commit": _git_commit(), "host": platform.node(),
        "slurm_job": _slurm_job(), "world_size": int(os.environ.get("WORLD_SIZE") or 1), **extra})
    write_json_atomic(path, info)
    return info


def _slurm_job() -> str | None:
    """SLURM's id of the job this process runs in (`<array job>_<index>` in an array), None outside SLURM."""
    array, index = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{index}" if array and index else os.environ.get("SLURM_JOB_ID")


def now() -> str:
    """The current UTC time, ISO 8601 to the second (run_info.json's start_time / end_time)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class JsonlLogger:
    """Appends one JSON object per log call to `<run>/metrics.jsonl`."""

    def __init__(self, out_dir: Path, **_):
        self.path = Path(out_dir) / "metrics.jsonl"

    def truncate_after(self, step: int) -> None:
        """On resume: drop lines logged after the checkpoint's step (they will be logged again)."""
        blob = files.read_bytes(self.path)
        if blob is None:
            return
        keep = []
        for line in blob.splitlines():
            try:
                record = files.parse_json(line, self.path)
            except files.KeptFileError:  # a line cut by a kill
                continue
            if isinstance(record, dict) and record.get("step", 0) <= step:
                keep.append(line + b"\n")
        files.write_atomic(self.path, b"".join(keep))

    def position(self) -> int:
        """The size of metrics.jsonl in bytes (stored in checkpoints)."""
        return self.path.stat().st_size if self.path.exists() else 0

    def truncate_to(self, position: int) -> None:
        """On resume: cut metrics.jsonl back to `position` bytes (what was logged up to the checkpoint)."""
        if self.path.exists() and self.path.stat().st_size > position:
            os.truncate(self.path, position)

    def log(self, metrics: dict, step: int) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, **{k: _clean(v) for k, v in metrics.items()}}) + "\n")

    def finish(self, final: dict) -> None:
        pass


def own_wandb_service(env) -> None:
    """Drop from `env` (os.environ) a W&B service that another process started: W&B names its service in
    WANDB_SERVICE (`<version>-<pid of the process that started it>-unix-<socket>` or `...-tcp-localhost-<port>`) and a
    child process inherits it, so a run started there would live in its parent's service, where a kill -9 of the
    run's process leaves it open and its resume fails ("run ID ... in use"). Without it, the first W&B run of this
    process starts a service of its own, which dies with it; a service this process started is kept."""
    token = env.get("WANDB_SERVICE")
    if token and token.split("-")[1:2] != [str(os.getpid())]:
        env.pop("WANDB_SERVICE")


class WandbLogger(JsonlLogger):
    """metrics.jsonl plus a W&B run (offline by default: works without a network;
    `wandb sync <run>/wandb/offline-run-*` uploads it later).

    The W&B run is the one `make wandb-export` gives the run folder once it is kept (`report.identity`): its id,
    name, group, job type, config, and tags (each report that will read it, its scale, its device), from the folder's
    `.hydra/overrides.yaml`, the config and the machine, never from Hydra's state of the process (a group's members
    are set up by other jobs). `name`: another job name (the id follows it); `group`: another group; `tags`: more
    tags; `silent`: no W&B lines on the console."""

    def __init__(self, out_dir: Path, project: str = "highway-repro", group: str | None = None,
                 name: str | None = None, tags=(), mode: str = "offline", silent: bool = True,
                 config: dict | None = None, resume_id: str | None = None, **_):
        super().__init__(out_dir)
        import wandb

        from highway_repro.report import identity as who_is
        from highway_repro.targets import kept_apart

        own_wandb_service(os.environ)
        self.wandb, config = wandb, config or {}
        job, overrides = who_is.job_of(Path(out_dir))
        job = job if name is None else name
        device, scale = cuda_device(), str(config.get("scale_name", ""))
        table = who_is.table_of(overrides, str(config.get("name", "")), job)
        who = who_is.identity(config, job, device,
                              who_is.readers(table, scale, job, apart=bool(device) and kept_apart(scale)))
        more = [t for t in tags or () if t not in who["tags"]]
        self.run = wandb.init(project=project, group=group or who["group"], name=who["name"],
                              job_type=who["job_type"], tags=who["tags"] + more,
                              mode=mode, dir=str(out_dir), config=who["config"], id=resume_id or who["id"],
                              resume="allow" if resume_id else None, settings=wandb.Settings(silent=silent),
                              reinit="create_new")  # its own run: a group's members log into theirs at once
        who_is.define_summaries(self.run)
        self.summaries = who_is.SUMMARIES
        self.run_id = self.run.id

    def log(self, metrics: dict, step: int) -> None:
        super().log(metrics, step)
        self.run.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)

    def truncate_to(self, position: int) -> None:
        super().truncate_to(position)
        self.catch_up()

    def truncate_after(self, step: int) -> None:
        super().truncate_after(step)
        self.catch_up()

    def catch_up(self) -> int:
        """On resume, once metrics.jsonl is cut back to the checkpoint: log again the lines W&B lacks, those beyond
        the last step that this W&B run's earlier segments in `<run>/wandb/` hold on disk (a process killed with
        kill -9 loses what W&B had not yet written), so that the W&B history goes on whole. Returns the lines
        logged."""
        last = wandb_last_step(self.path.parent / "wandb", self.run.id, Path(self.run.dir).parent)
        n = 0
        for line in (files.read_bytes(self.path) or b"").splitlines():  # (a link or an oversized file: refused)
            try:
                record = files.parse_json(line, self.path)
                step = int(record.pop("step")) if isinstance(record, dict) else None
            except (files.KeptFileError, KeyError, TypeError, ValueError):
                continue
            if step is None:
                continue
            if last is None or step > last:
                values = {k: float(v) if v in ("nan", "inf", "-inf") else v for k, v in record.items()}
                self.run.log({k: v for k, v in values.items() if isinstance(v, (int, float))}, step=step)
                n += 1
        return n

    def finish(self, final: dict) -> None:
        for k, v in final.items():
            if isinstance(v, (int, float, str)) and k not in self.summaries:  # (those: their lowest and last value)
                self.run.summary[k] = v
        self.run.finish()


def wandb_records(blob: bytes):
    """The records of a W&B run file (`run-<id>.wandb`, W&B's LevelDB-style log: a 7-byte header, then 32 KiB
    blocks of chunks, each with a 7-byte header: checksum, length, type 1 full, 2 first, 3 middle, 4 last), as
    W&B's protobuf `Record`s, up to the first cut or damaged one (a file its writer was killed in the middle of)."""
    import struct

    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb

    block, pos, buf = 32768, 7, b""
    if blob[:4] != b":W&B":
        return
    while pos + 7 <= len(blob):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", blob[pos:pos + 7])
        if kind == 0 or pos + 7 + n > len(blob):
            return
        buf, pos = buf + blob[pos + 7:pos + 7 + n], pos + 7 + n
        if kind in (1, 4):
            record = pb.Record()
            try:
                record.ParseFromString(buf)
            except DecodeError:
                return
            yield record
            buf = b""


WANDB_FILE_BYTES = 2**30  # a W&B run file larger than this is refused unread


def wandb_last_step(folder: Path, run_id: str, current: Path | None = None) -> int | None:
    """The last history step that the segments of W&B run `run_id` under `folder` (`<run>/wandb/`: one
    `offline-run-*-<id>` or `run-*-<id>` folder per start of the run) hold on disk, the segment `current` left out;
    None when none holds a step. Read as kept files (`files.read_bytes`: a link below `folder` is refused)."""
    steps = []
    for f in sorted(Path(folder).glob(f"*run-*-{run_id}*/run-{run_id}.wandb")):
        if f.parent == current:
            continue
        for record in wandb_records(files.read_bytes(f, folder, limit=WANDB_FILE_BYTES) or b""):
            if record.WhichOneof("record_type") == "history":
                steps += [int(json.loads(i.value_json)) for i in record.history.item
                          if (i.key or "/".join(i.nested_key)) == "_step"]
    return max(steps, default=None)


LOGGERS = {"jsonl": JsonlLogger, "wandb": WandbLogger}


def build_logger(kind: str, out_dir: Path, **kwargs):
    if kind not in LOGGERS:
        raise HighwayError(f"logger.kind={kind!r} is not known (valid: {', '.join(LOGGERS)})")
    return LOGGERS[kind](out_dir, **kwargs)
