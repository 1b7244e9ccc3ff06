"""The studies: the placement scan and the gate zoo reuse the runs of the tables they extend, and the
parameter-matched baseline widens the FFN to the gated model's parameter count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import mirror, needs_mirror

ROOT = Path(__file__).resolve().parents[1]


def _fake_run(folder: Path, status: str = "done"):
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"status": status, "time/wall_s": 1.0}))
    (folder / "config_resolved.yaml").write_text("seed: 0\n")


def test_placement_scan_grid_is_one_gated_layer_per_row_five_seeds():
    """Five seeds a row: seeds 0 and 1 for every row (configs/sweep/ht_placement_scan/cpu.yaml), and seeds 2-4
    (cpu-extra_seeds.yaml), as ht_enwik8_l6's sweep files give the rows a paper claim compares: the same runs as the
    table's where the rows are the table's (baseline, all layers), reused, so both give the same numbers for them;
    then the second look's seeds 5-8 of layers 1 and 6 (cpu-second_look.yaml)."""
    from highway_repro.runner.plan import plan

    _, grids, names = plan("ht_placement_scan", "cpu", [])
    rows = ["baseline", "sdu_tanh"] + [f"tanh_l{k}" for k in range(1, 7)]
    assert names == [f"seed={s},variant={v}" for v in rows for s in (0, 1)] + [
        f"seed={s},variant={v}" for v in rows for s in (2, 3, 4)] + [
        f"seed={s},variant={v}" for v in ("tanh_l1", "tanh_l6") for s in (5, 6, 7, 8)]
    assert set(names) <= set(plan("ht_enwik8_l6", "cpu", [])[2]) | {
        f"seed={s},variant=tanh_l{k}" for s in range(9) for k in range(1, 7)}
    _, _, by_hand = plan("ht_placement_scan", "cpu", ["seed=5"])  # a seed given by hand: every row, once
    assert by_hand == [f"seed=5,variant={v}" for v in rows]
    # rows given by hand take the table's extra seeds where the table has them for those rows, and no other row does
    assert plan("ht_placement_scan", "cpu", ["variant=tanh_l3"])[2] == [
        f"seed={s},variant=tanh_l3" for s in range(5)]
    assert plan("ht_char_ptb", "cpu", ["variant=sdu_tanh,highway"])[2] == [
        "seed=0,variant=sdu_tanh", "seed=1,variant=sdu_tanh", "seed=0,variant=highway", "seed=1,variant=highway",
        "seed=2,variant=sdu_tanh", "seed=3,variant=sdu_tanh", "seed=4,variant=sdu_tanh"]


def test_gate_zoo_parts_cover_every_gate_kind_on_three_models():
    from highway_repro.models.placement import GATE_KINDS, is_gated
    from highway_repro.runner.plan import plan
    from highway_repro.targets import TARGETS

    zoo = TARGETS["ht_gate_zoo"]
    assert {TARGETS[p].experiment for p in zoo.parts} == {"ht_char_ptb", "ht_char_ptb_rt", "ht_enwik8_l6"}
    for part in zoo.parts:
        assert TARGETS[part].reuse == (TARGETS[part].experiment,)  # the runs of its own table are reused
        _, _, names = plan(part, "cpu", [])
        variants = {n.split("variant=")[1] for n in names}
        assert {"baseline", "baseline_matched"} <= variants
        table = set(plan(TARGETS[part].experiment, "cpu", [])[2])  # the table it extends
        for v in variants:  # two seeds a row; more where the table has more (the same runs)
            seeds = [n for n in names if n.endswith(f"variant={v}")]
            assert seeds[:2] == [f"seed=0,variant={v}", f"seed=1,variant={v}"], seeds
            assert sorted(seeds) == sorted(n for n in table if n.endswith(f"variant={v}")) or len(seeds) == 2, seeds
        gated = {"sdu_sigmoid": "sdu_sigmoid", "sdu_tanh": "sdu_tanh", "highway": "highway", "gated_attn": "gated_attn"}
        assert {k for k in GATE_KINDS if is_gated(k)} == {gated[v] for v in variants if v in gated}


