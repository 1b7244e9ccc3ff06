"""The kept runs on W&B (highway_repro/dashboards): the offline export read back through wandb's own record format,
one run id rule for the export and `logger=wandb`, a second export that duplicates nothing, every table's dashboard
spec naming only keys its runs log, and a sweep job's W&B group and config columns equal to the export's. No network:
W&B runs offline into tmp_path."""

from __future__ import annotations

import json
import math
import struct
import time
from pathlib import Path

import pytest

from conftest import REPO

RESULTS = REPO / "results"
RUNS = RESULTS / "highway_transformer" / "runs"
# a run three tables read (ht_char_ptb, its gate-zoo part and the gate zoo), a diverged random-search trial, and a
# single-run table's run (kept as `run`, its job name empty)
THREE = [RUNS / "ht_char_ptb-cpu" / "seed=0,variant=baseline",
         RESULTS / "highway_networks" / "runs" / "hn_fig1-cpu" / "model.depth=20,model.kind=residual,trial=10",
         RESULTS / "highway_networks" / "runs" / "hn_analysis-cpu" / "run"]


def offline(mp: pytest.MonkeyPatch, tmp) -> None:
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_SILENT", "true")
    mp.setenv("WANDB_DIR", str(tmp))
    for key in ("WANDB_API_KEY", "WANDB_ENTITY", "WANDB_PROJECT"):
        mp.delenv(key, raising=False)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """THREE exported once (one process), into a module-wide folder: (export folder, what export returned)."""
    from highway_repro.dashboards.export import export

    out = tmp_path_factory.mktemp("wandb_export")
    with pytest.MonkeyPatch.context() as mp:
        offline(mp, out)
        return out, export(RESULTS, out, jobs=1, folders=THREE)


@pytest.fixture(scope="module")
def specs():
    from highway_repro.dashboards.spec import build_specs

    return build_specs(RESULTS)


