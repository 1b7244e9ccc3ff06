"""The runner on a real SLURM (slurm-wlm and munge, `make slurm-deps`): a private munged, slurmctld and slurmd on
this machine, with their own state folder, socket and ports, started here and stopped by the process ids recorded
when they started, once `squeue` is empty. Skips in one line where the packages are missing or it is not root."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import REPO, needs_mirror

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(what: str, ok, timeout: float = 60.0, logs=()) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if ok():
            return
        time.sleep(0.5)
    tails = "\n".join(f"{p}:\n{p.read_text()[-2000:]}" for p in logs if p.exists())
    raise RuntimeError(f"{what} not ready after {timeout:.0f} s\n{tails}")


def missing() -> str | None:
    """Why a private SLURM cannot start here (one line), None where it can."""
    gone = [c for c in ("munged", "slurmctld", "slurmd", "sbatch", "squeue") if shutil.which(c) is None]
    if gone:
        return f"no SLURM here ({', '.join(gone)} not found; `make slurm-deps` installs slurm-wlm and munge)"
    if os.geteuid() != 0:
        return "a private SLURM needs root (munged runs as the munge user, slurmd as root)"
    return None


@contextlib.contextmanager
def local_slurm():
    """{"env": the environment whose SLURM commands reach this cluster, "partition": its one partition}."""
    import pwd

    munge = pwd.getpwnam("munge")
    d = Path(tempfile.mkdtemp(prefix="hwslurm-", dir="/tmp"))  # a short path: the munge socket's
    d.chmod(0o755)
    m = d / "munge"
    m.mkdir()
    m.chmod(0o711)  # the socket reachable by all, the key by munge only
    (m / "key").write_bytes(os.urandom(1024))
    (m / "key").chmod(0o400)
    for p in (m, m / "key"):
        os.chown(p, munge.pw_uid, munge.pw_gid)
    sock = m / "munge.socket"
    host = socket.gethostname().split(".")[0]
    mem_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    conf = d / "slurm.conf"
    conf.write_text(f"""ClusterName=hwtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
StateSaveLocation={d}/ctld
SlurmdSpoolDir={d}/d
SlurmctldPidFile={d}/ctld.pid
SlurmdPidFile={d}/d.pid
SlurmctldLogFile={d}/ctld.log
SlurmdLogFile={d}/d.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
JobRequeue=1
MaxArraySize=4
ReturnToService=2
MpiDefault=none
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory={mem_mb - 2048} State=UNKNOWN
PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP
""")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs = []
    try:
        procs.append(subprocess.Popen(["munged", "-F", "--key-file", str(m / "key"), "--socket", str(sock),
                                       "--pid-file", str(m / "munged.pid"), "--log-file", str(m / "munged.log"),
                                       "--seed-file", str(m / "seed"), "--force"],
                                      user=munge.pw_uid, group=munge.pw_gid, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        _wait("munged", sock.exists, logs=[m / "munged.log"])
        for cmd in (["slurmctld", "-D", "-i", "-f", str(conf)], ["slurmd", "-D", "-f", str(conf), "-N", host]):
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        def idle():
            r = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True)
            return r.returncode == 0 and r.stdout.split() == ["idle"]

        _wait("the SLURM node", idle, logs=[d / "ctld.log", d / "d.log"])
        yield {"env": env, "partition": "test", "folder": d}
        _wait("an empty squeue", lambda: not subprocess.run(["squeue", "-h"], env=env, capture_output=True,
                                                           text=True).stdout.strip(), timeout=120)
    finally:
        for p in reversed(procs):  # only the daemons started here, by their process ids
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm():
    if (why := missing()) is not None:
        pytest.skip(why)
    with local_slurm() as cluster:
        yield cluster


def _runner(*args: str, env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "highway_repro.runner", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


HEADER = ("- command:", "- wall time:", "- machine:")  # the report's lines that say how and where it ran


def _report_files(results: Path) -> dict:
    """Every report file (not the kept runs) as text, the header's command, wall-time and machine lines left out."""
    out = {}
    for f in sorted(results.rglob("*")):
        if f.is_file() and "runs" not in f.relative_to(results).parts and f.suffix in (".md", ".csv", ".json"):
            out[str(f.relative_to(results))] = [x for x in f.read_text().splitlines() if not x.startswith(HEADER)]
    return out


