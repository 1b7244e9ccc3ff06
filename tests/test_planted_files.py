"""Kept files come from strangers: a planted file of each class (an interpolation, an alias, a symbolic link, a path in
a record, a bomb or a bad value, a torn write) runs no code, reads or writes nothing outside its root, shows no
secret, and costs at most its own run or table, refused in one line (`highway_repro.files`).

Each case plants one file in a copy of a kept run (or of a results tree) under tmp_path, with a "secret" file and an
"outside" file beside it that must stay unread and unchanged. In-process cases are fast; the `make tables` and
subprocess cases are slow (end of file). The data cases (a prepared array swapped with its manifest) are in
tests/test_prepared_anchor.py, the refused command's in tests/test_refused_commands.py.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, compose

KEPT = REPO / "results" / "highway_networks" / "runs" / "hn_analysis-cpu" / "run"  # a finished hn_analysis run
SECRET = "s3cr3t-token-4711"


@pytest.fixture
def world(tmp_path, monkeypatch):
    """(a copy of the kept run under results/.../runs/hn_analysis-cpu/run, a secret file outside it, an outside file
    a write must not reach); the secret is also in the environment, as a token would be."""
    run = tmp_path / "results" / "highway_networks" / "runs" / "hn_analysis-cpu" / "run"
    shutil.copytree(KEPT, run)
    secret, outside = tmp_path / "home" / "credentials", tmp_path / "home" / ".bashrc"
    secret.parent.mkdir()
    secret.write_text(f"token: {SECRET}\n")
    outside.write_text("# the user's own\n")
    monkeypatch.setenv("HIGHWAY_TEST_SECRET", SECRET)
    return run, secret, outside


def one_line(text: str) -> bool:
    return len([line for line in text.splitlines() if line.strip()]) == 1 and "Traceback" not in text


def damaged(run: Path) -> str:
    """The run's damage line (`load_run`), asserting it is damaged, one line, and shows no secret."""
    from highway_repro.report.runs import load_run

    r = load_run(run)
    assert r.status == "damaged", (r.status, r.error)
    assert "\n" not in r.error and SECRET not in r.error, r.error
    return r.error


# ------------------------------------------------------------------ interpolations and aliases
@pytest.mark.parametrize("where,text", [
    ("config_resolved.yaml", "data:\n  extra: ${oc.env:HIGHWAY_TEST_SECRET}\n"),
    ("config_resolved.yaml", "model:\n  flex_attention: '${oc.create:{_target_: os.system, _args_: [touch M]}}'\n"),
    (".hydra/overrides.yaml", "- seed=${oc.env:HIGHWAY_TEST_SECRET}\n"),
    (".hydra/overrides.yaml", "- model=/etc/passwd\n"),
    (".hydra/overrides.yaml", "- model=../../../tmp/x\n"),
    (".hydra/overrides.yaml", "- 'model.depth=[1,2]'\n"),
    (".hydra/overrides.yaml", "- +data.cache_dir=evilcache\n"),
])
def test_an_interpolation_or_a_grammar_value_in_a_kept_run_is_refused_unresolved(world, capsys, where, text):
    """Planted in the file the recipe guard, the runner and the analyses would hand to OmegaConf or Hydra: the run
    is damaged (one line, no secret), other_recipe names it (so it is never counted as done), resume=auto refuses
    it, and the gate analyses build nothing from it."""
    from highway_repro.analysis.run import main as analyse
    from highway_repro.runner.keep import other_recipe
    from highway_repro.train import run_job

    run, _, _ = world
    f = run / where
    f.write_text(f.read_text() + text if where.endswith("config_resolved.yaml") else text)
    assert where.split("/")[-1] in damaged(run)
    why = other_recipe("hn_analysis", "cpu", [run])
    assert set(why) == {"run"} and SECRET not in why["run"], why
    if where == "config_resolved.yaml":  # (resume=auto reads no overrides.yaml: Hydra writes the command's own)
        with pytest.raises(SystemExit) as e:
            run_job(compose(["experiment=hn_analysis", "scale=cpu", "resume=auto"]), run, False,
                    lambda *a, **k: pytest.fail("trained in a planted folder"))
        err = capsys.readouterr().err
        assert e.value.code == 2 and one_line(err) and SECRET not in err, err
    assert analyse([str(run), "--out", str(run.parent / "analysis")]) == 2
    err = capsys.readouterr().err
    assert one_line(err) and SECRET not in err, err
    assert not (run.parent / "M").exists() and not Path("M").exists()