def records(path):
    """The records of an offline run's `.wandb` file as wandb's own protobuf `Record`s. The file is W&B's
    LevelDB-style log: a 7-byte header (`:W&B`, magic, version), then 32 KiB blocks of chunks, each with a 7-byte
    header (checksum, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    out, buf, pos = [], b"", 7
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        buf, pos = buf + data[pos + 7:pos + 7 + n], pos + 7 + n
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            out.append(record)
            buf = b""
    return out


def read_offline_run(folder) -> dict:
    """An offline run folder as {"run": its run record, "config", "history": {step: {key: value}}, "summary"}."""
    (file,) = folder.glob("run-*.wandb")
    out = {"config": {}, "history": {}, "summary": {}}
    for _ in range(120):  # W&B's service may still be flushing the file on a busy machine (up to a minute)
        if any(r.WhichOneof("record_type") == "exit" for r in records(file)):
            break
        time.sleep(0.5)

    def items(updates):
        return {(u.key or "/".join(u.nested_key)): json.loads(u.value_json) for u in updates}

    for r in records(file):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            out["run"] = r.run
            out["config"].update(items(r.run.config.update))
        elif kind == "config":
            out["config"].update(items(r.config.update))
        elif kind == "history":
            row = items(r.history.item)
            out["history"][row["_step"]] = {k: v for k, v in row.items() if not k.startswith("_")}
        elif kind == "summary":
            out["summary"].update(items(r.summary.update))
    out["config"].pop("_wandb", None)
    return out


def same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def test_three_kept_runs_export_as_their_folders_say(exported):
    """Each exported run, read back from its .wandb file: the id, group, name and config `logger=wandb` gives the
    same run, a tag per table that reads it plus scale and device, metrics.jsonl as the history at its own steps,
    metrics.json as the summary."""
    from highway_repro.grids import dirname
    from highway_repro.report.identity import excluded_keys, identity
    from highway_repro.report.runs import read_yaml, renamed

    out, summary = exported
    index = json.loads((out / "exported.json").read_text())
    assert summary["written"] == summary["runs"] == len(index) == 3
    tags, summarised = {}, 0
    for folder in THREE:
        config = read_yaml(folder / "config_resolved.yaml")
        who = identity(config, dirname(read_yaml(folder / ".hydra" / "overrides.yaml"), excluded_keys()))
        rec = index[who["id"]]
        got = read_offline_run(out / rec["run"])
        run = got["run"]
        tags[folder.parent.name] = {t for t in run.tags if t.startswith("table:")}
        assert (run.run_id, run.run_group, run.display_name) == (who["id"], who["group"], who["name"])
        assert rec["run"].endswith(who["id"]) and got["config"] == json.loads(json.dumps(who["config"]))
        assert "logger" not in got["config"] and got["config"]["seed"] == config["seed"]
        assert {"scale:cpu", "device:cpu"} <= set(run.tags)
        lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        assert sorted(got["history"]) == sorted({line["step"] for line in lines})
        for line in lines:
            assert all(same(got["history"][line["step"]][k], v) for k, v in line.items() if k != "step")
        final = renamed(json.loads((folder / "metrics.json").read_text()))
        best = {k: min(line[k] for line in lines if k in line) for k in ("val/loss", "val/bpc", "val/ppl")
                if k in final}
        assert all(got["summary"][k] == ({"min": best[k], "last": v} if k in best else v)
                   for k, v in final.items() if isinstance(v, (int, float, str))), got["summary"]
        summarised += len(best)
        assert "best/val_loss" not in got["summary"] and ("val/best_loss" in got["summary"]) == ("val/loss" in final)
    assert tags == {"ht_char_ptb-cpu": {"table:ht_char_ptb", "table:ht_zoo_char_ptb", "table:ht_gate_zoo"},
                    "hn_fig1-cpu": {"table:hn_fig1"}, "hn_analysis-cpu": {"table:hn_analysis"}}
    assert summarised >= 2  # val/loss and val/bpc of the char-PTB run: {"min": the best evaluation, "last": the final}
    assert run.display_name == "hn_analysis" and run.config.update  # the single run: named by its experiment


def test_a_second_export_duplicates_nothing(exported, monkeypatch):
    from highway_repro.dashboards.export import export

    out, _ = exported
    offline(monkeypatch, out)
    before = sorted(p.name for p in (out / "wandb").glob("offline-run-*"))
    again = export(RESULTS, out, jobs=1, folders=THREE)
    assert (again["written"], again["skipped"]) == (0, 3)
    assert sorted(p.name for p in (out / "wandb").glob("offline-run-*")) == before and len(before) == 3


def test_a_table_report_run_holds_the_paper_lines_the_quantiles_and_the_claims_table(tmp_path, monkeypatch, specs):
    from highway_repro.dashboards.export import report_items, write_chunk

    offline(monkeypatch, tmp_path)
    spec, fig1 = (next(s for s in specs if s["table"] == name) for name in ("ht_char_ptb", "hn_fig1"))
    item, search = report_items([spec, fig1])
    written = write_chunk([item, search], tmp_path, "highway-repro")
    got = read_offline_run(tmp_path / written[item.id]["run"])
    quantiles = read_offline_run(tmp_path / written[search.id]["run"])["summary"]
    assert len(fig1["quantiles"]) == 12 and all(quantiles[q["key"]] == q["value"] for q in fig1["quantiles"])
    assert got["run"].display_name == "report: ht_char_ptb" and "table:ht_char_ptb" in got["run"].tags
    assert sorted(got["history"]) == [0, 3000] and got["config"]["row"] == "paper"
    for ref in spec["references"]:
        assert all(got["history"][step][ref["key"]] == ref["value"] for step in (0, 3000))
    assert got["summary"]["report/claims/_type"] == "table-file"
    assert got["summary"]["report/claims/nrows"] == len(spec["claims"]["rows"]) == 14


def test_the_run_id_is_one_deterministic_rule():
    from highway_repro.report.identity import identity, row_of, run_id

    a = run_id("ht_char_ptb", "cpu", "seed=1,variant=sdu_tanh")
    assert a == run_id("ht_char_ptb", "cpu", "seed=1,variant=sdu_tanh") and len(a) == 16 and a.isalnum()
    assert len({a, run_id("ht_char_ptb", "paper", "seed=1,variant=sdu_tanh"),
                run_id("ht_char_ptb", "cpu", "seed=2,variant=sdu_tanh"),
                run_id("ht_char_ptb_rt", "cpu", "seed=1,variant=sdu_tanh")}) == 4
    assert identity({"name": "ht_char_ptb", "scale_name": "cpu"}, "seed=1,variant=sdu_tanh")["id"] == a
    assert row_of("model.gate_layers=[3,4],seed=2,variant=x") == "model.gate_layers=[3,4],variant=x"
    assert row_of("model.depth=10,model.kind=plain,trial=3") == "model.depth=10,model.kind=plain"
    assert row_of("") == "default"


def test_a_kept_run_s_best_validation_loss_has_one_name():
    """Older metrics.json files hold `best/val_loss` (null without a validation split); every reader of a kept run
    (`report.runs.load_run`: the reports, the export) sees it as `val/best_loss`, the name the history logs."""
    from highway_repro.report.runs import load_run, renamed

    assert renamed({"step": 3, "best/val_loss": 1.5}) == {"step": 3, "val/best_loss": 1.5}
    assert renamed({"best/val_loss": None, "test/acc": 0.9}) == {"test/acc": 0.9}
    assert renamed({"best/val_loss": 1.5, "val/best_loss": 1.25}) == {"val/best_loss": 1.25}
    old = json.loads((THREE[0] / "metrics.json").read_text())
    assert "best/val_loss" in old and load_run(THREE[0]).final == renamed(old) and "best/val_loss" not in renamed(old)


def test_every_kept_job_is_named_as_hydra_named_its_folder():
    """The job name from a kept run's overrides is its folder's name (Hydra's override_dirname), for every kept
    sweep job: the id the export derives is the one the training job had."""
    from highway_repro.grids import dirname, dirname_items
    from highway_repro.report.identity import excluded_keys
    from highway_repro.report.runs import read_yaml

    exclude = excluded_keys()
    folders = [p.parent for p in RESULTS.glob("*/runs/*/*/metrics.json") if p.parent.name != "run"]
    assert len(folders) > 600
    overrides = {f: read_yaml(f / ".hydra" / "overrides.yaml") for f in folders}
    wrong = [f for f in folders if dirname(overrides[f], exclude) != f.name]
    assert not wrong, wrong[:3]
    kept = {f: sorted(o for o in overrides[f] if o.split("=")[0] not in exclude) for f in folders}
    unread = [f for f in folders if dirname_items(f.name) != kept[f]]
    assert not unread, unread[:3]


def test_every_table_spec_names_only_keys_its_runs_log(specs):
    from highway_repro.grids import kept_folders
    from highway_repro.targets import REPORTS

    assert {s["table"] for s in specs} == set(REPORTS)
    for spec in specs:
        folders = kept_folders(spec["table"], spec["scale"], RESULTS)
        logged = set()
        for f in folders:
            logged |= set(json.loads((f / "metrics.json").read_text()))
            for line in (f / "metrics.jsonl").read_text().splitlines():
                logged |= set(json.loads(line))
        reported = {r["key"] for r in spec["references"] + spec["quantiles"]} | {spec["claims"]["key"]}
        keys = [k.removesuffix(".last") for p in spec["panels"]  # val/bpc.last: W&B's last value of val/bpc
                for k in p.get("y", []) + [p[x] for x in ("metric", "key") if x in p]]
        assert any(p["kind"] == "line" for p in spec["panels"]), spec["table"]
        assert set(keys) <= logged | reported, (spec["table"], set(keys) - logged - reported)
        assert all(k in logged for k in keys if not k.startswith(("paper/", "report/"))), spec["table"]
        assert {c.split(":", 1)[1].removesuffix(".last") for c in spec["columns"] if c.startswith("summary:")} <= logged
        assert set(spec["group_by"]) <= {"name", "row"} and 0 < spec["runs"] <= len(folders)
        json.dumps(spec)
    char = next(s for s in specs if s["table"] == "ht_char_ptb")
    assert {r["key"]: r["value"] for r in char["references"]}["paper/test_bpc/sdu_tanh"] == 1.364
    assert next(s for s in specs if s["table"] == "ht_gate_zoo")["group_by"] == ["name", "row"]
    anchor = next(s for s in specs if s["table"] == "ht_paper_anchor")  # its end metric is val/bpc: W&B's summary
    assert "summary:val/bpc.last" in anchor["columns"]  # of a validation loss is its min and its last value


def test_the_logger_in_a_kept_run_s_folder_starts_the_run_the_export_gives(tmp_path, monkeypatch, exported):
    """WandbLogger started in a copy of a kept sweep job's folder (its .hydra/overrides.yaml, as the job's callback
    writes it) with its saved config: the id, name, group, job type, tags (the three tables that read the run) and
    config columns of the export's run of the kept folder."""
    import shutil

    from highway_repro.dashboards.export import kept_items
    from highway_repro.engine.loggers import WandbLogger
    from highway_repro.report.runs import read_yaml

    offline(monkeypatch, tmp_path)
    folder = THREE[0]
    run_dir = tmp_path / "sweep" / folder.name
    shutil.copytree(folder / ".hydra", run_dir / ".hydra")
    config = read_yaml(folder / "config_resolved.yaml")
    logger = WandbLogger(run_dir, config={**config, "logger": {"kind": "wandb"}})
    try:
        run = logger.run
        (item,) = kept_items(RESULTS, [folder])
        assert (run.id, run.name, run.group, run.job_type) == (item.id, item.name, item.group, "train")
        assert sorted(run.tags) == item.tags == ["device:cpu", "scale:cpu", "table:ht_char_ptb", "table:ht_gate_zoo",
                                                 "table:ht_zoo_char_ptb"]
        assert dict(run.config) == json.loads(json.dumps(item.config)) and run.config["row"] == "variant=baseline"
    finally:
        run.finish()
    assert [p.name.split("-")[3] for p in (run_dir / "wandb").glob("offline-run-*")] == [item.id]


