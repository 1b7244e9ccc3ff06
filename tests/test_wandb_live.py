"""Runs trained with `logger=wandb` (offline, into tmp_path): one W&B run for a run folder, live or exported (the
same id, name, group, job type, tags, config and logged values), and the runner reports them as it reports any run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from conftest import REPO, compose, needs_mirror
from test_wandb_export import offline, read_offline_run, same

JOB = ["model.width=4", "seed=0"]  # hn_table1's smoke grid: one job
SETTING = ["sweep=hn_table1/smoke", "experiment=hn_table1", "scale=smoke", "resume=auto", "logger=wandb", "threads=1"]


def parent_service(monkeypatch) -> dict:
    """This process, offline, with a W&B service of its own (started here if no test has), named in WANDB_SERVICE,
    which its child processes inherit, as from a notebook or a script that used W&B; its environment."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    wandb.setup()
    assert os.environ["WANDB_SERVICE"].split("-")[1] == str(os.getpid())
    return dict(os.environ)


def train_live(results):
    """hn_table1's smoke job trained with logger=wandb in the folder the runner keeps it in, its .hydra/overrides.yaml
    written first as the job's callback writes it; the run folder."""
    from highway_repro.train import run

    folder = results / "highway_networks" / "runs" / "hn_table1-smoke" / ",".join(sorted(JOB))
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(JOB + SETTING))
    run(compose(JOB + [o for o in SETTING if not o.startswith("sweep=")]), folder)
    return folder


@needs_mirror
def test_a_live_run_and_its_export_are_one_w_and_b_run(tmp_path, monkeypatch):
    """A run trained with logger=wandb, then its folder exported (`make wandb-export`'s code), read back from the two
    .wandb files: the same id, name, group, job type, tags (its table, scale and device: the dashboard's filter) and
    config, and the same value at every step of every key and in the summary."""
    from highway_repro.dashboards.export import export

    offline(monkeypatch, tmp_path)
    folder = train_live(tmp_path / "results")
    (live_dir,) = (folder / "wandb").glob("offline-run-*")
    live = read_offline_run(live_dir)
    out = tmp_path / "export"
    export(tmp_path / "results", out, jobs=1, folders=[folder])
    (entry,) = json.loads((out / "exported.json").read_text()).values()
    kept = read_offline_run(out / entry["run"])
    a, b = live["run"], kept["run"]
    assert (a.run_id, a.display_name, a.run_group, a.job_type) == (b.run_id, b.display_name, b.run_group, b.job_type)
    assert (b.display_name, b.run_group, b.job_type) == ("model.width=4,seed=0", "hn_table1", "train")
    assert sorted(a.tags) == sorted(b.tags) == ["device:cpu", "scale:smoke", "table:hn_table1"]
    assert live["config"] == kept["config"] and kept["config"]["row"] == "model.width=4"
    assert sorted(live["history"]) == sorted(kept["history"]) and len(live["history"]) > 2
    for step, values in kept["history"].items():
        assert values.keys() == live["history"][step].keys(), step
        assert all(same(live["history"][step][k], v) for k, v in values.items()), step
    final = {k: v for k, v in kept["summary"].items() if not k.startswith("_")}
    assert {k: v for k, v in live["summary"].items() if not k.startswith("_")}.keys() == final.keys()
    assert all(same(live["summary"][k], v) for k, v in final.items())


