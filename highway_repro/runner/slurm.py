"""SLURM as the queue's second back end, through submitit: each queued command is one SLURM job.

    python -m highway_repro.runner ht_char_ptb --scale cpu --cluster slurm --partition <p> --jobs 16

`--jobs` is then the number of jobs in flight. A job's resources start from a preset, the Hydra launcher files
`configs/hydra/launcher/submitit_cluster.yaml` (`--preset cpu`) and `submitit_cluster_gpu.yaml` (`--preset gpu`),
and take from the table: CPUs = its `threads`, memory = its runs' peak (`estimate.peak_gb`) plus 1 GB, the time
limit = the estimate of the job's runs plus its margin (`estimate.time_limit_min`; the preset's `timeout_min` where
there is no estimate). A preempted job (submitit's USR2, or SIGTERM from `scontrol requeue`) stops its trainer,
which saves a checkpoint at its step, and submitit requeues the job, which resumes (`resume=auto`); so does a job at
its time limit, up to the preset's `max_num_timeout` times. Stopping the runner cancels its jobs; a runner that
died without stopping them (kill -9, a closed laptop) leaves them running, and the same command started again
follows each one still in the queue (its id kept in `cmd-<hash>.job`) instead of submitting it again. The job's files
(submitit's pickles and logs) go to `<runs>/.slurm/`, which the nodes must see (a shared file system).
"""

from __future__ import annotations

import hashlib
import math
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

from highway_repro.errors import ConfigError, make_folder
from highway_repro.targets import CONFIG_DIR, ROOT

PRESETS = {"cpu": "submitit_cluster", "gpu": "submitit_cluster_gpu"}  # configs/hydra/launcher/<file>.yaml


def partitions() -> list[str]:
    """The partitions `sinfo` lists (the default one without its `*`); a ConfigError where SLURM is not here."""
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        raise ConfigError("cluster slurm: no SLURM on this machine (sinfo and sbatch not found; valid: run where "
                          "SLURM's commands are, or leave --cluster out)")
    r = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=60)
    if r.returncode:
        raise ConfigError(f"cluster slurm: sinfo failed: {(r.stderr.strip().splitlines() or ['no output'])[-1]}")
    return [p.rstrip("*") for p in r.stdout.split()]


def preset(name: str) -> dict:
    """The launcher file of preset `name`, its `defaults` (the submitit plugin's own) left out."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "hydra" / "launcher" / f"{PRESETS[name]}.yaml"))
    base = cfg.pop("defaults", [])
    if PRESETS["cpu"] in base:  # a preset on top of the cpu one
        cfg = {**preset("cpu"), **cfg}
    return cfg


def _ignore_usr2() -> None:
    """In the trainer's process: SLURM's USR2 (preemption, a time limit near) goes to every process of the job;
    submitit's handler answers it (`TrainCommand.checkpoint`), the trainer would die of it unsaved."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class TrainCommand:
    """A train command run in a SLURM job (what submitit pickles and calls there): returns its exit status. On
    preemption (USR2) or at its time limit submitit calls `checkpoint`: the trainer gets SIGTERM, saves at its step
    and exits; the job is requeued with the same command, which resumes from that checkpoint. SIGTERM from SLURM
    reaches the trainer too; the job then leaves no result, so that the runner waits for its requeued self (or finds
    it lost)."""

    def __init__(self, cmd: list[str]):
        self.cmd, self.proc = cmd, None

    def __call__(self) -> int:
        stopped = []  # SIGTERM: SLURM ends the job (scontrol requeue, scancel), and the trainer saves and exits
        signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, preexec_fn=_ignore_usr2)  # USR2 is for submitit
        while self.proc.poll() is None or stopped:  # stopped: no result; SLURM requeues the job or it is lost
            time.sleep(1.0)  # (not wait(): its lock would stop `checkpoint`, called from a signal handler)
        return self.proc.returncode

    def checkpoint(self, *args, **kwargs):
        from submitit.helpers import DelayedSubmission

        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait()
        return DelayedSubmission(TrainCommand(self.cmd))

    def __getstate__(self):
        return {"cmd": self.cmd, "proc": None}


ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
          "SUSPENDED", "STAGE_OUT", "SIGNALING", "STOPPED", "PREEMPTED", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