def _runs(results: Path) -> dict:
    """Each kept run's metrics.json without its times."""
    return {str(f.parent.relative_to(results)): {k: v for k, v in json.loads(f.read_text()).items()
                                                 if not k.startswith(("time/", "perf/"))}
            for f in sorted(results.rglob("metrics.json"))}


@needs_mirror
def test_a_table_on_slurm_equals_the_table_run_locally(slurm, tmp_path):
    """ht_char_ptb at the smoke scale (5 runs) through the runner on SLURM with --detach, each run a job of an array
    of at most MaxArraySize (4 here: two arrays), 2 in flight across both; the same command later follows the jobs it
    submitted (none submitted twice). Against the table run locally: the same runs bit for bit (their times aside),
    the same reports and summary (their header's command, wall-time and machine lines aside); on SLURM again over
    the local kept runs: each restored, no job submitted."""
    env = {**slurm["env"], "HIGHWAY_DATA_MIRROR": os.environ["HIGHWAY_DATA_MIRROR"]}
    local = _runner("ht_char_ptb", "--scale", "smoke", "--runs", str(tmp_path / "l" / "runs"), "--results",
                    str(tmp_path / "l" / "results"), env=env)
    assert local.returncode == 0, local.stderr[-3000:]
    cluster = ["--cluster", "slurm", "--partition", slurm["partition"], "--jobs", "2"]
    table = ["ht_char_ptb", "--scale", "smoke", *cluster, "--runs", str(tmp_path / "s" / "runs"), "--results",
             str(tmp_path / "s" / "results")]
    r = _runner(*table, "--detach", env=env)
    ids = re.findall(r"\+ slurm job (\S+) ", r.stdout)
    assert r.returncode == 0 and len(ids) == 5 and "5 submitted, " in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    arrays = {i.split("_")[0] for i in ids}
    assert len(arrays) == 2 and sorted(i.partition("_")[2] for i in ids) == ["", "0", "1", "2", "3"], ids
    pending = subprocess.run(["squeue", "-h", "-r", "-o", "%i"], env=env, capture_output=True, text=True).stdout
    assert set(pending.split()) & set(ids), pending  # detached: its jobs go on without it
    r = _runner(*table, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    followed = re.findall(r"\+ slurm job (\S+) ", r.stdout)
    assert set(followed) <= set(ids) and r.stdout.count("re-attached to slurm job") == len(followed), r.stdout
    assert _runs(tmp_path / "s" / "results") == _runs(tmp_path / "l" / "results") != {}
    info = [json.loads(f.read_text()) for f in (tmp_path / "s" / "results").rglob("run_info.json")]
    assert len(info) == 5 and all(i["slurm_job"] and i["host"] and i["world_size"] == 1 for i in info), info
    local_info = [json.loads(f.read_text()) for f in (tmp_path / "l" / "results").rglob("run_info.json")]
    assert len(local_info) == 5 and all(i["slurm_job"] is None for i in local_info)
    assert _report_files(tmp_path / "s" / "results") == _report_files(tmp_path / "l" / "results")
    r = _runner("ht_char_ptb", "--scale", "smoke", *cluster, "--runs", str(tmp_path / "again"), "--results",
                str(tmp_path / "l" / "results"), env=env)
    assert r.returncode == 0 and "5 finished (5 restored" in r.stdout and "+ slurm job" not in r.stdout, r.stdout


def test_an_unknown_partition_and_a_refused_job_are_one_line(slurm, tmp_path):
    """A partition SLURM does not have; a GPU asked of a node without one (the gpu preset): one line, exit 2."""
    base = ["hn_table1", "--scale", "smoke", "--cluster", "slurm", "--runs", str(tmp_path / "runs"), "--results",
            str(tmp_path / "results")]
    r = _runner(*base, "--partition", "nope", env=slurm["env"])
    assert r.returncode == 2 and r.stderr.strip() == (f"error: partition nope is not a partition of this SLURM "
                                                      f"(valid: {slurm['partition']})"), r.stderr[-2000:]
    r = _runner(*base, "--partition", slurm["partition"], "--preset", "gpu", env=slurm["env"])
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and last.startswith("error: partition test: SLURM refused the job ("), r.stderr[-2000:]


def test_the_private_slurm_runs_a_job(slurm):
    r = subprocess.run(["srun", "-p", slurm["partition"], "hostname"], env=slurm["env"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr


@needs_mirror
def test_a_run_survives_requeue_preemption_a_time_limit_and_scancel_as_if_never_stopped(slurm, tmp_path):
    """One run of 6,000 smoke steps on SLURM, its job asked for 10 minutes (submitit then takes any USR2 for a time
    limit, counted against the preset's `max_num_timeout`): `scontrol requeue` (SIGTERM), submitit's preemption signal
    (USR2), the job's time limit cut to the minute it is in (SLURM's USR2, 60 s before it) and an admin's `scancel`
    each stop it mid-run; the trainer saves at its step, the job is requeued (the first three; SLURM holds a requeued
    job ~2 min, released here with StartTime=now) or found lost and submitted again by the runner (the last); the run
    ends identical to the same run never stopped, locally."""
    env = {**slurm["env"], "HIGHWAY_DATA_MIRROR": os.environ["HIGHWAY_DATA_MIRROR"]}
    run = ["ht_char_ptb", "--scale", "smoke", "variant=baseline", "seed=0", "trainer.max_steps=6000",
           "trainer.eval_every=0", "trainer.log_every=100", "trainer.checkpoint_every=100000"]  # no periodic one
    folder = (tmp_path / "s" / "runs" / "ht_char_ptb-smoke"
              / "seed=0,trainer.eval_every=0,trainer.max_steps=6000,variant=baseline")

    def step() -> int:
        try:
            return max(json.loads(x)["step"] for x in (folder / "metrics.jsonl").read_text().splitlines()[:-1])
        except (OSError, ValueError):
            return 0

    def job() -> str:
        out = subprocess.run(["squeue", "-h", "-o", "%i %T"], env=env, capture_output=True, text=True).stdout.split()
        return out[0] if out and out[1] == "RUNNING" else ""

    def timed_out() -> int:
        return sum(p.read_text().count("this job is timed-out") for p in (tmp_path / "s" / "runs").rglob("*_log.err"))

    def time_limit(j: str) -> None:
        """Cut the job's limit to the end of the minute it is in, its trainer paused (SIGSTOP) until SLURM's timer
        (every 30 s) sends USR2, so that a fast machine does not end the run first."""
        trainers = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _has(p, str(folder.parent))]
        for pid in trainers:
            os.kill(pid, signal.SIGSTOP)
        before = timed_out()
        used = subprocess.run(["squeue", "-h", "-j", j, "-o", "%M"], env=env, capture_output=True, text=True).stdout
        subprocess.run(["scontrol", "update", f"JobId={j}", f"TimeLimit={int(used.split(':')[-2]) + 1}"], env=env,
                       check=True)
        _wait("SLURM's USR2 at the time limit", lambda: timed_out() > before, timeout=120)
        for pid in trainers:  # (one that died while paused, as a trainer with no SIGTERM handler does: checked below)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def state(j: str) -> str:
        return subprocess.run(["squeue", "-h", "-j", j, "-o", "%T"], env=env, capture_output=True,
                              text=True).stdout.strip()

    runner = subprocess.Popen([sys.executable, "-m", "highway_repro.runner", *run, "--cluster", "slurm",
                               "--partition", slurm["partition"], "hydra.launcher.timeout_min=10",
                               "hydra.launcher.signal_delay_s=60", "--runs", str(tmp_path / "s" / "runs"),
                               "--results", str(tmp_path / "s" / "results")], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        at = 0
        for stop in (["scontrol", "requeue"], ["scancel", "--signal=USR2"], ["time limit"], ["scancel"]):
            _wait(f"training past step {at + 500}", lambda: step() >= at + 500 and job(), timeout=180)
            j = job()
            time_limit(j) if stop == ["time limit"] else subprocess.run([*stop, j], env=env, check=True)
            _wait("the job to stop", lambda: job() != j, timeout=90)
            if stop != ["scancel"]:  # requeued: held by SLURM for ~2 min once pending
                _wait("the job to be requeued", lambda: state(j) == "PENDING", timeout=90)
                subprocess.run(["scontrol", "update", f"JobId={j}", "StartTime=now", "TimeLimit=10"], env=env,
                               check=True)
            at = step()
        out, _ = runner.communicate(timeout=300)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 0, out[-3000:]
    ctld = [x for x in (slurm["folder"] / "ctld.log").read_text(errors="replace").splitlines()
            if re.search(r"requeue|cancel|complete|JobId=", x, re.I)]  # what SLURM did with each job, for a failure
    lost = out.count("was lost without a result: submitted again")  # the admin's scancel (SLURM has been seen, under
    assert lost >= 1, out[-3000:]  # load, to drop a job submitit had requeued: then it is found lost and resubmitted)
    assert timed_out() == 2  # USR2 and the time limit
    logs = [p.read_text() for p in (tmp_path / "s" / "runs").rglob("*_log.out")]
    assert sum(x.count("Requeued job") for x in logs) == 2, "\n".join(ctld[-60:])  # each requeued by submitit
    resumed = [int(x.rsplit(" ", 1)[1]) for x in (folder / "train.log").read_text().splitlines()
               if "resumed from" in x]  # "... resumed from <ckpt> at step N": the step each stop came at
    assert len(resumed) == 4 and 0 < resumed[0] < resumed[1] < resumed[2] < resumed[3], resumed
    local = _runner(*run, "--runs", str(tmp_path / "l" / "runs"), "--results", str(tmp_path / "l" / "results"),
                    env=env)
    assert local.returncode == 0, local.stderr[-3000:]
    assert _runs(tmp_path / "s" / "results") == _runs(tmp_path / "l" / "results") != {}


def _has(proc: Path, text: str) -> bool:
    """Whether a process (/proc/<pid>) is a trainer whose command line holds `text`."""
    try:
        cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return "highway_repro.train" in cmd and text in cmd


@needs_mirror
def test_a_runner_killed_mid_run_and_started_again_follows_its_job(slurm, tmp_path):
    """kill -9 of the runner leaves its job running; the same command started again follows that job (no second
    job trains the run) and ends with the run finished, never stopped."""
    env = {**slurm["env"], "HIGHWAY_DATA_MIRROR": os.environ["HIGHWAY_DATA_MIRROR"]}
    cmd = [sys.executable, "-m", "highway_repro.runner", "ht_char_ptb", "--scale", "smoke", "variant=baseline",
           "seed=0", "trainer.max_steps=3000", "trainer.eval_every=0", "trainer.log_every=100", "--cluster", "slurm",
           "--partition", slurm["partition"], "--runs", str(tmp_path / "runs"), "--results", str(tmp_path / "results")]
    folder = (tmp_path / "runs" / "ht_char_ptb-smoke"
              / "seed=0,trainer.eval_every=0,trainer.max_steps=3000,variant=baseline")
    first = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait("training to start", lambda: (folder / "metrics.jsonl").exists() and
          len((folder / "metrics.jsonl").read_text().splitlines()) > 3, timeout=120)
    first.kill()
    out = first.communicate()[0]
    assert out.count("+ slurm job ") == 1, out
    again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    ids = [re.findall(r"\+ slurm job (\d+)", x) for x in (out, again.stdout)]
    assert "re-attached to slurm job" in again.stdout and ids[0] == ids[1] != [], again.stdout[-3000:]
    assert json.loads((folder / "metrics.json").read_text())["status"] == "done"
    assert "resumed from" not in (folder / "train.log").read_text()


def test_ctrl_c_on_the_runner_cancels_its_jobs_in_one_line(slurm, tmp_path):
    """SIGINT to the runner while its jobs (long runs) are queued or running: one scancel of them all, said in one
    line; exit 130, squeue empty of them within a minute (the running one saves at its step first)."""
    env = {**slurm["env"], "HIGHWAY_DATA_MIRROR": os.environ.get("HIGHWAY_DATA_MIRROR", "")}
    runner = subprocess.Popen([sys.executable, "-m", "highway_repro.runner", "ht_char_ptb", "--scale", "smoke",
                               "trainer.max_steps=1000000", "--cluster", "slurm", "--partition", slurm["partition"],
                               "--jobs", "1", "--runs", str(tmp_path / "runs"), "--results", str(tmp_path / "results")],
                              cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait("the jobs to be submitted", lambda: len(list((tmp_path / "runs" / ".slurm").glob("cmd-*.job"))) == 5,
          timeout=120)
    runner.send_signal(signal.SIGINT)
    out, _ = runner.communicate(timeout=120)
    ids = re.findall(r"\+ slurm job (\S+) ", out)
    assert runner.returncode == 130 and len(ids) == 5, out[-3000:]
    assert [x for x in out.splitlines() if "cancelled" in x] == [f"[slurm] cancelled 5 job(s): {' '.join(ids)}"], out
    _wait("squeue without them", lambda: not set(subprocess.run(["squeue", "-h", "-r", "-o", "%i"], env=env,
          capture_output=True, text=True).stdout.split()) & set(ids), timeout=60)