def test_reuse_restores_only_the_runs_the_study_names(tmp_path):
    from highway_repro.runner.keep import restore

    table = tmp_path / "kept_table"
    for n in ("seed=0,variant=baseline", "seed=2,variant=baseline", "seed=0,variant=highway"):
        _fake_run(table / n)
    _fake_run(table / "seed=1,variant=sdu_tanh", status="failed")  # not finished: trained again
    study = tmp_path / "sweep"
    names = ["seed=0,variant=baseline", "seed=1,variant=sdu_tanh", "seed=0,variant=tanh_l1"]
    assert restore(table, study, names) == ["seed=0,variant=baseline"]
    assert sorted(p.name for p in study.iterdir()) == ["seed=0,variant=baseline"]


def test_a_study_is_reported_from_the_runs_of_the_table_it_reuses_before_it_trains(tmp_path):
    """`make tables` shows a study, partial, from the kept runs of the table it reuses that are cells of its grid
    (as the runner would restore them); its own kept run of a name wins; a run outside its grid is not read."""
    from highway_repro.runner.keep import table_runs

    table = tmp_path / "results" / "highway_transformer" / "runs" / "ht_enwik8_l6-cpu"
    for n in ("seed=0,variant=baseline", "seed=1,variant=sdu_tanh", "seed=0,variant=gated_attn",
              "seed=7,variant=baseline"):  # the last two: not cells of the scan (no such row; no such seed)
        _fake_run(table / n)
    own = tmp_path / "results" / "highway_transformer" / "runs" / "ht_placement_scan-cpu" / "seed=0,variant=baseline"
    _fake_run(own)
    runs = table_runs("ht_placement_scan", "cpu", tmp_path / "runs", tmp_path / "results")
    assert [(r.path.parent.name, r.path.name) for r in runs] == [
        ("ht_placement_scan-cpu", "seed=0,variant=baseline"), ("ht_enwik8_l6-cpu", "seed=1,variant=sdu_tanh")]
    assert [r.path.name for r in table_runs("ht_enwik8_l6", "cpu", tmp_path / "runs", tmp_path / "results")] == [
        "seed=0,variant=baseline", "seed=0,variant=gated_attn", "seed=1,variant=sdu_tanh", "seed=7,variant=baseline"]


def test_a_study_keeps_only_its_own_runs_and_its_budget_counts_them(tmp_path):
    """A run restored from the table a study reuses stays kept in that table's folder only (`keep` leaves it out of
    the study's), and the table's header gives the budget's measure (its runs' CPU time per thread, packed on 2
    jobs) of the runs the study trained itself."""
    from highway_repro.runner.cli import report_table
    from highway_repro.runner.keep import keep, reused_names

    results = tmp_path / "results"
    table = results / "highway_transformer" / "runs" / "ht_enwik8_l6-cpu"
    study = results / "highway_transformer" / "runs" / "ht_placement_scan-cpu"
    sweep = tmp_path / "runs" / "ht_placement_scan-cpu"
    for folder, cpu_s in ((table / "seed=0,variant=baseline", 3600.0), (table / "seed=1,variant=baseline", 3600.0),
                          (sweep / "seed=0,variant=baseline", 3600.0),  # restored from the table
                          (sweep / "seed=0,variant=tanh_l1", 1800.0), (sweep / "seed=1,variant=tanh_l1", 1800.0),
                          (sweep / "seed=0,variant=tanh_l2", 3600.0), (study / "seed=1,variant=baseline", 7200.0)):
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text(json.dumps({"status": "done", "time/wall_s": 2 * cpu_s,
                                                         "time/cpu_s": cpu_s, "test/bpc": 2.0}))
        (folder / "run_info.json").write_text(json.dumps({"threads": 1}))
    reused = reused_names("ht_placement_scan", "cpu", results)
    assert reused == {"seed=0,variant=baseline"}  # its own kept run of seed 1 wins over the table's
    keep(sweep, study, reused=reused)
    assert sorted(p.name for p in study.iterdir()) == ["seed=0,variant=tanh_l1", "seed=0,variant=tanh_l2",
                                                         "seed=1,variant=baseline", "seed=1,variant=tanh_l1"]
    assert report_table("ht_placement_scan", "cpu", tmp_path / "runs", results) == 0
    md = (results / "highway_transformer" / "placement_scan.md").read_text()
    # in folder-name order 0.5 h, 1 h, 2 h, 0.5 h on 2 jobs: 0.5 + 2 on the first, 1 + 0.5 on the second
    assert "- with the cores to themselves: 2.50 h for the 4 finished runs trained for this table, on 2 jobs" in md