def test_a_yaml_alias_bomb_is_refused_before_it_is_expanded(world):
    """Nine levels of nine aliases would be 387 million strings: the reader refuses the first alias."""
    run, _, _ = world
    (run / "config_resolved.yaml").write_text("a: &a [x]\nb: *a\n")  # one alias: refused too
    assert "an alias" in damaged(run)
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"] + [
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    (run / "config_resolved.yaml").write_text("\n".join(levels) + "\n")
    assert "an alias" in damaged(run)


# ------------------------------------------------------------------ bombs and bad values
@pytest.mark.parametrize("file,text,says", [
    ("metrics.json", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("metrics.json", '{"status": "done", "step": ' + "9" * 400 + "}", "400 digits"),
    ("metrics.json", '{"status": "done", "step": "abc"}', "step='abc'"),
    ("metrics.json", '["done"]', "a JSON list"),
    ("run_info.json", '"a string"', "a JSON str"),
    ("config_resolved.yaml", "- a\n- list\n", "holds a list"),
    (".hydra/overrides.yaml", "seed: 1\n", "holds a dict"),
    ("config_resolved.yaml", "\xff\xfe", "cannot be parsed"),
    ("config_resolved.yaml", "a: 2001-13-45\n", "month must be in 1..12"),
    ("config_resolved.yaml", "a: " + "9" * 5000 + "\n", "cannot be parsed"),
    ("run_info.json", '{"cpu_model": "\\ud800"}', "surrogates not allowed"),
])
def test_a_bomb_or_a_bad_value_damages_its_run_in_one_line(world, file, text, says):
    run, _, _ = world
    (run / file).write_text(text, encoding="latin-1")
    assert says in damaged(run)


@pytest.mark.parametrize("file", ["metrics.json", "metrics.jsonl", "config_resolved.yaml"])
def test_a_kept_file_over_the_size_limit_is_damage_and_never_read(world, file):
    from highway_repro.files import MAX_BYTES

    run, _, _ = world
    with open(run / file, "r+b") as f:
        f.truncate(MAX_BYTES + 1)  # (a sparse file: nothing is written)
    assert f"{MAX_BYTES + 1:,} bytes" in damaged(run)


@pytest.mark.parametrize("text", ["[1]", "[" * 100_000])
def test_resume_of_a_received_folder_with_a_damaged_run_info_is_one_line(tmp_path, monkeypatch, capsys, text):
    """The trainer updates run_info.json as it starts: a received folder's, not plain data, is one line, exit 2,
    before any data is read."""
    from conftest import run_cli

    run = tmp_path / "received"
    run.mkdir()
    (run / "run_info.json").write_text(text)
    code, lines = run_cli(monkeypatch, capsys, ["experiment=demo", "scale=smoke", "trainer.max_steps=2", "threads=1",
                                                "resume=auto", f"hydra.run.dir={run}"])
    assert code == 2 and len(lines) == 1 and "run_info.json" in lines[0], lines
    assert (run / "run_info.json").read_text() == text


@pytest.mark.parametrize("value", ["seed=${hp:lr}", "model.depth=${hp:1,d,uniform,a,b}"])
def test_an_interpolation_on_the_command_line_that_does_not_resolve_is_one_line(tmp_path, monkeypatch, capsys, value):
    from conftest import run_cli

    code, lines = run_cli(monkeypatch, capsys, ["experiment=demo", "scale=smoke", value, f"hydra.run.dir={tmp_path}"])
    assert code == 2 and len(lines) == 1 and "cannot be resolved" in lines[0], lines


def test_a_history_line_with_a_bad_step_is_left_out_like_a_cut_line(world):
    from highway_repro.report.runs import load_run

    run, _, _ = world
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(lines + ['{"step": "abc", "train/loss": 1}', "[" * 50_000]) + "\n")
    r = load_run(run)
    assert r.status == "done" and len(r.history) == len(lines)