def test_the_tables_a_live_run_names_are_those_that_read_it_once_kept():
    """`identity.readers` of each kept run (the table of its sweep override, its job, its device) is the set of
    reports whose `kept_folders` hold it: the table tags of a live run are those the export gives its kept copy."""
    from highway_repro.grids import kept_folders
    from highway_repro.report.identity import job_of, readers, table_of
    from highway_repro.targets import REPORTS, kept_apart
    from highway_repro.report.runs import read_yaml

    read_by: dict = {}
    for name in REPORTS:
        for scale in ("cpu", "paper", "smoke"):
            for folder in kept_folders(name, scale, RESULTS):
                read_by.setdefault((folder, scale), []).append(name)
    assert len(read_by) > 650 and max(map(len, read_by.values())) == 4  # enwik8 L6: 2 studies, the zoo
    for (folder, scale), tables in read_by.items():
        job, overrides = job_of(folder)
        experiment = read_yaml(folder / "config_resolved.yaml")["name"]
        apart = bool(json.loads((folder / "run_info.json").read_text()).get("cuda_device")) and kept_apart(scale)
        assert readers(table_of(overrides, experiment, job), scale, job, apart) == tables, folder


def test_the_dashboards_command_offline_writes_the_specs_in_one_line(tmp_path, monkeypatch, capsys, specs):
    from highway_repro.dashboards import __main__ as cli

    offline(monkeypatch, tmp_path)
    monkeypatch.setattr(cli, "build_specs", lambda results: specs)
    assert cli.main(["dashboards", "--out", str(tmp_path)]) == 0
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("W&B offline (WANDB_MODE=offline)"), said
    written = sorted(p.name for p in (tmp_path / "dashboards").glob("*.json"))
    assert written == sorted(f"{s['table']}-{s['scale']}.json" for s in specs)
    assert cli.main(["export", "--jobs", "0", "--out", str(tmp_path)]) == 2
    assert "--jobs=0 is not allowed" in capsys.readouterr().err