def test_matched_baseline_widens_the_ffn_to_the_sdu_parameter_count():
    """An SDU-gated sublayer adds 2d^2 + 2d parameters (its d x 2d projection and 2d bias); widening the FFN by one
    unit adds 2d + 1 (a column of W1, its bias, a row of W2). With both sublayers of every layer gated, the FFN
    must grow by 4d(d+1)/(2d+1) = 257 units at d 128 (66,048 vs 66,049 parameters a layer)."""
    from hydra import compose, initialize_config_dir

    from highway_repro.train.job import build
    from highway_repro.train import match_params

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=ht_char_ptb", "scale=cpu", "variant=baseline_matched"])
        gated_cfg = compose("train", overrides=["experiment=ht_char_ptb", "scale=cpu", "variant=sdu_tanh"])
    meta = {"vocab_size": 50}
    assert cfg.model.d_ff == 512 and match_params(cfg, meta) == 512 + 257 == cfg.model.d_ff
    count = lambda c: sum(p.numel() for p in build(c.model, "model", **meta).parameters())  # noqa: E731
    assert count(cfg) - count(gated_cfg) == cfg.model.n_layers  # one parameter a layer over, as computed above


KEPT_MATCHED = sorted((ROOT / "results").glob("*/runs/*/*variant=baseline_matched*/config_resolved.yaml"))


@pytest.mark.parametrize("saved", KEPT_MATCHED, ids=lambda p: p.parent.parent.name)
def test_match_params_gives_the_width_of_the_kept_matched_runs(saved):
    """Each kept run of the parameter-matched baseline (the gate zoo's three models at the cpu scale) trained at the
    width its config_resolved.yaml holds (769); the config its job composes now is widened to the same width."""
    import yaml
    from hydra import compose, initialize_config_dir

    from highway_repro.train import match_params

    kept = yaml.safe_load(saved.read_text())
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=[f"experiment={kept['name']}", f"scale={kept['scale_name']}",
                                          "variant=baseline_matched"])
    assert cfg.model._target_ == kept["model"]["_target_"]
    assert match_params(cfg, {"vocab_size": kept["model"].get("vocab_size") or 50}) == kept["model"]["d_ff"] == 769


def test_the_matched_model_draws_what_an_ungated_model_of_its_width_draws():
    """match_params draws no random number (one build on the meta device): from the same seed the matched model has
    the initial values of the ungated model built at the matched width directly, the first draws after the seed."""
    import torch
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from highway_repro.train.job import build
    from highway_repro.train import match_params

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=ht_char_ptb", "scale=smoke", "variant=baseline_matched"])
    meta, d = {"vocab_size": 50}, int(cfg.model.d_ff)
    torch.manual_seed(0)
    state = torch.get_rng_state()
    assert match_params(cfg, meta) > d and torch.equal(torch.get_rng_state(), state)
    ours = build(cfg.model, "model", **meta).state_dict()
    torch.manual_seed(0)
    reference = build(OmegaConf.merge(cfg.model, {"d_ff": cfg.model.d_ff}), "model", **meta).state_dict()
    assert ours.keys() == reference.keys() and all(torch.equal(ours[k], reference[k]) for k in ours)