# ------------------------------------------------------------------ symbolic links
@pytest.mark.parametrize("file", ["config_resolved.yaml", "metrics.json", "run_info.json", ".hydra/overrides.yaml",
                                  "metrics.jsonl", ".hydra"])
def test_a_kept_file_that_is_a_link_is_never_read(world, file):
    run, secret, _ = world
    target = secret if file != ".hydra" else secret.parent
    shutil.rmtree(run / file) if (run / file).is_dir() else (run / file).unlink()
    (run / file).symlink_to(target)
    assert "symbolic link" in damaged(run)


@pytest.mark.parametrize("kind,file", [("folder", "metrics.json"), ("fifo", "metrics.json"), ("fifo", "metrics.jsonl")])
def test_a_kept_file_that_is_a_folder_or_a_fifo_is_damage_not_a_traceback(world, kind, file):
    run, _, _ = world
    (run / file).unlink()
    if kind == "fifo":
        os.mkfifo(run / file)  # (opened without blocking: no writer ever comes)
    else:
        (run / file).mkdir()
        (run / file / "x").write_text("{}")
    assert "not a plain file" in damaged(run)


def test_a_table_folder_that_is_a_link_is_never_read_below_the_results_root(world, tmp_path):
    """Read below the results root (as the runner, the reports and the export read kept runs), a run whose table
    folder is a link is damaged."""
    from highway_repro.report.runs import load_run

    run, _, _ = world
    table = run.parent
    shutil.move(table, tmp_path / "elsewhere")
    table.symlink_to(tmp_path / "elsewhere")
    r = load_run(run, tmp_path / "results")
    assert r.status == "damaged" and "symbolic link" in r.error


def test_a_received_run_folder_is_never_written_through_a_link(world, tmp_path, monkeypatch, capsys):
    """resume=auto on a received folder: a link at an entry the run writes (metrics.jsonl, .hydra, ckpt, train.log)
    is one line, exit code 2, and its target is unchanged."""
    from conftest import run_cli

    run, _, outside = world
    for entry in ("metrics.jsonl", "ckpt", ".hydra", "train.log"):
        folder = tmp_path / f"recv-{entry.strip('.')}"
        shutil.copytree(run, folder)
        (folder / "metrics.json").unlink()  # not finished: it would train
        target = outside if entry in ("metrics.jsonl", "train.log") else outside.parent
        shutil.rmtree(folder / entry) if (folder / entry).is_dir() else (folder / entry).unlink(missing_ok=True)
        (folder / entry).symlink_to(target)
        code, lines = run_cli(monkeypatch, capsys, ["experiment=hn_analysis", "scale=cpu", "resume=auto",
                                                    f"hydra.run.dir={folder}"])
        assert code == 2 and len(lines) == 1 and entry in lines[0], (entry, lines)
        assert outside.read_text() == "# the user's own\n" and sorted(p.name for p in outside.parent.iterdir()) == [
            ".bashrc", "credentials"], entry


def test_a_train_log_that_is_a_dangling_link_creates_nothing_at_its_target(world, tmp_path, monkeypatch, capsys):
    """Hydra opens train.log before the job's code runs (files.LogFile): a link there to a file that does not exist
    yet (a shell start-up file) is one line, and nothing is created at its target."""
    from conftest import run_cli

    run, _, outside = world
    folder, target = tmp_path / "received", outside.parent / ".profile"
    shutil.copytree(run, folder)
    (folder / "metrics.json").unlink()
    (folder / "train.log").symlink_to(target)
    code, lines = run_cli(monkeypatch, capsys, ["experiment=hn_analysis", "scale=cpu", "resume=auto",
                                                f"hydra.run.dir={folder}"])
    assert code == 2 and len(lines) == 1 and "train.log: Too many levels of symbolic links" in lines[0], lines
    assert not target.exists()


def test_a_run_folder_that_is_a_link_is_never_read(world, tmp_path):
    run, _, _ = world
    elsewhere = tmp_path / "elsewhere"
    shutil.move(run, elsewhere)
    run.symlink_to(elsewhere)
    assert "symbolic link" in damaged(run)


