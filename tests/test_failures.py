"""The failure tables of docs/failures.md: each row's case gives one line starting
with `error: ` and exit code 2 (128 + signal for a stop signal), without a traceback.

In-process where the case allows it (the command's own entry point with its argv), as subprocesses (`-m slow`)
where it needs a real process: a file-size limit, a signal at a chosen moment.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from conftest import REPO, compose, needs_mirror, run_cli

SMOKE = ["experiment=demo", "scale=smoke", "model.depth=3", "trainer.max_steps=4", "threads=1", "logger=jsonl"]


def refused(code: int, lines: list[str], *parts: str) -> bool:
    return code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and all(p in lines[0] for p in parts)


@pytest.mark.parametrize("override,message", [
    ("++seedd=3", "++seedd=3 is read by nothing"),
    ("seed=abc", "seed='abc' is not allowed (valid: an integer in [0, 2**32))"),
    ("seed=1.5", "seed=1.5 is not allowed"),
    ("seed=-1", "seed=-1 is not allowed"),
    ("threads=-3", "threads=-3 is not allowed (valid: an integer >= 0"),
    ("model.d_fff=3", "model.d_fff=3 is not a key of model"),
    ("seed=[1", "seed=[1 cannot be parsed"),
    ("experiment=nope", "experiment=nope is not a config of configs/experiment/"),
])
def test_a_bad_command_line_is_one_line_before_anything_is_built(tmp_path, monkeypatch, capsys, override, message):
    code, lines = run_cli(monkeypatch, capsys, [*SMOKE, override, f"hydra.run.dir={tmp_path / 'run'}"])
    assert refused(code, lines, message), lines
    assert not (tmp_path / "run" / "config_resolved.yaml").exists()


def test_plus_plus_sets_a_key_the_config_has_and_adds_only_to_a_constructor():
    from highway_repro.train.config import ConfigError, check_added_keys
    from highway_repro.train import CONFIG_DIR

    for ok in (["++seed=3"], ["++model.depth=4"], ["++data.train_limit=64"], ["++trainer.max_steps=2"]):
        check_added_keys(compose(SMOKE + ok), ok, CONFIG_DIR)
    for bad in (["++seedd=3"], ["++optim.lrr=1"]):
        with pytest.raises(ConfigError, match=r"^\+\+\S+ is read by nothing"):
            check_added_keys(compose(SMOKE + bad), bad, CONFIG_DIR)


def test_a_run_folder_that_is_a_file_or_lies_under_one_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("")
    for where in (tmp_path / "file", tmp_path / "file" / "run"):
        code, lines = run_cli(monkeypatch, capsys, [*SMOKE, f"hydra.run.dir={where}"])
        assert refused(code, lines, f"cannot write {tmp_path / 'file'}"), lines


def test_the_user_s_own_hydra_full_error_keeps_the_traceback(tmp_path, monkeypatch, capsys):
    from omegaconf.errors import ConfigKeyError

    from highway_repro.train import cli

    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    monkeypatch.setattr(sys, "argv", ["highway-train", *SMOKE, "model.d_fff=3", f"hydra.run.dir={tmp_path}"])
    handlers, level = logging.root.handlers[:], logging.root.level
    with pytest.raises(Exception) as e:
        cli()
    logging.root.handlers[:], logging.root.level = handlers, level
    assert isinstance(e.value.__cause__, ConfigKeyError) or "d_fff" in str(e.value)
    assert os.environ["HYDRA_FULL_ERROR"] == "1"


STOP_AT_ONCE = ("import os, signal, sys, time; from highway_repro.runtime import stopped\n"
                "with stopped():\n    os.kill(os.getpid(), int(sys.argv[1])); time.sleep(5)\nprint('went on')")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_outside_training_is_one_line(signum):
    p = subprocess.run([sys.executable, "-c", STOP_AT_ONCE, str(int(signum))], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 128 + signum and p.stdout == "", (p.returncode, p.stdout, p.stderr)
    assert p.stderr.startswith(f"error: stopped by {signal.Signals(signum).name} outside training")
    assert len(p.stderr.splitlines()) == 1, p.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_the_process_was_started_ignoring_stays_ignored(signum):
    """`nohup` (SIGHUP) and a background job of a non-interactive shell (SIGINT): the command goes on."""
    code = STOP_AT_ONCE.replace("time.sleep(5)", "time.sleep(0.2)")
    p = subprocess.run([sys.executable, "-c", code, str(int(signum))], cwd=REPO, capture_output=True, text=True,
                       timeout=60, preexec_fn=lambda: signal.signal(signum, signal.SIG_IGN))
    assert (p.returncode, p.stdout, p.stderr) == (0, "went on\n", "")


@needs_mirror
def test_a_data_cache_folder_under_a_file_is_one_line(tmp_path, monkeypatch, capsys):
    from highway_repro.train import run_job
    from highway_repro.train import run

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("HIGHWAY_DATA_DIR", str(tmp_path / "file" / "cache"))
    with pytest.raises(SystemExit) as e:
        run_job(compose(SMOKE), tmp_path / "run", False, run)
    lines = capsys.readouterr().err.splitlines()
    assert refused(e.value.code, lines, f"cannot write {tmp_path / 'file'}"), lines


def test_the_runner_s_argument_errors_are_one_line(capsys):
    from highway_repro.runner.cli import main

    for argv, part in ((["nope"], "table='nope' is not a table"), (["hn_table1", "--jobs", "0"], "--jobs=0"),
                       (["hn_table1", "--scale", "huge"], "--scale: invalid choice: 'huge'")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert refused(e.value.code, capsys.readouterr().err.splitlines(), part)


def test_a_report_over_damaged_metrics_names_the_file(tmp_path, capsys):
    from highway_repro.report.generic import main

    for seed in (0, 1):
        (tmp_path / f"seed={seed}").mkdir()
        (tmp_path / f"seed={seed}" / "metrics.json").write_text('{"status": "do')
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path), "--metrics", "val/loss"])
    lines = capsys.readouterr().err.splitlines()
    assert refused(e.value.code, lines, "damaged file", str(tmp_path / "seed=0" / "metrics.json")), lines


# ----------------------------------------------------------------------------- real processes

def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return {**env, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **extra}


@pytest.mark.slow
@needs_mirror
@pytest.mark.parametrize("limit", [1, 200_000])
def test_a_file_size_limit_is_one_line(tmp_path, limit):
    """`ulimit -f`: EFBIG while Hydra writes `.hydra/` (1 byte) or while a checkpoint is written (200 kB)."""
    import resource

    def cap():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    p = subprocess.run([sys.executable, "-m", "highway_repro.train", *SMOKE, "model.width=256",
                        f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=_env(), preexec_fn=cap,
                       capture_output=True, text=True, timeout=300)
    errors = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
    assert p.returncode == 2 and len(errors) == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "cannot write" in errors[0] and "File too large" in errors[0], errors


@pytest.mark.slow
@needs_mirror
def test_sighup_during_training_saves_and_writes_metrics(tmp_path):
    """A closed terminal: the trainer finishes its step, saves `last` and writes metrics.json `interrupted`."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "highway_repro.train", *SMOKE, "trainer.max_steps=100000",
                             "trainer.eval_every=0", f"hydra.run.dir={run}"], cwd=tmp_path, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120  # a training step logged: its first line (the parameter count) comes before fit
    while "train/" not in ((run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text() or "") \
            and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGHUP, err[-2000:]
    assert json.loads((run / "metrics.json").read_text())["status"] == "interrupted"
    assert (run / "ckpt" / "last.pt").exists()


@pytest.mark.slow
@needs_mirror  # without the data, a fast start-up can end on the data error before the signal comes
def test_sigint_during_start_up_is_one_line(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "highway_repro.train", *SMOKE, f"hydra.run.dir={tmp_path}"],
                            cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)  # composing or importing torch
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 128 + signal.SIGINT and len(errors) == 1 and "Traceback" not in err, err[-2000:]
    saved = tmp_path / "config_resolved.yaml"  # absent, or whole: written through a rename
    assert not saved.exists() or yaml.safe_load(saved.read_text())["seed"] == 0