def test_each_spec_makes_a_saved_view_without_the_network(specs):
    pytest.importorskip("wandb_workspaces")
    from highway_repro.dashboards.publish import view_name, workspace

    names = set()
    for spec in specs:
        view = workspace(spec, "an-entity", "highway-repro")._to_model()
        assert view.display_name == spec["name"] and view.name == view_name(spec)
        names.add(view.name)
    assert len(names) == len(specs)


@pytest.mark.slow  # every kept run: about a minute on 2 cores
def test_the_whole_export_is_one_run_per_distinct_kept_run(tmp_path, monkeypatch, specs):
    from highway_repro.dashboards.export import export, kept_items

    offline(monkeypatch, tmp_path)
    distinct = len(kept_items(RESULTS))
    first = export(RESULTS, tmp_path, jobs=2)
    assert first["written"] == first["runs"] == distinct + len(specs)
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == first["runs"]
    assert export(RESULTS, tmp_path, jobs=2)["written"] == 0


def test_each_dashboard_shows_the_rows_of_its_table(specs):
    """Each dashboard's filter, applied to the tags the export gives every kept run, selects the runs its table
    counts (summary.csv's `runs`: one device's, the GPU-made runs of a cpu-scale table left out); the mean of the
    end metric over each of its groups (W&B's bar: the runs that have it in their summary) is a row mean of the table
    in results/summary.csv, row for row; Fig. 1's bar holds the quantile of each row's trials, diverged trials
    counted, that its claims in summary.csv test."""
    import csv

    from highway_repro.dashboards.export import kept_items, report_items

    items = kept_items(RESULTS)
    lines = list(csv.DictReader((RESULTS / "summary.csv").open()))
    for spec in specs:
        mine = [line for line in lines if line["table"] == spec["table"] and line["scale"] == spec["scale"]]
        tags, devices = set(spec["filter"]["tags"]), set(spec["filter"]["devices"])
        chosen = [i for i in items if tags <= set(i.tags) and devices & set(i.tags)]
        assert len(chosen) == spec["runs"] == int(mine[0]["runs"]), spec["table"]
        (report,) = report_items([spec])  # its paper lines, quantiles and claims: on the dashboard too
        assert tags <= set(report.tags) and devices & set(report.tags), spec["table"]
        bar = next((p for p in spec["panels"] if p["kind"] == "bar"), None)
        if spec["quantiles"]:
            tested = {(c["row"], c["n_seeds"]): float(c["mean"]) for c in mine if c["kind"] == "claim"}
            shown = {(q["row"], str(q["trials"])): q["value"] for q in spec["quantiles"]}
            assert bar["y"] == [q["key"] for q in spec["quantiles"]] and len(shown) == 12
            assert all(math.isclose(shown[k] if c["metric"] == "loss" else math.log10(shown[k]), v, rel_tol=1e-5)
                       for k, v in tested.items() for c in mine if (c["row"], c["n_seeds"]) == k), tested
            continue
        if bar is None:
            continue
        groups: dict = {}
        for i in chosen:
            value = json.loads((Path(i.folder) / "metrics.json").read_text()).get(bar["y"][0].removesuffix(".last"))
            if isinstance(value, (int, float)) and math.isfinite(value):
                groups.setdefault(tuple(i.config[k] for k in spec["group_by"]), []).append(value)
        percent = 100 if bar["y"][0].endswith("/acc") else 1  # the tables give accuracy in %
        means = sorted(percent * sum(v) / len(v) for v in groups.values())
        table = sorted(float(line["mean"]) for line in mine if line["kind"] == "row")
        assert len(means) == len(table), spec["table"]
        assert all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(means, table)), (spec["table"], means, table)