@needs_mirror
@pytest.mark.slow  # a table's four smoke runs and its report, twice: about 30 s on 2 cores
def test_the_runner_with_the_wandb_logger_reports_as_without_it(tmp_path, monkeypatch):
    """`python -m highway_repro.runner demo logger=wandb` trains (through the grouped launcher, whose jobs are set up
    before any trains), reports every run and exits 0, W&B printing nothing; a later runner of the table (nothing
    left to train) and `--report-only` report it again."""
    env = {**parent_service(monkeypatch), "WANDB_DIR": str(tmp_path)}
    base = [sys.executable, "-m", "highway_repro.runner", "demo", "--scale", "smoke", "--runs", str(tmp_path / "runs"),
            "--results", str(tmp_path / "results")]
    for extra in (["logger=wandb", "threads=1", "--group", "auto"], ["logger=wandb", "threads=1"], ["--report-only"]):
        r = subprocess.run(base + extra, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "Traceback" not in r.stderr and "no runs under" not in r.stderr
        assert "wandb:" not in r.stdout + r.stderr
        md = (tmp_path / "results" / "demo" / "demo.md").read_text()
        for depth, kind in ((10, "plain"), (10, "highway"), (50, "plain"), (50, "highway")):
            assert f"| {depth} | {kind} |" in md
    assert len(list((tmp_path / "runs" / "demo-smoke").glob("*/wandb/offline-run-*"))) == 4


def offline_history(folder) -> dict:
    """The history W&B wrote to disk in one offline run folder: {step: {key: value}} (a segment killed with kill -9
    holds what its writer had written: no exit record to wait for)."""
    from test_wandb_export import records

    (file,) = folder.glob("run-*.wandb")
    rows: dict = {}
    for r in records(file):
        if r.WhichOneof("record_type") == "history":
            row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
            rows.setdefault(row["_step"], {}).update({k: v for k, v in row.items() if not k.startswith("_")})
    return rows


def test_a_resumed_w_and_b_run_logs_again_the_steps_its_earlier_segment_lacks(tmp_path, monkeypatch):
    """A W&B run whose first segment holds steps 0-4 on disk and a metrics.jsonl cut back to its checkpoint at step
    8: the resumed logger logs steps 6 and 8 again, with their values, before anything else."""
    from highway_repro.engine.loggers import WandbLogger

    offline(monkeypatch, tmp_path)
    config = {"name": "demo", "scale_name": "smoke", "seed": 0}
    first = WandbLogger(tmp_path, name="job", config=config)
    for step in (0, 2, 4):
        first.log({"train/loss": 1.0 / (step + 1), "train/note": "x"}, step)
    first.finish({"status": "interrupted"})
    read_offline_run(next((tmp_path / "wandb").glob("offline-run-*")))  # (waits for W&B to have written it all)
    lines = [{"step": s, "train/loss": 1.0 / (s + 1)} for s in (0, 2, 4, 6, 8)] + [{"step": 8, "val/loss": "nan"}]
    text = "".join(json.dumps(line) + "\n" for line in lines) + "[6]\n"  # (a line no run writes: passed over)
    (tmp_path / "metrics.jsonl").write_text(text + '{"step": 10, "tr')
    second = WandbLogger(tmp_path, name="job", config=config, resume_id=first.run_id)
    second.truncate_to((tmp_path / "metrics.jsonl").stat().st_size - len('{"step": 10, "tr'))
    second.run.finish()
    segments = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(segments) == 2 and second.run_id == first.run_id
    again = read_offline_run(segments[1])["history"]
    assert sorted(again) == [6, 8] and again[6] == {"train/loss": 1 / 7}
    assert again[8]["train/loss"] == 1 / 9 and again[8]["val/loss"] != again[8]["val/loss"]  # NaN


@needs_mirror
@pytest.mark.slow  # two training processes, one killed: about 40 s on 2 cores
def test_after_kill_9_and_resume_the_w_and_b_history_is_metrics_jsonl(tmp_path, monkeypatch):
    """kill -9 of a run's processes (its W&B service too, as a crash of the machine) after a checkpoint and before W&B
    wrote the steps up to it (checked: the gap is not empty), then resume=auto to the end: the history of the run's
    W&B segments together is metrics.jsonl, step by step and value by value. The training process is the child of one
    with a W&B service of its own (WANDB_SERVICE), which outlives the kill: the run lives in a service of its own."""
    import signal
    import time

    from _faults import IMAGE, _cli, _env
    from highway_repro.engine import checkpoint as ck

    out = tmp_path / "run"
    args = [o for o in IMAGE if not o.startswith("logger=")] + [
        "logger=wandb", "trainer.max_steps=30", "resume=auto", "threads=1", f"hydra.run.dir={out}"]
    parent_service(monkeypatch)
    env = _env()

    def logged() -> list[int]:
        text = (out / "metrics.jsonl").read_text() if (out / "metrics.jsonl").exists() else ""
        return [json.loads(line)["step"] for line in text.splitlines()[:-1]]  # (the last line may be cut)

    p = subprocess.Popen(_cli(args), cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    deadline = time.monotonic() + 240
    while p.poll() is None and time.monotonic() < deadline:
        if (out / "ckpt" / "last.pt").exists() and max(logged(), default=-1) >= 8:
            os.killpg(p.pid, signal.SIGKILL)
            break
        time.sleep(0.002)
    assert p.wait(60) == -signal.SIGKILL
    time.sleep(1)
    checkpoint = ck.load(out / "ckpt" / "last.pt")["step"]
    (first,) = (out / "wandb").glob("offline-run-*")
    gap = {s for s in logged() if s <= checkpoint} - set(offline_history(first))
    assert gap, "W&B had written every step up to the checkpoint: nothing to test"
    r = subprocess.run(_cli(args), cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    segments = sorted((out / "wandb").glob("offline-run-*"))
    assert len(segments) == 2 and len({s.name.rsplit("-", 1)[1] for s in segments}) == 1
    history: dict = {}
    for segment in segments:
        for step, values in offline_history(segment).items():
            history.setdefault(step, {}).update(values)
    lines: dict = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        lines.setdefault(record.pop("step"), {}).update(record)
    assert sorted(history) == sorted(lines) and max(lines) == 30
    for step, values in lines.items():
        assert history[step].keys() == values.keys(), step
        assert all(same(history[step][k], v) for k, v in values.items()), (step, history[step], values)


def test_a_run_never_logs_into_a_w_and_b_service_of_another_process(monkeypatch):
    """WANDB_SERVICE names the process that started the service: a token of another process (inherited) is dropped
    before a W&B run starts, one of this process kept, none left as none."""
    from highway_repro.engine.loggers import own_wandb_service

    me = os.getpid()
    for token, kept in ((f"3-{me + 1}-unix-/tmp/wandb-1-2-3/socket", False), (f"3-{me}-unix-/tmp/wandb-1-2-3/socket",
                        True), (f"3-{me}1-tcp-localhost-4242", False), (f"3-{me}-tcp-localhost-4242", True)):
        env = {"WANDB_SERVICE": token, "PATH": "/bin"}
        own_wandb_service(env)
        assert env == ({"WANDB_SERVICE": token, "PATH": "/bin"} if kept else {"PATH": "/bin"}), token
    env = {"PATH": "/bin"}
    own_wandb_service(env)
    assert env == {"PATH": "/bin"}