def test_the_runner_neither_restores_nor_keeps_through_a_link(world, tmp_path, capsys):
    """restore: a kept run with a linked file is not restored (it trains again), and nothing is read through the link;
    keep: the run trained again is kept over it, the link removed, its target unchanged."""
    from highway_repro.runner.keep import keep, restore

    run, secret, outside = world
    kept = run.parent
    (run / "run_info.json").unlink()
    (run / "run_info.json").symlink_to(secret)
    sweep = tmp_path / "runs" / "hn_analysis-cpu"
    assert restore(kept, sweep, single=True) == []
    assert "is damaged and is trained again" in capsys.readouterr().err
    assert not (sweep / "run_info.json").exists()
    shutil.copytree(KEPT, sweep, dirs_exist_ok=True)  # the local run, finished
    (run / "metrics.json").unlink()
    (run / "metrics.json").symlink_to(outside)
    assert keep(sweep, kept, single=True) >= 1
    assert outside.read_text() == "# the user's own\n" and not (run / "metrics.json").is_symlink()
    assert (run / "metrics.json").read_bytes() == (sweep / "metrics.json").read_bytes()


def test_a_report_file_that_is_a_link_is_replaced_never_written_through(tmp_path):
    from highway_repro.files import write_atomic

    outside = tmp_path / ".bashrc"
    outside.write_text("# the user's own\n")
    report = tmp_path / "results" / "highway_networks" / "table1.md"
    report.parent.mkdir(parents=True)
    report.symlink_to(outside)
    with pytest.raises(Exception, match="symbolic link"):
        write_atomic(report, "echo pwned\n", tmp_path / "results")
    (tmp_path / "results" / "linked").symlink_to(tmp_path)  # a folder below the root that is a link
    with pytest.raises(Exception, match="symbolic link"):
        write_atomic(tmp_path / "results" / "linked" / ".bashrc", "echo pwned\n", tmp_path / "results")
    assert outside.read_text() == "# the user's own\n"
    report.unlink()
    write_atomic(report, "the table\n", tmp_path / "results")
    assert report.read_text() == "the table\n" and not report.is_symlink()
    with pytest.raises(Exception, match="lies outside"):
        write_atomic(tmp_path / "results" / ".." / "x.md", "x", tmp_path / "results")


def test_the_results_root_itself_may_be_a_link(tmp_path):
    from highway_repro.files import read_json, write_atomic

    disk = tmp_path / "disk"
    disk.mkdir()
    (tmp_path / "results").symlink_to(disk)
    write_atomic(tmp_path / "results" / "a" / "b.json", "{}", tmp_path / "results")
    assert read_json(tmp_path / "results" / "a" / "b.json", tmp_path / "results") == {}


# ------------------------------------------------------------------ paths in records
@pytest.mark.parametrize("entry", ["../../home", "/tmp", "wandb/../../home", "wandb/", "wandb/a/b"])
def test_an_export_record_never_names_a_folder_to_delete(tmp_path, entry):
    from highway_repro.dashboards.export import read_index
    from highway_repro.files import KeptFileError

    out = tmp_path / "runs" / "wandb_export"
    out.mkdir(parents=True)
    (out / "exported.json").write_text(json.dumps({"gone-run": {"run": entry, "digest": "x"}}))
    with pytest.raises(KeptFileError) as e:
        read_index(out)
    assert one_line(str(e.value)) and "exported.json" in str(e.value)


def test_make_wandb_export_removes_nothing_a_record_names_outside_its_folder(tmp_path, capsys):
    """The old record's entries are removed when their runs are gone: an entry naming `../victim` is refused (exit 2)
    and the folder it names stays."""
    from highway_repro.dashboards.__main__ import main

    results, out, victim = tmp_path / "results", tmp_path / "runs" / "wandb_export", tmp_path / "runs" / "victim"
    results.mkdir()
    (results / "summary.csv").write_text("table,scale,kind\n")
    victim.mkdir(parents=True)
    (victim / "keep.txt").write_text("mine")
    out.mkdir()
    (out / "exported.json").write_text(json.dumps({"gone-run": {"run": "../victim", "digest": "x"}}))
    assert main(["export", "--results", str(results), "--out", str(out), "--jobs", "1"]) == 2
    assert one_line(capsys.readouterr().err) and (victim / "keep.txt").read_text() == "mine"


