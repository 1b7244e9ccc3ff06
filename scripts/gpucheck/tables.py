"""Phase 8, the expected time of every paper table on this GPU: runs x steps x step time + evaluations."""

from __future__ import annotations

import functools
import math

from .cases import BASE_VARIANTS, CASE_BY_KEY, TABLE_CASE
from .phases import Ctx
from .report import fmt, hours, md_table

# items of the paper's evaluation splits where the check's data is a subset (used to scale evaluation times)
PAPER_EVAL_ITEMS = {"enwik8_prefix": 5_000_000, "cifar10": 10_000}


def _count(value) -> int:
    """Number of values of a sweep parameter: `a,b,c` or `range(a,b[,s])`."""
    v = str(value).strip()
    if v.startswith("range(") and v.endswith(")"):
        return len(range(*[int(x) for x in v[6:-1].split(",")]))
    return len(v.split(","))


@functools.lru_cache(maxsize=1)
def paper_plan() -> tuple[dict, ...]:
    """For each paper table: runs per variant class (baseline/plain vs gated/highway), steps and evaluations at
    scale=paper, from the config files as the runner reads them (`highway_repro.runner.plan.plan`, what
    `make reproduce-<table> SCALE=paper` runs). Needs no GPU."""
    from highway_repro.runner.plan import plan as table_plan
    from highway_repro.targets import PAPER_TABLES, TARGETS

    plan = []
    for table in PAPER_TABLES:  # the studies are not paper tables
        t = TARGETS[table]
        cfg, grids, names = table_plan(table, "paper", [])
        params = dict(o.split("=", 1) for o in grids[0]) if t.sweep else {}
        n_runs = len(names)
        n_base = sum(any(f"{k}={v}" in n.split(",") for k in ("variant", "model.kind") for v in BASE_VARIANTS)
                     for n in names)
        tr = cfg.trainer
        plan.append({"table": table, "target": f"make reproduce-{table.replace('_', '-')} SCALE=paper",
                     "experiment": t.experiment, "runs": n_runs, "base_runs": n_base, "steps": int(tr.max_steps),
                     "eval_every": int(tr.eval_every), "eval_cap": tr.eval_max_batches,
                     "splits": list(tr.splits), "grid": params, "case": TABLE_CASE.get(table)})
    return tuple(plan)


def table_time(p: dict, base: dict | None, gated: dict | None) -> float | None:
    """Seconds for one table: sum over its runs of steps x step time + evaluation passes x batches x batch time.

    Evaluation passes per run, as the Trainer does them: on `val` (if the data has it) every `eval_every` steps
    and at the end (capped at eval_max_batches in between), then one pass over each other split of
    trainer.splits. Batches per pass: the check's data, scaled to the paper's split where the check holds a
    subset (enwik8 prefix: 5M bytes; CIFAR-10: 10,000 test images)."""
    total = 0.0
    for r, n in ((base, p["base_runs"]), (gated, p["runs"] - p["base_runs"])):
        if n == 0:
            continue
        r = r or base or gated
        if r is None or not r.get("eval"):
            return None
        ev = r["eval"]
        scale = {s: (PAPER_EVAL_ITEMS[ev["data_name"]] / items if ev["data_name"] in PAPER_EVAL_ITEMS else 1.0)
                 for s, (_, items) in ev["sizes"].items()}
        batches = {s: b * scale[s] for s, (b, _) in ev["sizes"].items()}
        evals = 0.0
        if "val" in batches:
            n_val = math.ceil(p["steps"] / p["eval_every"]) if p["eval_every"] else 1
            inter = min(batches["val"], p["eval_cap"]) if p["eval_cap"] else batches["val"]
            evals += (n_val - 1) * inter + batches["val"]
        evals += sum(batches[s] for s in p["splits"] if s != "val" and s in batches)
        total += n * (p["steps"] * r["step_s"] + evals * ev["batch_s"])
    return total


def tables_section(ctx: Ctx) -> None:
    plan = paper_plan()
    rows = []
    for p in plan:
        case = CASE_BY_KEY.get(p["case"])
        times, mems = {}, []
        for prec in ("bf16", "fp32"):
            base = ctx.results.get((p["case"], case.variants[0][0], prec)) if case else None
            gated = ctx.results.get((p["case"], case.variants[-1][0], prec)) if case else None
            if base or gated:
                times[prec] = table_time(p, base, gated)
                mems += [r["mem"] for r in (base, gated) if r and r.get("mem")]
                ctx.rep.row("tables", p["table"], "", prec, "table_s", times[prec], "s", p["target"])
        grid = " x ".join(f"{k} ({_count(v)})" for k, v in p["grid"].items()) or "one run"
        ctx.rep.row("tables", p["table"], "", "", "runs", p["runs"], "", grid)
        note = {"hn_fig1": "upper bound: every depth timed as depth 100",
                "hn_table1": "width 16 timed as width 32 (upper bound)",
                "hn_analysis": "timed as the depth-100 net (upper bound; the analysis net has depth 50)",
                "ht_enwik8_l12": "gated rows timed as tanh on all 12 layers (upper bound)"}.get(p["table"], "")
        rows.append([f"`{p['target']}`", grid, f"{p['runs']:,}", f"{p['steps']:,}",
                     hours(times.get("bf16")), hours(times.get("fp32")),
                     fmt(max(mems), 1, "B") if mems else "n/a", note])
    ctx.rep.section("tables", "Expected time of each paper table on this GPU (one process, runs one after another)", [
        "time = sum over the table's runs of (steps x measured step time + evaluation passes x batches x measured "
        "evaluation batch time); runs from the sweep file and the paper overrides of `highway_repro/runner/`; "
        "gated/highway rows use the gated variant's step time, baseline/plain rows the baseline's. Data loading is "
        "in the step time (the trainer builds batches in the training process). Not included: start-up, checkpoint "
        "writes, the report. bf16 = `trainer.precision=bf16`; fp32 = the configs' default precision with TF32 "
        "matmuls (without TF32, slower). Ways to go faster: docs/gpu.md.", "",
        *md_table(["command", "grid", "runs", "steps/run", "time bf16", "time fp32/TF32", "peak memory", "note"], rows,
                  "---|---|---:|---:|---:|---:|---:|---")])