def test_the_kept_matched_runs_are_found():
    assert len(KEPT_MATCHED) >= 6 and {p.parent.parent.name for p in KEPT_MATCHED} == \
        {"ht_zoo_char_ptb-cpu", "ht_zoo_char_ptb_rt-cpu", "ht_zoo_enwik8_l6-cpu"}


@pytest.mark.parametrize("model", ["transformer_lm", "r_transformer", "transformer_xl"])
def test_one_meta_build_gives_the_width_of_the_counts_at_two_widths(model):
    """`gates.matched_d_ff` from one build of the gated model on the meta device equals the width found from real
    parameter counts of the ungated model at d_ff and d_ff + 1 (linear in d_ff), for every gate kind and placement;
    also with d_model == d_ff (the FFN's two Linears are then square in one dimension). No random number is drawn."""
    import torch

    from highway_repro.models import placement
    from highway_repro.models.gates import matched_d_ff
    from highway_repro.models.r_transformer import RTransformer
    from highway_repro.models.transformer_lm import TransformerLM
    from highway_repro.models.transformer_xl import TransformerXL

    cls = {"transformer_lm": TransformerLM, "r_transformer": RTransformer, "transformer_xl": TransformerXL}[model]
    extra = {"d_head": 4} if model == "transformer_xl" else {}
    count = lambda **kw: sum(p.numel() for p in cls(13, **kw).parameters())  # noqa: E731
    for d_model, d_ff in ((8, 24), (16, 16)):
        for kind in (k for k in placement.GATE_KINDS if placement.is_gated(k)):
            for layers, sublayers in (("all", "both"), ([2], "ffn")):
                kw = dict(n_layers=2, d_model=d_model, n_heads=2, gate_layers=layers, gate_sublayers=sublayers,
                          **extra)
                target, p0, p1 = count(gate_kind=kind, d_ff=d_ff, **kw), count(d_ff=d_ff, **kw), \
                    count(d_ff=d_ff + 1, **kw)
                state = torch.get_rng_state()
                with torch.device("meta"):
                    gated = cls(13, gate_kind=kind, d_ff=d_ff, **kw)
                assert torch.equal(state, torch.get_rng_state())
                assert matched_d_ff(gated, d_ff) == d_ff + round((target - p0) / (p1 - p0)), (kind, layers, d_model)


def test_match_params_rejects_a_gated_model_and_an_unknown_kind():
    """Checked with the rest of the config (`config.validate`), before anything is built."""
    from hydra import compose, initialize_config_dir

    from highway_repro.train.config import ConfigError, validate

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=ht_char_ptb", "scale=smoke", "variant=sdu_tanh",
                                          "match_params=sdu_tanh"])
        bad = compose("train", overrides=["experiment=ht_char_ptb", "scale=smoke", "variant=baseline_matched",
                                          "match_params=wide"])
    with pytest.raises(ConfigError, match="model.gate_kind=none"):
        validate(cfg)
    with pytest.raises(ConfigError, match="match_params=wide is not a gate kind"):
        validate(bad)


@needs_mirror
@pytest.mark.slow
def test_gate_zoo_smoke_pipeline_reuses_table_runs_and_writes_the_verdict_grid(tmp_path):
    env = {**os.environ, "HIGHWAY_DATA_MIRROR": str(mirror())}
    base = [sys.executable, "-m", "highway_repro.runner", "--scale", "smoke", "--results",
            str(tmp_path / "results"), "--runs", str(tmp_path / "runs")]
    p = subprocess.run(base[:3] + ["ht_char_ptb"] + base[3:], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    p = subprocess.run(base[:3] + ["ht_gate_zoo"] + base[3:], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "[ht_zoo_char_ptb] scale=smoke: 6 runs, 5 finished (5 restored" in p.stdout
    text = (tmp_path / "results" / "highway_transformer" / "gate_zoo.md").read_text()
    assert "runs: 18 done, 0 failed, 0 missing" in text and "Verdict per cell" in text
    for v in ("baseline_matched", "sdu_sigmoid", "sdu_tanh", "highway", "gated_attn"):
        assert f"| `{v}` |" in text