def test_the_tree_check_refuses_a_committed_link_and_a_force_added_ignored_file(tmp_path):
    """scripts/check_tree.sh (run by .ci/run): this repository passes; a repository with a committed symbolic link or
    a file force-added under an ignored folder fails, naming each."""
    check = [shutil.which("bash"), str(REPO / "scripts" / "check_tree.sh")]
    assert subprocess.run(check + [str(REPO)], capture_output=True, text=True).returncode == 0
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run(git + ["init", "-q"], check=True)
    (tmp_path / ".gitignore").write_text("runs/\n")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / ".writer.lock").write_text("")
    (tmp_path / "results.md").symlink_to(Path.home() / ".bashrc")
    subprocess.run(git + ["add", ".gitignore"], check=True)
    assert subprocess.run(check + [str(tmp_path)], capture_output=True, text=True).returncode == 0
    subprocess.run(git + ["add", "results.md"], check=True)
    subprocess.run(git + ["add", "-f", "runs/.writer.lock"], check=True)
    p = subprocess.run(check + [str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 1 and "symbolic link in the tracked tree" in p.stderr and "results.md" in p.stderr
    assert "runs/.writer.lock" in p.stderr, p.stderr


@pytest.mark.parametrize("record", ['["a list"]', '{"commands": "make x", "wall_s": 1}',
                                    '{"commands": [], "wall_s": "1 h"}', '{"commands": [], "wall_s": 1, '
                                    '"intervals": [[1]]}', "{" * 1000])
def test_a_damaged_table_record_is_one_line(tmp_path, record):
    from highway_repro.files import KeptFileError
    from highway_repro.runner.keep import read_record

    kept = tmp_path / "results" / "highway_transformer" / "runs" / "ht_enwik8_l6-cpu"
    kept.mkdir(parents=True)
    (kept / "reproduce.json").write_text(record)
    with pytest.raises(KeptFileError) as e:
        read_record(kept, fresh=False)
    assert one_line(str(e.value)) and "reproduce.json" in str(e.value)


def test_a_claims_file_naming_a_path_is_refused(tmp_path):
    from highway_repro.files import KeptFileError
    from highway_repro.report.claims_file import read_claims

    f = tmp_path / "x.claims.json"
    fields = {"table": "t", "title": "T", "scale": "cpu", "runs": 1, "runs_planned": 1, "part_of": None, "rows": []}
    f.write_text(json.dumps({**fields, "file": "../../home/.bashrc"}))
    with pytest.raises(KeptFileError, match="not allowed"):
        read_claims(f, tmp_path)
    f.write_text(json.dumps({**fields, "file": "x.md", "rows": [{"kind": "claim", "comparison": "z"}]}))
    with pytest.raises(KeptFileError, match="not a table's claims file"):  # a row without its fields
        read_claims(f, tmp_path)


# ------------------------------------------------------------------ torn writes
@pytest.mark.parametrize("fails", ["fsync", "replace", "ulimit -f"])
def test_a_write_that_fails_leaves_the_old_file_whole_and_no_temp_file(tmp_path, monkeypatch, fails):
    """A full disk at the fsync or the rename, or a file-size limit (`ulimit -f`: EFBIG, Python ignores SIGXFSZ)."""
    import resource

    from highway_repro import files
    from highway_repro.errors import StorageError

    report = tmp_path / "table.md"
    report.write_text("the old table\n")

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    if fails == "ulimit -f":
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, limit[1]))
    else:
        monkeypatch.setattr(os, fails, full)
    try:
        with pytest.raises(StorageError) as e:
            files.write_atomic(report, "the new table\n" * 1000)
    finally:
        monkeypatch.undo()
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
    assert one_line(str(e.value)) and str(report) in str(e.value)
    assert report.read_text() == "the old table\n" and sorted(p.name for p in tmp_path.iterdir()) == ["table.md"]


