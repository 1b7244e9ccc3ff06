"""The error path: the project's own errors (config values, data, checkpoints) are one line with exit code 2,
before torch is imported for a config error (its speed, under 2 s, is a slow test), and so are Hydra's composition
errors, a full disk and a read-only run folder (no temp file left); anything else is a bug and keeps its traceback;
in a multirun both mark the job failed. A sweep with a failing job finishes the others and its report marks the
cell with the error (slow); a kept run whose metrics.json cannot be parsed makes `make tables` name it and fail.
Fuzzing of the gate placement parser and the config validator: tests/test_fuzz.py."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf
import pytest
import torch

from conftest import REPO, compose, needs_mirror
from highway_repro import data, report
from highway_repro.train.config import ConfigError, validate
from highway_repro.data import vision
from highway_repro.engine import checkpoint as ck
from highway_repro.errors import HighwayError
from highway_repro.train.job import MULTIRUN_ENV, USER_ERRORS, SweepEnd, user_failure
from highway_repro.train import run, run_job
from _faults import SMALL, DEPTH_0, _final, _cli, _env


def test_the_project_errors_are_the_one_line_errors():
    """The command reports the project's own error classes in one line with exit code 2: config values, data faults,
    checkpoints; they are known without importing torch (a config error is reported before torch is loaded)."""
    code = ("import sys, highway_repro.train, highway_repro.train.job as c; "
            "print([e.__name__ for e in c.USER_ERRORS], 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["['ConfigError',", "'HighwayError']", "False"], r.stdout + r.stderr
    for cls in (ck.CheckpointError, ck.UnsafeCheckpointError, data.DataError, data.ChecksumError,
                data.DataNotFoundError, vision.UnsafePickleError):
        assert issubclass(cls, HighwayError) and issubclass(cls, USER_ERRORS), cls
    for cls in (ValueError, TypeError, RuntimeError, KeyError):  # a plain one is a bug, not the user's mistake
        assert not issubclass(cls, USER_ERRORS), cls


@pytest.mark.parametrize("multirun", [False, True])
@pytest.mark.parametrize("error", [HighwayError("data.x=1 is bad (valid: 2)"), ValueError("a bug"), KeyError("bug")])
def test_user_errors_are_one_line_and_bugs_keep_their_traceback(error, multirun, tmp_path, capsys, monkeypatch):
    """A project error: one line on stderr and exit 2 (in a multirun: the line, metrics.json says failed with the
    error, and the job returns, so Hydra goes on with the other jobs; `SweepEnd` exits 2 at the end). Anything else
    propagates with its traceback; metrics.json says failed (the report marks the cell)."""
    def failing(cfg, out_dir, dist=None):
        raise error

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.delenv(MULTIRUN_ENV, raising=False)  # no multirun around this test
    cfg = compose(["experiment=demo", "scale=smoke"])
    user = isinstance(error, USER_ERRORS)
    if user and not multirun:
        with pytest.raises(SystemExit) as e:
            run_job(cfg, tmp_path, multirun, failing)
        assert e.value.code == 2
        assert capsys.readouterr().err == "error: data.x=1 is bad (valid: 2)\n"
    elif user:
        sweep = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
        other = SweepEnd()  # another multirun into the same folder, at the same time: the error is not its own
        other.on_multirun_start(config=sweep)
        others = os.environ[MULTIRUN_ENV]
        end = SweepEnd()  # this job's multirun (its folder is in the environment the job inherits)
        end.on_multirun_start(config=sweep)
        assert run_job(cfg, tmp_path, multirun, failing) is None
        assert capsys.readouterr().err == "error: data.x=1 is bad (valid: 2)\n"
        with pytest.raises(SystemExit) as e:
            end.on_multirun_end(config=sweep)
        assert e.value.code == 2 and "1 job of this multirun failed (?)" in capsys.readouterr().err
        monkeypatch.setenv(MULTIRUN_ENV, others)
        other.on_multirun_end(config=sweep)  # no exit
        assert not (tmp_path / ".user_errors").exists()  # its notes are removed at the multirun's end
    else:
        with pytest.raises(type(error)) as e:
            run_job(cfg, tmp_path, multirun, failing)
        assert e.value is error and e.value.__traceback__ is not None
        assert "error:" not in capsys.readouterr().err
    if user and not multirun:  # nothing to record: the user reads the line
        assert not (tmp_path / "metrics.json").exists()
    else:
        assert _final(tmp_path) == {"status": "failed",
                                    "error": f"{type(error).__name__}: {str(error).splitlines()[0]}"}


def test_a_multirun_job_that_could_record_nothing_still_fails_the_multirun(tmp_path, capsys, monkeypatch):
    """A job whose folder holds another recipe's run writes no metrics.json (it would overwrite that run's): its
    error is one line and SweepEnd still exits 2 (the job noted it in the multirun's own folder)."""
    monkeypatch.delenv(MULTIRUN_ENV, raising=False)
    sweep = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    end = SweepEnd()
    end.on_multirun_start(config=sweep)
    assert user_failure(ConfigError("resume=auto: the run folder x holds a run of another recipe"), None, True) is None
    assert capsys.readouterr().err == "error: resume=auto: the run folder x holds a run of another recipe\n"
    assert not list(tmp_path.glob("*/metrics.json")) and not (tmp_path / "metrics.json").exists()
    (tmp_path / "seed=0").mkdir()
    (tmp_path / "seed=0" / "metrics.json").write_text('{"status": "do')  # another run's, half written: not read
    with pytest.raises(SystemExit) as e:
        end.on_multirun_end(config=sweep)
    assert e.value.code == 2 and "1 job of this multirun failed (?)" in capsys.readouterr().err
    again = SweepEnd()  # counted once: the next multirun starts clean
    again.on_multirun_start(config=sweep)
    again.on_multirun_end(config=sweep)


@needs_mirror
def test_an_option_a_constructor_refuses_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    """Hydra's instantiate wraps what a constructor raises into its own exception; the project's errors come through
    as raised (here a data set's option), and torch's checks of optimizer values name the config node."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    for overrides, line in [(["data.normalize=gcn"], "error: mnist: normalize='gcn' is not valid; choose one of"),
                            (["optim.optimizer.momentum=-1"], "error: optim.optimizer: Invalid momentum value: -1")]:
        with pytest.raises(SystemExit) as e:
            run_job(compose(["experiment=demo", "scale=smoke", "threads=1"] + overrides), tmp_path, False, run)
        assert e.value.code == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(line), err


BAD_CONFIGS = {  # overrides -> (field=value named in the message, the valid range named in it)
    "gate_kind": (["model=transformer_lm", "data=ptb_char", "model.gate_kind=sdu_relu"],
                  "model.gate_kind='sdu_relu'", "valid: none, sdu_sigmoid, sdu_tanh, highway, gated_attn"),
    "gate_layers": (["model=transformer_lm", "data=ptb_char", "model.gate_kind=sdu_tanh", "model.gate_layers=[2,4]"],
                    "model.gate_layers=[2, 4]", "valid: 1-3"),
    "n_heads": (["model=transformer_lm", "data=ptb_char", "model.n_heads=3"],
                "model.n_heads=3", "valid: a divisor of 512"),
    "depth": (["experiment=demo", "model.depth=0"], "model.depth=0", "valid: an integer >= 2"),
    "seq_len": (["model=transformer_lm", "data=ptb_char", "data.seq_len=-5"], "data.seq_len=-5",
                "valid: a positive integer"),
    "mem_len": (["model=transformer_lm", "data=ptb_char", "+model.mem_len=8"], "model.mem_len=8",
                "valid only for TransformerXL"),
    "batch_size": (["experiment=demo", "data.batch_size=100000"], "data.batch_size=100000", "valid: 1..400"),
}


def _bad_config_cli(case: str, out: Path) -> tuple[subprocess.CompletedProcess, list[str], list[str]]:
    """`python -X importtime -m highway_repro.train <bad config>`: the process, its stderr lines without the import
    times, and the modules it imported."""
    r = subprocess.run(_cli(BAD_CONFIGS[case][0] + ["scale=smoke", f"hydra.run.dir={out}"], flags=("-X", "importtime")),
                       cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    imports = [x.rsplit("|", 1)[-1].strip() for x in r.stderr.splitlines() if x.startswith("import time:")]
    return r, [x for x in r.stderr.splitlines() if not x.startswith("import time:")], imports


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_is_one_line_naming_field_value_and_valid_range(case):
    overrides, field, valid = BAD_CONFIGS[case]
    with pytest.raises(ConfigError) as e:
        validate(compose(overrides + ["scale=smoke"]))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{field} ") and valid in msg, msg


def test_bad_config_exits_2_in_one_line_before_torch_is_imported(tmp_path):
    """What the user sees: exit code 2, one line `error: <field>=<value> ...`, no traceback; main() validates before
    it imports torch or numpy (so it fails in about a second: test_bad_config_fails_in_under_2_s, slow)."""
    _, field, valid = BAD_CONFIGS["gate_kind"]
    r, lines, imports = _bad_config_cli("gate_kind", tmp_path)
    assert r.returncode == 2, r.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith(f"error: {field} ") and valid in lines[0], lines
    assert "torch" not in imports and "numpy" not in imports


@pytest.mark.parametrize("args, line", [
    (["experiment=ht_char_pt"], "error: experiment=ht_char_pt is not a config of configs/experiment/ (valid: demo, "),
    (["-m", "experiment=demo", "variant=sdu_tanh,sdu_tan"],
     "error: variant=sdu_tan is not a config of configs/variant/"),
    (["experiment=demo", "scale=smok"],
     "error: scale=smok is not a config of configs/scale/ (valid: cpu, paper, smoke)"),
])
def test_a_misspelt_config_choice_is_one_line_before_hydra(args, line, tmp_path):
    """Hydra's own message for a choice with no file is a line per valid choice and exit 1; the command checks the
    command line's group choices first (config.check_group_choices): one line naming them, exit 2."""
    r = subprocess.run(_cli(args + [f"hydra.run.dir={tmp_path}", f"hydra.sweep.dir={tmp_path}"]), cwd=REPO,
                       env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.splitlines() == [r.stderr.strip()], r.stderr[-3000:]
    assert r.stderr.startswith(line), r.stderr
    assert not list(tmp_path.iterdir())  # nothing was composed, nothing written


def test_choices_hydra_finds_elsewhere_are_left_to_it(tmp_path):
    """`experiment=demo.yaml` is Hydra's too; with config folders added (`--config-dir`), a choice may live there."""
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text((REPO / "configs" / "experiment" / "demo.yaml").read_text())
    for args in (["experiment=demo.yaml"], ["--config-dir", str(tmp_path), "experiment=mine"]):
        r = subprocess.run(_cli(args + ["scale=smoke", "--cfg", "job"]), cwd=REPO, env=_env(), capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0 and "name: demo" in r.stdout, (args, r.stderr[-2000:])


@pytest.mark.slow  # a wall-clock bound
@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_fails_in_under_2_s(case, tmp_path):
    """Exit 2 with one line naming the field, the value and the valid range; no traceback; torch never imported.

    Time: the whole subprocess (interpreter + Hydra, which composes the config twice; torch is not imported,
    checked through -X importtime, whose output makes the times upper bounds) must take under 2 s. Measured on the
    2-core reference machine: 0.9-1.2 s of CPU time; wall 1.0-1.2 s idle, 1.5-2.3 s at load average 8 (other
    engineers' test runs). So the CPU time (user + sys of the child, independent of load) is held to 2 s, and
    the wall time to 2 s times the CPU contention (1-min load average / cores, when above 1), best of 3 tries.
    """
    import resource

    _, field, valid = BAD_CONFIGS[case]
    walls, cpus = [], []
    contention = max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    for attempt in range(3):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        r, lines, imports = _bad_config_cli(case, tmp_path / str(attempt))
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        assert r.returncode == 2, r.stderr[-3000:]
        assert "torch" not in imports and "numpy" not in imports
        assert lines == [lines[-1]] and lines[-1].startswith(f"error: {field} "), lines
        assert valid in lines[-1]
        if walls[-1] < 2.0 * contention:
            break
    print(f"{case}: wall {min(walls):.2f} s, cpu {min(cpus):.2f} s, contention {contention:.1f}")
    assert min(cpus) < 2.0, cpus
    assert min(walls) < 2.0 * contention, (walls, contention)


ONE_LINE_ERRORS = {  # overrides -> the start of the one line (field, value), what it says is allowed
    "misspelt_key": (["experiment=demo", "optim.lrr=1"], "error: optim.lrr=1 is not a key of optim",
                     "(valid: optimizer, scheduler, param_groups)"),
    "added_key_nothing_reads": (["experiment=demo", "+optim.lrr=1"], "error: +optim.lrr=1 is read by nothing",
                                "valid: + adds an argument to model, data, optim.optimizer, optim.scheduler"),
    "nan_lr_with_sgd": (["experiment=hn_table1", "optim.optimizer.lr=nan"],
                        "error: optim.optimizer.lr=nan is not allowed", "(valid: a finite number >= 0)"),
    "negative_lr_with_sgd": (["experiment=demo", "optim.optimizer.lr=-0.1"],
                             "error: optim.optimizer.lr=-0.1 is not allowed", "(valid: a finite number >= 0)"),
    "unparsable_override": (["experiment=demo", "optim.optimizer.lr=["], "error: optim.optimizer.lr=[ cannot be parsed",
                            "(valid: Hydra's override grammar"),
}


@pytest.mark.parametrize("case", sorted(ONE_LINE_ERRORS))
def test_config_errors_of_hydra_and_of_the_project_are_one_line(case, tmp_path):
    """A key Hydra does not know (its own message: 5 lines, exit 1), a key added with + that no constructor reads
    (accepted by Hydra), a learning rate that torch's SGD takes (nan), an override Hydra cannot parse: exit 2, one
    line naming the field, its value and what is allowed; nothing written, torch not imported."""
    overrides, start, valid = ONE_LINE_ERRORS[case]
    out = tmp_path / "run"
    r = subprocess.run(_cli(overrides + ["scale=smoke", f"hydra.run.dir={out}"], flags=("-X", "importtime")), cwd=REPO,
                       env=_env(), capture_output=True, text=True, timeout=120)
    lines = [x for x in r.stderr.splitlines() if not x.startswith("import time:")]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith(start) and valid in lines[0], lines
    assert "torch" not in {x.rsplit("|", 1)[-1].strip() for x in r.stderr.splitlines() if x.startswith("import time")}
    assert not (out / "metrics.json").exists()


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder that cannot be written: chmod 555, or (as root, who may write anyway) a read-only tmpfs mounted
    there; skipped where neither works."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    mounted = False
    if os.access(folder, os.W_OK):
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)], capture_output=True)
        mounted = r.returncode == 0
        if not mounted:
            folder.chmod(0o755)
            pytest.skip("no read-only folder here (root, and mount is not permitted)")
    yield folder
    if mounted:
        subprocess.run(["umount", str(folder)], check=True)
    folder.chmod(0o755)


