"""SLURM as the queue's second back end, through submitit: a table's commands as job arrays (docs/cluster.md) of at
most `MaxArraySize` jobs, `--jobs` the cap on all of a runner's jobs in flight (its lanes); each command's job id kept
in `<runs>/.slurm/cmd-<hash>.job`, so that the same command started again follows it."""

from __future__ import annotations

import getpass
import hashlib
import math
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

from highway_repro.errors import ConfigError, make_folder
from highway_repro.runner.estimate import time_limit_min
from highway_repro.targets import CONFIG_DIR, ROOT

PRESETS = {"cpu": "submitit_cluster", "gpu": "submitit_cluster_gpu"}  # configs/hydra/launcher/<file>.yaml
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
          "SUSPENDED", "STAGE_OUT", "SIGNALING", "STOPPED", "PREEMPTED", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
LOST_CHECK_S = 30.0  # how often squeue is asked which jobs are still there


def _slurm(*cmd: str) -> str:
    """A SLURM command's output; a ConfigError in one line where SLURM is not here or the command fails."""
    if shutil.which(cmd[0]) is None or shutil.which("sbatch") is None:
        raise ConfigError("cluster slurm: no SLURM on this machine (sinfo and sbatch not found; valid: run where "
                          "SLURM's commands are, or leave --cluster out)")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if r.returncode:
        raise ConfigError(f"cluster slurm: {cmd[0]} failed: {(r.stderr.strip().splitlines() or ['no output'])[-1]}")
    return r.stdout