# ------------------------------------------------------------------ one bad kept run costs one table
def _kept_table(results: Path) -> Path:
    """A small ht_enwik8_l6 table of two finished runs (as tests/test_errors.py builds one)."""
    kept = results / "highway_transformer" / "runs" / "ht_enwik8_l6-cpu"
    for seed, bpc in ((0, 1.5), (1, 1.6)):
        run_dir = kept / f"seed={seed},variant=baseline"
        (run_dir / ".hydra").mkdir(parents=True)
        (run_dir / ".hydra" / "overrides.yaml").write_text(f"- seed={seed}\n- variant=baseline\n")
        (run_dir / "config_resolved.yaml").write_text(f"seed: {seed}\nvariant: baseline\n")
        (run_dir / "metrics.json").write_text(json.dumps({"status": "done", "step": 10, "test/bpc": bpc,
                                                          "time/wall_s": 1.0}))
    return kept


def test_a_damaged_record_costs_its_table_only(tmp_path, capsys):
    """`make tables` reports each table through `cli._report`: the table whose record is damaged is one line and
    not rebuilt (the others go on: the slow test below runs the whole of `make tables`)."""
    from highway_repro.runner.cli import _report

    results = tmp_path / "results"
    kept = _kept_table(results)
    (kept / "reproduce.json").write_text('{"commands": "rm -rf ~", "wall_s": 1}')
    assert _report("ht_enwik8_l6", "cpu", tmp_path / "runs", results, echo=False) == 1
    err = capsys.readouterr().err
    assert "error: [ht_enwik8_l6] not reported: " in err and "reproduce.json is not a table's record" in err, err
    assert one_line(err) and not (results / "highway_transformer" / "enwik8_l6.md").exists()


def test_a_damaged_kept_run_is_left_out_of_the_wandb_export_and_named(world, tmp_path, monkeypatch):
    from highway_repro.dashboards.export import export

    run, _, _ = world
    monkeypatch.setenv("WANDB_MODE", "offline")  # (were it exported: never over the network)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    (run / "metrics.json").write_text('{"status": "done", "step": "abc"}')
    out = tmp_path / "runs" / "wandb_export"
    res = export(tmp_path / "results", out, jobs=1, folders=[run])
    assert res["runs"] == 0 and "step='abc'" in res["damaged"][str(run)], res
    assert json.loads((out / "exported.json").read_text()) == {} and not (out / "wandb").exists()


def test_a_damaged_claims_file_or_ledger_is_named_and_summary_csv_built_without_it(tmp_path, capsys):
    """`make tables`' summary step: a damaged claims file is left out of summary.csv and named (the step fails, the
    reports stand); a damaged ledger is named, and the summary is built without earlier verdicts."""
    from highway_repro.files import KeptFileError
    from highway_repro.report.ledger import LEDGER
    from highway_repro.report.summary import write_summary

    results = tmp_path / "results"
    (results / "highway_networks").mkdir(parents=True)
    good = REPO / "results" / "highway_networks" / "analysis.claims.json"
    shutil.copy(good, results / "highway_networks" / good.name)
    (results / "highway_networks" / "fig1.claims.json").write_text('{"table": "hn_fig1", "rows": "rm -rf ~"}')
    (results / LEDGER).write_text('{"entries": [{"id": 1}]}')
    with pytest.raises(KeptFileError, match="1 claims file.s. left out of .*fig1.claims.json"):
        write_summary(results)
    err = capsys.readouterr().err
    assert "fig1.claims.json is not a table's claims file" in err and f"{LEDGER}: entries is not a list" in err, err
    csv = (results / "summary.csv").read_text()
    assert "analysis.md" in csv and "fig1" not in csv


def test_a_run_damaged_in_its_config_is_left_out_and_named(tmp_path, capsys):
    """The table is built without it and names it; `make tables`' check of the kept runs names it and fails."""
    from highway_repro.runner.cli import _damaged, _report

    results = tmp_path / "results"
    kept = _kept_table(results)
    (kept / "seed=1,variant=baseline" / "config_resolved.yaml").write_text("seed: 1\nx: ${oc.env:HOME}\n")
    assert _report("ht_enwik8_l6", "cpu", tmp_path / "runs", results, echo=False) == 0
    assert _damaged(results, "cpu", allowed=False) == 1
    err = capsys.readouterr().err
    assert "holds an interpolation" in err and "counted as damaged" in err and os.environ["HOME"] not in err, err
    md = (results / "highway_transformer" / "enwik8_l6.md").read_text()
    assert "runs: 1 done" in md and "seed=1,variant=baseline" in md, md