LOST_CHECK_S = 30.0  # how often squeue is asked whether a job without a result is still there


def active(job_id: str) -> bool:
    """Whether SLURM's queue holds the job in an active state (pending, running, requeued, ...)."""
    r = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=60)
    return bool(set(r.stdout.split()) & ACTIVE)


class Job:
    """A submitted command as the queue follows it, as it follows a process: `poll()` (None while it runs, else its
    exit status), `wait()`, `cancel()`, `pid` (`slurm job <id>`). A job that has left squeue's active states without
    a result (a lost node, an admin's scancel; submitit alone would wait on it forever without accounting) is
    `lost`: exit status 1."""

    def __init__(self, job, limit_min: int):
        self.job, self.limit_min, self.returncode, self.lost = job, limit_min, None, False
        self.pid, self.checked = f"slurm job {job.job_id}", time.time()

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        if self.job.paths.result_pickle.exists():
            try:
                self.returncode = int(self.job.result())
            except Exception as e:  # the command raised in the job: its first line
                self.returncode = 1
                print(f"[slurm] {self.pid}: {(str(e).strip().splitlines() or [type(e).__name__])[0]}", flush=True)
        elif time.time() - self.checked > LOST_CHECK_S:
            self.checked = time.time()
            if not active(str(self.job.job_id)) and not self.job.paths.result_pickle.exists():
                self.lost, self.returncode = True, 1
        return self.returncode

    def wait(self) -> int:
        while self.poll() is None:
            time.sleep(1.0)
        return self.returncode

    def cancel(self) -> None:
        self.job.cancel(check=False)


class Cluster:
    """Submits the queue's commands as SLURM jobs to `partition`, resources from `preset` and the table."""

    def __init__(self, partition: str | None, preset_name: str, folder: Path):
        valid = partitions()
        if partition is None or partition not in valid:
            raise ConfigError(f"partition {partition} is not a partition of this SLURM (valid: {', '.join(valid)})")
        self.partition, self.preset, self.folder = partition, preset(preset_name), folder

    def start(self, cmd: list[str], threads: int, peak_gb: float, secs: float | None, name: str) -> Job:
        """Submit one command: a ConfigError naming sbatch's reason where SLURM refuses it."""
        import submitit
        from submitit.core.utils import FailedJobError

        from highway_repro.runner.estimate import time_limit_min

        make_folder(self.folder)
        p = self.preset
        limit = time_limit_min(secs, threads, int(p.get("timeout_min") or 60))
        record = self.folder / f"cmd-{hashlib.sha1(shlex.join(cmd).encode()).hexdigest()[:16]}.job"
        if record.exists() and (old := record.read_text().strip()) and active(old):  # a runner before this one's
            print(f"[{name}] re-attached to slurm job {old}, still in the queue", flush=True)
            return Job(submitit.SlurmJob(folder=self.folder / "%j", job_id=old), limit)
        ex = submitit.AutoExecutor(folder=self.folder / "%j", cluster="slurm",
                                   slurm_max_num_timeout=int(p.get("max_num_timeout") or 0))
        ex.update_parameters(slurm_partition=self.partition, name=name, nodes=int(p.get("nodes") or 1),
                             tasks_per_node=int(p.get("tasks_per_node") or 1),
                             cpus_per_task=max(threads, int(p.get("cpus_per_task") or 1)),
                             gpus_per_node=p.get("gpus_per_node") or None,
                             mem_gb=max(math.ceil(peak_gb) + 1, int(p.get("mem_gb") or 1)),
                             timeout_min=limit,
                             slurm_signal_delay_s=int(p.get("signal_delay_s") or 90),
                             slurm_additional_parameters=dict(p.get("additional_parameters") or {}))
        try:
            job = ex.submit(TrainCommand(cmd))
        except (FailedJobError, subprocess.SubprocessError, OSError) as e:
            why = [line for line in str(e).splitlines() if "error" in line.lower()] or str(e).splitlines() or [""]
            raise ConfigError(f"partition {self.partition}: SLURM refused the job ({why[-1].strip()})") from None
        record.write_text(f"{job.job_id}\n")
        return Job(job, limit)