def preset(name: str) -> dict:
    """The launcher file of preset `name`, its `defaults` (the submitit plugin's own) left out."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "hydra" / "launcher" / f"{PRESETS[name]}.yaml"))
    return {**(preset("cpu") if PRESETS["cpu"] in cfg.pop("defaults", []) else {}), **cfg}


class TrainCommand:
    """A train command run in a SLURM job (submitit pickles it). Preempted (USR2) or at its time limit (`checkpoint`),
    or SIGTERM from SLURM: the trainer gets SIGTERM, saves and exits; the job leaves no result and is requeued."""

    def __init__(self, cmd: list[str]):
        self.cmd, self.proc = cmd, None

    def __call__(self) -> int:
        stopped = []
        signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
        # SLURM's USR2 goes to every process of the job: it is for submitit's handler, not for the trainer
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT,
                                     preexec_fn=lambda: signal.signal(signal.SIGUSR2, signal.SIG_IGN))
        while self.proc.poll() is None or stopped:  # stopped: no result; SLURM requeues the job or it is lost
            time.sleep(1.0)  # (not wait(): its lock would stop `checkpoint`, called from a signal handler)
        return self.proc.returncode

    def checkpoint(self, *args, **kwargs):
        from submitit.helpers import DelayedSubmission

        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait()
        return DelayedSubmission(TrainCommand(self.cmd))


class Job:
    """A command's SLURM job as the queue follows a process (`poll()`, `pid`); one that left squeue without a result
    (a lost node, an admin's scancel: submitit alone would wait forever without accounting) is `lost`: status 1."""

    def __init__(self, cluster: "Cluster", job, cmd: list[str], secs, limit_min: int, tries: int = 0):
        self.cluster, self.job, self.cmd, self.secs, self.limit_min = cluster, job, cmd, secs, limit_min
        self.id, self.since, self.tries, self.returncode, self.lost = str(job.job_id), time.time(), tries, None, False
        self.gone: set[int] = set()  # the squeue readings (`Cluster.reads`) it was missing from, in a row
        cluster.followed.append(self)
        self.pid = f"slurm job {self.id}"
        print(f"+ {self.pid} ({limit_min} min):", shlex.join(cmd), flush=True)

    def poll(self) -> int | None:
        if self.returncode is None and self.job.paths.result_pickle.exists():
            try:
                self.returncode = int(self.job.result())
            except Exception as e:  # the command raised in the job: its first line
                self.returncode = 1
                print(f"[slurm] {self.pid}: {(str(e).strip().splitlines() or [type(e).__name__])[0]}", flush=True)
        elif self.returncode is None:  # lost: missing from two readings of squeue in a row (one: between two states)
            c = self.cluster
            c.refresh()
            self.gone = self.gone | {c.reads} if c.seen > self.since and c.states.get(self.id) not in ACTIVE else set()
            if len(self.gone) >= 2 and not self.job.paths.result_pickle.exists():
                self.lost, self.returncode = True, 1
        return self.returncode


class Cluster:
    """Submits the queue's commands as SLURM job arrays to `partition`, resources from `preset` and the table;
    `request`: `hydra.launcher.<key>=<value>` overrides of the preset (`timeout_min`: every job's time limit)."""

    def __init__(self, partition: str | None, preset_name: str, folder: Path, jobs: int, detach: bool = False,
                 request: list[str] = ()):
        valid = [p.rstrip("*") for p in _slurm("sinfo", "-h", "-o", "%P").split()]
        if partition is None or partition not in valid:
            raise ConfigError(f"partition {partition} is not a partition of this SLURM (valid: {', '.join(valid)})")
        self.partition, self.preset, self.folder, self.jobs = partition, preset(preset_name), folder, jobs
        for o in request:
            key, _, value = o.removeprefix("hydra.launcher.").partition("=")
            if key not in self.preset:
                raise ConfigError(f"{o}: {key} is not a key of the job request (valid: {', '.join(self.preset)})")
            self.preset[key] = __import__("yaml").safe_load(value)
        self.limit = int(self.preset["timeout_min"]) if any(".timeout_min=" in o for o in request) else None
        found = re.search(r"^MaxArraySize\s*=\s*(\d+)\s*$", _slurm("scontrol", "show", "config"), re.M)
        self.max_array = int(found[1]) if found else 1001  # array indices stay below it; SLURM's default
        self.detach, self.states, self.seen, self.reads = detach, {}, 0.0, 0
        # every job this runner follows (finished and lost ones too); [[jobs at once, its last array's id]]; next lane
        self.followed, self.lanes, self.turn = [], [], 0

    def refresh(self, force: bool = False) -> None:
        """squeue's state of this user's jobs ({id: state}, array tasks one by one), at most every LOST_CHECK_S."""
        if force or time.time() - self.seen > LOST_CHECK_S:
            self.seen, self.reads = time.time(), self.reads + 1  # the time and count of squeue's readings
            out = _slurm("squeue", "-u", getpass.getuser(), "-r", "-h", "-o", "%i %T")
            self.states = dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)

    def submit(self, tables: list[tuple[object, list[tuple[list[str], float | None]]]], tries: int = 0) -> list:
        """[(plan, Job)] of each table's commands ((plan, [(cmd, one-thread seconds)])): a job still queued followed,
        the others as arrays in the runner's lanes; a ConfigError names sbatch's reason where SLURM refuses them."""
        import submitit
        from submitit.core.utils import FailedJobError

        make_folder(self.folder)
        record = {shlex.join(c): self.folder / f"cmd-{hashlib.sha1(shlex.join(c).encode()).hexdigest()[:16]}.job"
                  for _, items in tables for c, _ in items}
        old = {k: r.read_text().strip() for k, r in record.items() if r.exists()}
        self.refresh(force=bool(old) or bool(tries))
        p, out, arrays = self.preset, [], []
        waiting = {k.split("_")[0] for k, state in self.states.items() if state in ACTIVE}  # arrays still queued
        for plan, items in tables:
            new = []
            for cmd, secs in items:
                limit = self.limit or time_limit_min(secs, plan.threads, int(p.get("timeout_min") or 60))
                if self.states.get(old.get(shlex.join(cmd))) in ACTIVE:  # a runner before this one's
                    job = submitit.SlurmJob(folder=self.folder / "%j", job_id=old[shlex.join(cmd)])
                    out.append((plan, Job(self, job, cmd, secs, limit, tries)))
                    print(f"[{plan.name}] re-attached to {out[-1][1].pid}, still in the queue", flush=True)
                else:
                    new.append((cmd, secs, limit))
            arrays += [(plan, new[i:i + self.max_array]) for i in range(0, len(new), self.max_array)]
        if not self.lanes and arrays:  # min(arrays, jobs) lanes, each one array at a time (the next waits: `afterany`)
            n = min(len(arrays), self.jobs)  # with its share of `jobs` by the jobs it holds: never more in flight
            held = [sum(len(c) for _, c in arrays[k::n]) for k in range(n)]
            self.lanes = [[1 + (self.jobs - n) * h // sum(held), None] for h in held]
        ex = submitit.AutoExecutor(folder=self.folder / "%j", cluster="slurm",
                                   slurm_max_num_timeout=int(p.get("max_num_timeout") or 0))
        for k, (plan, chunk) in enumerate(arrays):
            lane = self.lanes[(self.turn + k) % len(self.lanes)]
            ex.update_parameters(slurm_partition=self.partition, name=plan.name, nodes=int(p.get("nodes") or 1),
                                 tasks_per_node=int(p.get("tasks_per_node") or 1),
                                 cpus_per_task=max(plan.threads, int(p.get("cpus_per_task") or 1)),
                                 gpus_per_node=p.get("gpus_per_node") or None,
                                 mem_gb=max(math.ceil(plan.peak_gb) + 1, int(p.get("mem_gb") or 1)),
                                 timeout_min=max(limit for *_, limit in chunk), slurm_array_parallelism=lane[0],
                                 slurm_signal_delay_s=int(p.get("signal_delay_s") or 90),
                                 slurm_additional_parameters={**(p.get("additional_parameters") or {}),
                                                              **({"dependency": f"afterany:{lane[1]}"}
                                                                 if lane[1] in waiting else {})})
            try:
                jobs = ex.submit_array([TrainCommand(cmd) for cmd, *_ in chunk])
            except (FailedJobError, subprocess.SubprocessError, OSError) as e:
                why = [line for line in str(e).splitlines() if "error" in line.lower()] or str(e).splitlines() or [""]
                self.cancel([job for _, job in out])  # none of this call's jobs left running unfollowed
                raise ConfigError(f"partition {self.partition}: SLURM refused the job ({why[-1].strip()})") from None
            lane[1] = str(jobs[0].job_id).split("_")[0]  # the lane's next array waits for this one to end
            waiting.add(lane[1])
            for job, (cmd, secs, _) in zip(jobs, chunk):
                record[shlex.join(cmd)].write_text(f"{job.job_id}\n")
                out.append((plan, Job(self, job, cmd, secs, max(limit for *_, limit in chunk), tries)))
        self.turn += len(arrays)
        return out

    def cancel(self, jobs: list[Job]) -> None:
        """Cancel the jobs with one scancel, said in one line."""
        ids = [j.id for j in jobs if j.returncode is None]
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True, timeout=60)
            print(f"[slurm] cancelled {len(ids)} job(s): {' '.join(ids)}", flush=True)

    def line(self) -> str:
        """`N submitted, R running, F finished, L lost` of this runner's jobs (one lost and submitted again: two)."""
        self.refresh()
        jobs = self.followed
        running = sum(self.states.get(j.id) == "RUNNING" for j in jobs if j.returncode is None)
        finished = sum(j.returncode is not None and not j.lost for j in jobs)
        return f"{len(jobs)} submitted, {running} running, {finished} finished, {sum(j.lost for j in jobs)} lost"