# ------------------------------------------------------------------ slow: the whole of `make tables`
@pytest.mark.slow
def test_make_tables_over_damaged_kept_runs_rebuilds_every_other_table_byte_identical(tmp_path):
    """A copy of results/ with one damaged kept run of each kind, each in another table: `make tables` (the runner's
    --all --report-only) rebuilds every table without a damaged run byte-identical to the clean copy's rebuild,
    names every damaged run, and exits 1."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    clean, dirty = tmp_path / "clean" / "results", tmp_path / "dirty" / "results"
    for root in (clean, dirty):
        shutil.copytree(REPO / "results", root)
    plants = {  # table's kept folder -> (file, content)
        "highway_transformer/runs/ht_char_ptb-cpu": ("config_resolved.yaml", "x: ${oc.env:HOME}\n"),
        "highway_transformer/runs/ht_word_ptb-cpu": ("metrics.json", "[" * 100_000),
        "highway_networks/runs/hn_table1-cpu": ("config_resolved.yaml", "a: &a [x]\nb: [*a, *a]\n"),
        "highway_transformer/runs/ht_enwik8_l6-cpu": (".hydra/overrides.yaml", "- model=/etc/passwd\n"),
        "highway_networks/runs/hn_cifar-cpu": ("metrics.json", '{"status": "done", "step": "abc"}'),
        "highway_transformer/runs/ht_enwik8_l12-cpu": ("metrics.json", '{"status": "done", "step": 1%s}' % ("0" * 400)),
        "highway_transformer/runs/ht_word_ptb_l3-cpu": ("config_resolved.yaml", "- model\n- data\n"),
        "highway_transformer/runs/ht_zoo_char_ptb-cpu": ("metrics.jsonl", None),  # a FIFO: reading it would block
    }
    planted = []
    for folder, (name, text) in plants.items():
        run = sorted(p.parent for p in (dirty / folder).glob("*/metrics.json"))[0]
        if text is None:
            (run / name).unlink()
            os.mkfifo(run / name)
        else:
            (run / name).write_text(text)
        planted.append(run)
    link = sorted(p.parent for p in (dirty / "highway_transformer/runs/ht_char_ptb_rt-cpu").glob("*/metrics.json"))[0]
    (link / "run_info.json").unlink()
    (link / "run_info.json").symlink_to(tmp_path / "secret")
    (tmp_path / "secret").write_text(SECRET)
    planted.append(link)
    out = {}
    for root in (clean, dirty):
        out[root] = subprocess.run([sys.executable, "-m", "highway_repro.runner", "--all", "--report-only", "--scale",
                                    "cpu", "--results", str(root), "--runs", str(root.parent / "runs")],
                                   cwd=root.parent, env=env, capture_output=True, text=True, timeout=1200)
    assert out[clean].returncode == 0, out[clean].stderr[-3000:]
    p = out[dirty]
    assert p.returncode == 1 and "Traceback" not in p.stderr and SECRET not in p.stderr, p.stderr[-3000:]
    for run in planted:
        assert f"{run}" in p.stderr, (run, p.stderr[-3000:])
    from highway_repro.grids import kept_folders
    from highway_repro.targets import REPORTS, TARGETS

    hit = {n for n in REPORTS if {f.relative_to(dirty) for f in kept_folders(n, "cpu", dirty)}
           & {r.relative_to(dirty) for r in planted}}
    hit |= {n for n in REPORTS if set(TARGETS[n].parts) & hit}
    assert len(hit) >= len(planted), hit
    mine = {Path(TARGETS[n].results).name for n in hit}  # a table's files: <name>.md/.csv/.png/.claims.json
    changed = [f.relative_to(clean).as_posix() for f in sorted(clean.rglob("*"))
               if f.is_file() and "runs" not in f.relative_to(clean).parts
               and (dirty / f.relative_to(clean)).read_bytes() != f.read_bytes()]
    others = [c for c in changed if Path(c).name.split(".")[0] not in mine
              and c not in ("summary.csv", "README.md", "claims.png", "preregistration.md")]
    assert not others, (others, sorted(hit))


def test_a_prepared_manifest_naming_a_path_is_refused(tmp_path):
    """A manifest's files are names in its folder: one naming `../x` is not read (not even hashed)."""
    from highway_repro.data.prepared import _load_prepared
    from highway_repro.data.sources import ChecksumError

    folder = tmp_path / "prepared" / "x-0"
    folder.mkdir(parents=True)
    (tmp_path / "secret").write_text(SECRET)
    (folder / "manifest.json").write_text(json.dumps({"key": {}, "arrays": {}, "sha256": {
        "info.json": "0", "../../secret": "0"}}))
    with pytest.raises(ChecksumError, match="does not describe its folder"):
        _load_prepared(folder, {})