@pytest.mark.parametrize("where", ["in", "below"])
def test_a_read_only_run_folder_is_one_line(where, read_only_folder):
    """hydra.run.dir that cannot be created or written (Hydra's own report: a traceback, exit 1): one line naming
    the path, exit 2."""
    out = read_only_folder / "run" if where == "below" else read_only_folder
    r = subprocess.run(_cli(["experiment=demo", "scale=smoke", f"hydra.run.dir={out}"]), cwd=REPO, env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.splitlines() == [r.stderr.strip()], r.stderr[-3000:]
    assert r.stderr.startswith(f"error: cannot write {out}") and "(valid: a writable folder" in r.stderr, r.stderr


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _full_disk_save(obj, f, *args, **kwargs):
    """torch.save on a full disk: a partial file, then torch's own error raised while handling the OSError."""
    f.write(b"PK partial")
    try:
        _enospc()
    except OSError:
        raise RuntimeError("[enforce fail at inline_container.cc] . unexpected pos 704 vs 598")


def _bug(*args, **kwargs):
    raise KeyError("a bug")


def test_a_failed_write_leaves_no_temp_file_and_names_the_path(tmp_path, monkeypatch):
    """metrics.json and checkpoints are written through a temp file and a rename: a full disk (here at the rename,
    and inside torch.save) is a StorageError naming the file, and the temp file is removed; an error of another
    kind keeps its type and leaves no temp file either."""
    from highway_repro.engine.loggers import write_json_atomic
    from highway_repro.errors import StorageError

    with monkeypatch.context() as m:
        m.setattr(os, "replace", _enospc)
        with pytest.raises(StorageError, match=f"cannot write {tmp_path / 'metrics.json'}: No space left on device"):
            write_json_atomic(tmp_path / "metrics.json", {"status": "done"})
    monkeypatch.setattr(torch, "save", _full_disk_save)
    with pytest.raises(StorageError) as e:
        ck.save(tmp_path / "ckpt", "last", {"model": {}, "step": 1})
    assert str(e.value).startswith(f"cannot write {tmp_path / 'ckpt' / 'last.pt'}: No space left on device")
    monkeypatch.setattr(torch, "save", _bug)
    with pytest.raises(KeyError):
        ck.atomic_torch_save({}, tmp_path / "ckpt" / "best.pt")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["ckpt"], list(tmp_path.rglob("*"))


@needs_mirror
@pytest.mark.parametrize("multirun", [False, True])
def test_a_full_disk_during_training_is_one_line(multirun, tmp_path, capsys, monkeypatch):
    """The disk fills up while the first checkpoint is written: exit 2 (in a multirun: the job's line, its
    metrics.json says failed, Hydra goes on), one line naming the checkpoint, no temp file left in ckpt/."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.delenv(MULTIRUN_ENV, raising=False)
    monkeypatch.setattr(torch, "save", _full_disk_save)
    line = (f"error: cannot write {tmp_path / 'ckpt' / 'last.pt'}: No space left on device (valid: a writable folder "
            "with free space; free some space, fix the permissions or choose another hydra.run.dir)")
    if multirun:
        assert run_job(compose(SMALL + ["threads=1"]), tmp_path, True, run) is None
        assert _final(tmp_path) == {"status": "failed", "error": "StorageError: " + line.removeprefix("error: ")}
    else:
        with pytest.raises(SystemExit) as e:
            run_job(compose(SMALL + ["threads=1"]), tmp_path, False, run)
        assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [line]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == []





@needs_mirror
@pytest.mark.slow  # a Hydra multirun in a subprocess; the job's bookkeeping: test_user_errors_are_one_line_and_...
def test_sweep_with_a_failing_job_finishes_the_others_and_reports_the_error(tmp_path):
    sweep = tmp_path / "sweep"
    r = subprocess.run(_cli(["-m", "experiment=demo", "scale=smoke", "model.depth=0,2", "trainer.max_steps=2",
                             "threads=1", f"hydra.sweep.dir={sweep}"]), cwd=REPO, env=_env(), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr  # once all jobs have run (cli.SweepEnd)
    lines = [x for x in r.stderr.splitlines() if x.startswith("error: [")]  # one line for the failed job
    assert len(lines) == 1 and "model.depth=0" in lines[0] and lines[0].endswith(f"] {DEPTH_0}"), r.stderr[-3000:]
    jobs = {json.loads((p / "metrics.json").read_text())["status"]: p for p in sweep.iterdir() if p.is_dir()}
    assert set(jobs) == {"done", "failed"}, r.stderr[-3000:]
    assert "model.depth=2" in jobs["done"].name and "model.depth=0" in jobs["failed"].name
    assert _final(jobs["failed"])["error"] == f"ConfigError: {DEPTH_0}"
    out = tmp_path / "report" / "t"
    assert report.main([str(sweep), "--group-by", "model.depth", "--metrics", "test/acc", "--out", str(out)]) == 0
    rows = {line.split("|")[1].strip(): line for line in out.with_suffix(".md").read_text().splitlines()
            if line.startswith("| ") and line.split("|")[1].strip() in ("0", "2")}
    assert set(rows) == {"0", "2"}
    assert "| 2 | 1 |" in rows["2"] and "failed" not in rows["2"]
    assert "| 0 | 0 (1 failed) |" in rows["0"] and DEPTH_0 in rows["0"]  # n done (failed), the error





def test_make_tables_names_a_damaged_kept_run_and_fails(tmp_path, capsys):
    """A kept run whose metrics.json cannot be parsed: `make tables` names it (path and parse error), the table's
    header and row count it as damaged, its numbers are in no statistic, and the command exits 1; 0 with
    --allow-damaged (the same tables). A copy of a results tree, never the committed one."""
    from highway_repro.runner.cli import main as reproduce

    kept = tmp_path / "results" / "highway_transformer" / "runs" / "ht_enwik8_l6-cpu"
    for seed, bpc in ((0, 1.5), (1, 9.0)):
        run_dir = kept / f"seed={seed},variant=baseline"
        run_dir.mkdir(parents=True)
        (run_dir / "config_resolved.yaml").write_text(f"seed: {seed}\nvariant: baseline\n")
        (run_dir / "metrics.json").write_text(json.dumps({"status": "done", "step": 10, "test/bpc": bpc,
                                                          "time/wall_s": 1.0}))
    damaged = kept / "seed=1,variant=baseline" / "metrics.json"
    damaged.write_text(damaged.read_text()[:-20])  # cut after the run wrote it
    args = ["--all", "--report-only", "--scale", "cpu", "--results", str(tmp_path / "results"), "--runs",
            str(tmp_path / "runs")]
    assert reproduce(args) == 1
    err = capsys.readouterr().err
    assert f"error: {damaged} cannot be parsed (JSONDecodeError: " in err and "counted as damaged" in err
    md = (tmp_path / "results" / "highway_transformer" / "enwik8_l6.md").read_text()
    assert "runs: 1 done, 0 failed, 0 missing, **1 damaged (a kept file cannot be read as plain data)**" in md
    rows = [line for line in md.splitlines() if line.startswith("| ") and "(1 damaged)" in line]
    assert len(rows) == 1 and "| 1 (1 damaged) |" in rows[0] and "9.0" not in md, md
    assert reproduce(args + ["--allow-damaged"]) == 0
    assert f"warning: {damaged} cannot be parsed" in capsys.readouterr().err