def test_the_analyses_take_no_data_cache_from_a_received_config(world, capsys):
    """`data.cache_dir` in a received config would point the analysis at a cache of the sender's choosing: a key the
    project's configs do not give is another recipe, refused before any data is read."""
    import yaml

    from highway_repro.analysis.run import main as analyse

    run, _, _ = world
    cfg = yaml.safe_load((run / "config_resolved.yaml").read_text())
    cfg["data"]["cache_dir"] = str(run.parent / "evil_cache")
    (run / "config_resolved.yaml").write_text(yaml.safe_dump(cfg))
    assert analyse([str(run), "--out", str(run.parent / "analysis")]) == 2
    err = capsys.readouterr().err
    assert one_line(err) and "another recipe" in err and "data.cache_dir" in err, err


def test_resume_refuses_a_damaged_metrics_file_in_one_line(world, capsys):
    """resume=auto reads the folder's metrics.json to see whether the run finished: JSON nested 100,000 deep there is
    one line and exit code 2, nothing trained."""
    from highway_repro.train import run_job

    run, _, _ = world
    (run / "metrics.json").write_text("[" * 100_000)
    with pytest.raises(SystemExit) as e:
        run_job(compose(["experiment=hn_analysis", "scale=cpu", "resume=auto"]), run, False,
                lambda *a, **k: pytest.fail("trained over a damaged metrics.json"))
    err = capsys.readouterr().err
    assert e.value.code == 2 and one_line(err) and "nested too deeply" in err, err


# ------------------------------------------------------------------ odd paths: one line, never a traceback
def test_a_prepared_array_on_a_full_disk_is_one_line(tmp_path):
    """numpy reports a short write without an errno ('N requested and M written'): a full disk all the same."""
    from highway_repro.data.prepared import _save_atomic
    from highway_repro.errors import StorageError

    def short(f):
        raise OSError("5101618 requested and 2097024 written")

    with pytest.raises(StorageError, match=r"cannot write .*train\.npy: .*short write: the disk is full"):
        _save_atomic(tmp_path / "train.npy", short)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args,says", [
    (["--all", "--report-only", "--results", "/etc/passwd/r"], "cannot write /etc/passwd/r: Not a directory"),
    (["demo", "--scale", "smoke", "--runs", "/proc/highway_x"], "cannot write /proc/highway_x"),
])
def test_the_runner_names_a_folder_it_cannot_use_in_one_line(tmp_path, capsys, args, says):
    from highway_repro.runner.cli import main as reproduce

    try:
        code = reproduce(args + ([] if "--results" in args else ["--results", str(tmp_path / "r")]))
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and says in err and "Traceback" not in err, err


def test_a_run_folder_or_data_cache_that_cannot_be_made_is_one_line(tmp_path, monkeypatch, capsys):
    from conftest import run_cli

    code, lines = run_cli(monkeypatch, capsys, ["experiment=demo", "scale=smoke", "hydra.run.dir=/proc/highway_x"])
    assert code == 2 and len(lines) == 1 and "cannot write /proc/highway_x" in lines[0], lines
    from highway_repro.errors import StorageError, make_folder

    with pytest.raises(StorageError, match="cannot write /proc/highway_y/prepared"):
        make_folder("/proc/highway_y/prepared")
