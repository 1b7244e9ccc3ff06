#!/usr/bin/env python3
"""The Highway Transformer's char-PTB table (Chai et al., ACL 2020, arXiv 2004.08178; REFERENCE.md B1/B2) at the
paper's full recipe on one GPU, one run within one command of at most 10 minutes:

    python3 scripts/paper_recipe.py plan                            # the recipe, the runs, their expected time
    python3 scripts/paper_recipe.py compare --out $OUT              # 400 steps: the recipe's precision vs full fp32
    python3 scripts/paper_recipe.py run --rows baseline --out $OUT  # one full run, guarded, packed into $OUT
    python3 scripts/paper_recipe.py unpack <folder>                 # here: the packed files into results/
    make paper-recipe PART=run ROWS=baseline [DRY=1]                # the same (DRY=1: CPU, smoke scale, 4 steps)

A run is the table's own (`configs/sweep/ht_char_ptb/paper.yaml`, seed 1111: Transformer-L3, 99,600 steps of 16 x
400 characters, the paper's batch-1 evaluation of every validation window each epoch, the test split at the end),
trained by the runner (`python -m highway_repro.runner ht_char_ptb --scale paper variant=<row> trainer.device=cuda`)
and kept like every other table's run, its `run_info.json` naming the GPU. Its precision is part of the recipe,
fixed in `configs/experiment_scale/ht_char_ptb/paper.yaml` before any run (`trainer.tf32: true`); `compare` trains
baseline and SDU tanh 400 steps in it and in full fp32, side by side, into
`results/highway_transformer/char_ptb_l3_paper_precision.md` (+ .csv; its runs in `..._precision_runs/`).
`trainer.compile` (not part of a recipe): the fastest mode measured (`results/gpu_check_compiled.csv`), else
`reduce-overhead`; a dry run (CPU, smoke scale, a few steps) does not compile.

The plan prices each run: steps x the step time measured on a GPU (`results/gpu_check.csv`; SDU sigmoid timed as
SDU tanh, the same gate) over the compiled speed-up where one was measured. It refuses rows that would run one after
another (each needs the whole command: one row, or `--jobs` as many as rows), and a run that its measured speed
cannot end within the budget (`--force` starts it). The guard watches each run's `metrics.jsonl`: once a run has
logged for `--probe-s` seconds, its speed projects its end; a run projected past `--budget-s` (540 s) is stopped
at once (the runner keeps what finished; the speed is in the log), and everything stops at the budget. Checkpoints
stay on the GPU machine: a stopped run starts afresh on the next one.

What comes back (`--out`, at most 8 files of 16 MiB): `paper_recipe.tar.gz` (parts `.000`, `.001`, ... when
larger) with the files under `results/` that the command wrote: the kept runs (never a checkpoint), the runner's
record, the comparison, and one line per command in `results/highway_transformer/char_ptb_l3_paper_recipe.jsonl`
(the plan, the guard's projections, each run's end). `unpack` takes only plain files under `results/`; then
`make tables`. On the GPU machine it needs what `make gpu-check` needs (`docs/gpu.md`): the tree, `data/gpu_mirror`
(PTB in full; used as `HIGHWAY_DATA_MIRROR` where that is unset) and `.gpu_deps` where the Python lacks hydra.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEPS, GPU_MIRROR = REPO / ".gpu_deps", REPO / "data" / "gpu_mirror"
TABLE, CASE = "ht_char_ptb", "tlm3"  # the table and its case in the gpu check's CSVs
ROWS = ("baseline", "sdu_tanh", "sdu_sigmoid")  # the order a GPU spends them in
TIMED_AS = {"sdu_sigmoid": "sdu_tanh"}  # a row the gpu check did not time: the row of the same gate cost
COMPARE_ROWS, COMPARE_STEPS, DRY_STEPS = ("baseline", "sdu_tanh"), 400, 4
COMPARE_MARGIN_BPC = 0.01  # the largest |recipe - full fp32| test bpc after 400 steps called "the same"
BUDGET_S, PROBE_S, FINAL_EVAL_S = 540.0, 60.0, 20.0
PACK, MAX_FILES, MAX_BYTES = "paper_recipe.tar.gz", 8, 16 * 2 ** 20
OUT_DIR = "results/highway_transformer"
LOG = f"{OUT_DIR}/char_ptb_l3_paper_recipe.jsonl"
COMPILE_MODES = ("off", "default", "reduce-overhead")


class PlanError(ValueError):
    """A request the plan refuses: one line, exit code 2."""


def say(msg: str) -> None:
    print(f"[paper-recipe] {msg}", flush=True)


# ----------------------------------------------------------------------------- the plan (no torch)

def precision_of(trainer: dict) -> str:
    """The recipe's precision in words, from its trainer settings."""
    if trainer.get("precision") == "bf16":
        return "bf16 autocast"
    return "TF32 matrix products, fp32 weights and sums" if trainer.get("tf32") else "full fp32"


def compare_grid(trainer: dict) -> list[str]:
    """The overrides that train the recipe's precision and full fp32 side by side ([] when it is full fp32)."""
    if trainer.get("precision") == "bf16":
        return ["trainer.precision=bf16,fp32", "trainer.tf32=false"]
    return ["trainer.tf32=true,false"] if trainer.get("tf32") else []


def read_measured(results: Path) -> dict:
    """{(variant, precision, metric): value} of the gpu check's Transformer-L3 rows (`results/gpu_check.csv`, then
    `results/gpu_check_compiled.csv`), and {"device": ...}: what the plan prices runs with."""
    out: dict = {}
    for name in ("gpu_check.csv", "gpu_check_compiled.csv"):
        f = results / name
        if not f.exists():
            continue
        with open(f, newline="") as fh:
            for r in csv.DictReader(fh):
                if r["section"] == "machine" and r["metric"] == "GPU":
                    out["device"] = r["value"]
                elif r["section"] == "throughput" and r["case"] == CASE:
                    try:
                        out[(r["variant"], r["precision"], r["metric"])] = float(r["value"])
                    except ValueError:
                        continue
    return out


def choose_compile(measured: dict, precision: str, given: str | None) -> tuple[str, float | None]:
    """(trainer.compile's mode: `given`, else the fastest measured for the baseline at `precision` where faster than
    eager, else reduce-overhead; its measured speed-up over eager, 1.0 for off, None where not measured)."""
    eager = measured.get(("baseline", precision, "step_s"))
    ups = {m: eager / s for m in COMPILE_MODES[1:]
           if eager and (s := measured.get((f"baseline+compile-{m}", precision, "step_s")))}
    best = max(ups, key=ups.get) if ups else None
    mode = given or (best if best and ups[best] > 1 else "off" if best else "reduce-overhead")
    return mode, 1.0 if mode == "off" else ups.get(mode)


def run_estimate(measured: dict, row: str, precision: str, steps: int, speedup: float | None) -> tuple:
    """(seconds of training of one run or None, how it was priced): steps x the measured eager step time of the row
    (or of the row timed for it) / the compiled speed-up measured on the baseline (eager where none was)."""
    timed = TIMED_AS.get(row, row)
    step_s = measured.get((timed, precision, "step_s"))
    if step_s is None:
        return None, f"no step time of {timed} at {precision} in results/gpu_check.csv"
    how = f"{step_s * 1e3:.1f} ms a step measured for {timed} on {measured.get('device', 'a GPU')}, " + (
        "eager: the compiled speed-up is not measured" if speedup is None else
        f"/ {speedup:.2f} compiled (measured on the baseline)" if speedup != 1.0 else "eager")
    return steps * step_s / (speedup or 1.0), how


def plan(rows: list[str], jobs: int, trainer: dict, measured: dict, dry: bool, budget_s: float,
         compile_mode: str | None = None, force: bool = False) -> dict:
    """What `run` trains and what it should cost: the rows in order, the compile mode, each run's estimate against
    the budget; `trainer` holds the paper recipe's trainer settings (precision, max_steps). PlanError for an unknown
    row, rows that would run one after another at the paper's scale, or (without `force`) a run that the measured
    speed of its precision and compile mode says cannot end within the budget; an unmeasured speed leaves it to
    the guard."""
    unknown = [r for r in rows if r not in ROWS]
    if unknown or not rows:
        raise PlanError(f"--rows {','.join(unknown) or '(none)'}: not a row of this table (valid: {', '.join(ROWS)})")
    if jobs < 1:
        raise PlanError(f"--jobs {jobs}: runs at once (valid: an integer >= 1)")
    if not dry and len(rows) > jobs:
        raise PlanError(f"--rows {','.join(rows)} with --jobs {jobs}: {len(rows)} runs one after another do not fit "
                        f"one command (each needs about the whole {budget_s / 60:.0f} min; valid: one row, or "
                        f"--jobs {len(rows)} to run them side by side)")
    key = "bf16" if trainer.get("precision") == "bf16" else "fp32"  # the gpu check's fp32 rows ran TF32 matmuls
    mode, speedup = choose_compile(measured, key, compile_mode)
    runs = []
    for row in rows:
        secs, how = run_estimate(measured, row, key, int(trainer["max_steps"]), speedup)
        fits = None if secs is None else secs + FINAL_EVAL_S <= budget_s
        if fits is False and speedup is not None and not (dry or force):
            raise PlanError(f"--rows {row}: {secs / 60:.1f} min of training ({how}, trainer.compile={mode}) is more "
                            f"than the budget of {budget_s / 60:.0f} min (valid: a faster mode or precision measured "
                            "by make gpu-check-compiled, or --force to let the guard measure it)")
        runs.append({"row": row, "train_s": secs, "how": how, "fits": fits})
    return {"rows": list(rows), "jobs": jobs, "compile": mode, "precision": precision_of(trainer),
            "steps": int(trainer["max_steps"]), "runs": runs, "budget_s": budget_s,
            "note": "" if len(rows) == 1 else "runs side by side share the GPU: each is slower than alone"}


def plan_lines(p: dict) -> list[str]:
    out = [f"recipe precision: {p['precision']} (configs/experiment_scale/ht_char_ptb/paper.yaml); "
           f"trainer.compile={p['compile']}; {p['steps']:,} steps a run; budget {p['budget_s']:.0f} s"]
    for r in p["runs"]:
        t = "not priced" if r["train_s"] is None else f"{r['train_s'] / 60:.1f} min of training"
        verdict = {None: "the guard decides", True: "fits", False: "does NOT fit: the guard stops it once measured"}
        out.append(f"  {r['row']}: {t} ({r['how']}) + evaluations (not priced; in the guard's projection): "
                   f"{verdict[r['fits']]}")
    return out + ([f"  {p['note']}"] if p["note"] else [])


# ----------------------------------------------------------------------------- the guard

def logged_step(metrics: Path) -> int | None:
    """The last training step a run's metrics.jsonl logged (None before its first training line)."""
    step = None
    try:
        for line in metrics.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line being written
            if "train/loss" in rec:
                step = int(rec["step"])
    except OSError:
        return None
    return step


def projected_end(first: tuple[float, int], last: tuple[float, int], max_steps: int) -> float | None:
    """When a run ends (seconds on the command's clock), from two (time, step) sightings of its log, plus its final
    evaluation; None while it has not moved."""
    (t0, s0), (t1, s1) = first, last
    if s1 <= s0 or t1 <= t0:
        return None
    return t1 + (max_steps - s1) * (t1 - t0) / (s1 - s0) + FINAL_EVAL_S


def guard(proc: subprocess.Popen, sweep: Path, names: list[str], max_steps: int, budget_s: float, probe_s: float,
          t0: float, poll_s: float = 2.0) -> list[dict]:
    """Watch the runner until it exits: stop it when a run, once it has logged for probe_s seconds, is projected to
    end after the budget, or at the budget. A projection uses the speed of the last probe_s / 2 seconds, so that
    one-time costs (compiling the training and the evaluation graphs) are behind it. Returns each run's last
    projection and the stop, if any."""
    seen: dict[str, list] = {}
    last: dict[str, dict] = {}
    while proc.poll() is None:
        time.sleep(poll_s)
        now = time.monotonic() - t0
        for name in names:
            step = logged_step(sweep / name / "metrics.jsonl")
            if step is None:
                continue
            seen.setdefault(name, []).append((now, step))
            if now - seen[name][0][0] < probe_s:
                continue
            recent = [x for x in seen[name] if x[0] >= now - probe_s / 2]
            end = projected_end(recent[0], recent[-1], max_steps)
            if end is None:
                continue
            if name not in last:
                say(f"{name}: step {step:,} at {now:.0f} s, projected end {end:.0f} s (budget {budget_s:.0f} s)")
            last[name] = {"what": "projected", "run": name, "at_s": round(now), "step": step, "end_s": round(end),
                          "step_s": round((recent[-1][0] - recent[0][0]) / (recent[-1][1] - recent[0][1]), 5)}
            if end > budget_s:
                return [*last.values(), stop(proc, f"{name} projected to end at {end:.0f} s > {budget_s:.0f} s", now)]
        if now > budget_s:
            return [*last.values(), stop(proc, f"the budget of {budget_s:.0f} s is spent", now)]
    return list(last.values())


def stop(proc: subprocess.Popen, why: str, now: float, grace_s: float = 30.0) -> dict:
    """SIGTERM to the runner (it stops its runs and keeps the finished ones), SIGKILL to its group after grace_s."""
    say(f"stopping: {why}")
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return {"what": "stopped", "why": why, "at_s": round(now)}


# ----------------------------------------------------------------------------- packing

def snapshot(root: Path) -> dict[str, str]:
    """{path under root: sha256} of every file under root/results (what a command changes is packed)."""
    base = root / "results"
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(base.rglob("*")) if p.is_file()} if base.is_dir() else {}


def pack(root: Path, paths: list[str], out: Path, max_bytes: int = MAX_BYTES) -> list[Path]:
    """The files (paths under root; never a checkpoint) as one tar.gz in `out`, split into parts of max_bytes when
    larger; ValueError when that would take more than MAX_FILES files."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel in sorted(paths):
            if not rel.endswith((".pt", ".ckpt")) and "/ckpt/" not in rel:
                tar.add(root / rel, arcname=rel, recursive=False)
    data = buf.getvalue()
    chunks = [data[i:i + max_bytes] for i in range(0, len(data), max_bytes)] or [data]
    if len(chunks) > MAX_FILES:
        raise ValueError(f"the pack is {len(data) / 2 ** 20:.1f} MiB: more than {MAX_FILES} files of "
                         f"{max_bytes / 2 ** 20:.0f} MiB")
    out.mkdir(parents=True, exist_ok=True)
    for old in [out / PACK, *out.glob(f"{PACK}.[0-9][0-9][0-9]")]:  # an earlier pack in the same folder
        old.unlink(missing_ok=True)
    names = [out / PACK] if len(chunks) == 1 else [out / f"{PACK}.{i:03d}" for i in range(len(chunks))]
    for name, chunk in zip(names, chunks):
        name.write_bytes(chunk)
    return names


def unpack(src: Path, root: Path) -> list[str]:
    """Put a pack (a folder holding paper_recipe.tar.gz or its parts, or the file) under root; every member must be a
    plain file under results/ (PlanError otherwise, nothing written). Returns the paths written."""
    parts = [src] if src.is_file() else ([src / PACK] if (src / PACK).exists()
                                         else sorted(src.glob(f"{PACK}.[0-9][0-9][0-9]")))
    if not parts:
        raise PlanError(f"{src}: no {PACK} nor its parts ({PACK}.000, ...) (valid: the folder `run` packed into)")
    with tarfile.open(fileobj=io.BytesIO(b"".join(p.read_bytes() for p in parts)), mode="r:gz") as tar:
        members = tar.getmembers()
        for m in members:
            if not m.isfile() or not m.name.startswith("results/") or ".." in Path(m.name).parts:
                raise PlanError(f"{src}: member {m.name!r} is not a plain file under results/ (nothing written)")
        for m in members:
            dst = root / m.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(tar.extractfile(m).read())
    return [m.name for m in members]


# ----------------------------------------------------------------------------- the commands

def setup_env() -> dict:
    """This checkout and the carried packages on the path (here and for the runner), the carried data mirror."""
    sys.path.insert(0, str(REPO))
    extra = [str(REPO)] + ([str(DEPS)] if DEPS.is_dir() else [])
    if DEPS.is_dir():
        sys.path.append(str(DEPS))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(extra + [p for p in os.environ.get("PYTHONPATH", "").split(
        os.pathsep) if p]))
    if "HIGHWAY_DATA_MIRROR" not in env and GPU_MIRROR.is_dir():
        env.update(HIGHWAY_DATA_MIRROR=str(GPU_MIRROR), HIGHWAY_DATA_OFFLINE="1")
    return env


def trainer_settings(scale: str = "paper") -> dict:
    """The table's composed trainer settings at `scale` (the paper's: its recipe's precision, steps, evaluation;
    a dry run states the paper's precision and trains the smoke scale's few steps)."""
    from omegaconf import OmegaConf

    from highway_repro.runner.plan import compose_table
    from highway_repro.targets import TARGETS

    return OmegaConf.to_container(compose_table(TARGETS[TABLE], scale, []).trainer, resolve=True)


def runner(args, rows: list[str], results: Path, runs: Path, extra: list[str], env: dict,
           jobs: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "highway_repro.runner", TABLE, "--scale", args.scale, "--jobs", str(jobs),
           "--results", str(results), "--runs", str(runs), f"variant={','.join(rows)}",
           f"trainer.device={'cpu' if args.dry_run else 'cuda'}", *extra]
    say("+ " + " ".join(cmd))
    return subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True)


def job_names(scale: str, rows: list[str], extra: list[str]) -> list[str]:
    from highway_repro.runner.plan import plan as plan_table

    return plan_table(TABLE, scale, [f"variant={','.join(rows)}", *extra])[2]


def do_run(args, env: dict, t0: float) -> dict:
    trainer = trainer_settings()
    p = plan(args.rows, args.jobs or len(args.rows), trainer, read_measured(REPO / "results"), args.dry_run,
             args.budget_s, args.compile, args.force)
    for line in plan_lines(p):
        say(line)
    mode = args.compile or ("off" if args.dry_run else p["compile"])  # a dry run does not compile (minutes on a CPU)
    extra = [f"trainer.compile={mode}"] if mode != "off" else []
    names = job_names(args.scale, p["rows"], extra)
    proc = runner(args, p["rows"], args.root / "results", args.root / "runs" / "sweeps", extra, env, p["jobs"])
    steps = trainer_settings(args.scale)["max_steps"] if args.dry_run else p["steps"]  # smoke: a few steps
    events = guard(proc, args.root / "runs" / "sweeps" / f"{TABLE}-{args.scale}", names, steps, args.budget_s,
                   args.probe_s, t0)
    proc.wait()
    ends = {n: _end(args.root / "runs" / "sweeps" / f"{TABLE}-{args.scale}" / n) for n in names}
    return {"plan": p, "events": events, "runs": ends, "runner_exit": proc.returncode}


def do_compare(args, env: dict, t0: float) -> dict:
    trainer = trainer_settings()
    grid = compare_grid(trainer)
    if not grid:
        raise PlanError("the recipe trains in full fp32 (configs/experiment_scale/ht_char_ptb/paper.yaml): there is "
                        "no other precision to compare it with")
    steps = DRY_STEPS if args.dry_run else COMPARE_STEPS
    extra = [*grid, f"trainer.max_steps={steps}", "trainer.eval_every=0"]
    work = args.root / "runs" / "paper_recipe_compare"
    rows = list(COMPARE_ROWS)
    say(f"{', '.join(rows)}: {steps} steps in {precision_of(trainer)} and in full fp32, side by side")
    proc = runner(args, rows, work / "results", work / "sweeps", extra, env, args.jobs or 2 * len(rows))
    events = guard(proc, work / "sweeps" / f"{TABLE}-{args.scale}", job_names(args.scale, rows, extra), steps,
                   args.budget_s, args.probe_s, t0)
    proc.wait()
    dst = args.root / OUT_DIR / f"char_ptb_l3_{args.scale}_precision_runs"
    runs = {}
    for run in sorted(p.parent for p in (work / "results").glob(f"*/runs/{TABLE}-{args.scale}*/*/metrics.json")):
        for f in run.rglob("*"):
            if f.is_file():
                (dst / run.name / f.relative_to(run)).parent.mkdir(parents=True, exist_ok=True)
                (dst / run.name / f.relative_to(run)).write_bytes(f.read_bytes())
        runs[run.name] = _end(run)
    write_comparison(args.root / OUT_DIR / f"char_ptb_l3_{args.scale}_precision", runs, precision_of(trainer), steps)
    return {"precision": precision_of(trainer), "steps": steps, "events": events, "runs": runs,
            "runner_exit": proc.returncode}


def _end(run: Path) -> dict:
    """A run's end as its metrics.json and run_info.json say (status, step, bpc, wall, device)."""
    def read(name):
        try:
            return json.loads((run / name).read_text())
        except (OSError, ValueError):
            return {}
    m, info = read("metrics.json"), read("run_info.json")
    return {"status": m.get("status", "missing"), "step": m.get("step", logged_step(run / "metrics.jsonl")),
            **{k: m[k] for k in ("val/bpc", "test/bpc", "train/loss", "time/wall_s") if k in m},
            "device": info.get("cuda_device") or "cpu"}


def write_comparison(out: Path, runs: dict, precision: str, steps: int) -> None:
    """<out>.md and .csv: per row, the recipe's precision against full fp32 after `steps` steps."""
    def fp32(name: str) -> bool:  # Hydra's sweep writes the booleans True / False
        return "trainer.tf32=false" in name.lower() and "trainer.precision=bf16" not in name.lower()
    rows, lines = [], []
    for row in COMPARE_ROWS:
        pair = {fp32(n): r for n, r in runs.items() if f"variant={row}" in n}
        a, b = pair.get(False, {}), pair.get(True, {})
        diff = a["test/bpc"] - b["test/bpc"] if "test/bpc" in a and "test/bpc" in b else None
        rows.append([row, a.get("test/bpc"), b.get("test/bpc"), diff, a.get("val/bpc"), b.get("val/bpc"),
                     a.get("time/wall_s"), b.get("time/wall_s"), a.get("device") or b.get("device")])
        verdict = "n/a" if diff is None else ("the same" if abs(diff) <= COMPARE_MARGIN_BPC else "DIFFERENT")
        lines.append(f"| {row} | {_f(a.get('test/bpc'))} | {_f(b.get('test/bpc'))} | {_f(diff, '+.4f')} | "
                     f"{verdict} | {_f(a.get('time/wall_s'), '.0f')} | {_f(b.get('time/wall_s'), '.0f')} | "
                     f"{a.get('device') or b.get('device') or 'n/a'} |")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["row", "test_bpc_recipe", "test_bpc_fp32", "diff", "val_bpc_recipe", "val_bpc_fp32",
                    "wall_s_recipe", "wall_s_fp32", "device"])
        w.writerows(rows)
    out.with_suffix(".md").write_text("\n".join([
        "# char-PTB Transformer-L3: the paper-recipe precision against full fp32", "",
        f"`python3 scripts/paper_recipe.py compare`: each row trained {steps} steps from the same seed at the paper's "
        f"recipe, once in its precision ({precision}, stated in `configs/experiment_scale/ht_char_ptb/paper.yaml` "
        "before the runs) and once in full fp32; test bpc of the whole test split. Margin stated before the runs: "
        f"|difference| <= {COMPARE_MARGIN_BPC} bpc is the same (the smallest paper effect the table tests, SDU "
        "tanh vs sigmoid, is 0.007 bpc; gates vs the baseline 0.12-0.13). Runs: "
        f"`{out.name}_runs/`.", "",
        "| row | test bpc, recipe | test bpc, full fp32 | difference | | wall s, recipe | wall s, fp32 | device |",
        "|---|---:|---:|---:|---|---:|---:|---|", *lines, ""]))


def _f(x, spec: str = ".4f") -> str:
    return "n/a" if x is None else format(x, spec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 scripts/paper_recipe.py", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=("plan", "compare", "run", "unpack"))
    ap.add_argument("src", nargs="?", help="unpack: the folder the pack came back in")
    ap.add_argument("--rows", default="baseline", help=f"run: the rows, comma-separated (valid: {', '.join(ROWS)})")
    ap.add_argument("--jobs", type=int, default=None, help="runs at once on the GPU (default: every row at once)")
    ap.add_argument("--compile", choices=COMPILE_MODES, default=None, help="trainer.compile (default: the fastest "
                    "mode measured in results/gpu_check_compiled.csv, else reduce-overhead; a dry run: off)")
    ap.add_argument("--force", action="store_true", help="run: start a run that the measured speed says cannot "
                    "end within the budget (the guard then measures it and stops it)")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S, help="the guard stops every run at this time")
    ap.add_argument("--probe-s", type=float, default=PROBE_S, help="seconds of a run's log before its projection")
    ap.add_argument("--out", type=Path, default=None, help="where the pack goes (default runs/paper_recipe_out)")
    ap.add_argument("--root", type=Path, default=None, help="where results/ and runs/ are (default: this checkout; "
                    "dry run: runs/paper_recipe_dry)")
    ap.add_argument("--dry-run", action="store_true", help=f"CPU, smoke scale, {DRY_STEPS} steps: the same code path")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    args.rows = [r for r in args.rows.split(",") if r]
    args.scale = "smoke" if args.dry_run else "paper"
    args.root = (args.root or (REPO / "runs" / "paper_recipe_dry" if args.dry_run else REPO)).resolve()
    args.out = (args.out or REPO / "runs" / "paper_recipe_out").resolve()
    try:
        if args.part == "unpack":
            if not args.src:
                ap.error("unpack needs the folder the pack came back in")
            written = unpack(Path(args.src), args.root)
            info = [json.loads((args.root / w).read_text()) for w in written if w.endswith("/run_info.json")]
            gpu = sorted({i["cuda_device"] for i in info if i.get("cuda_device")})
            say(f"{len(written)} files under {args.root / 'results'}; runs made on {', '.join(gpu) or 'no GPU'}: "
                f"{sum(bool(i.get('cuda_device')) for i in info)} of {len(info)}; next: make tables")
            return 0
        env = setup_env()
        if args.part == "plan":
            p = plan(args.rows, args.jobs or len(args.rows), trainer_settings(), read_measured(REPO / "results"),
                     args.dry_run, args.budget_s, args.compile, args.force)
            print("\n".join(plan_lines(p)))
            return 0
        before = snapshot(args.root)
        record = (do_run if args.part == "run" else do_compare)(args, env, t0)
    except PlanError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    record = {"part": args.part, "scale": args.scale, "wall_s": round(time.monotonic() - t0), **record}
    log = args.root / LOG
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        f.write(json.dumps(record, default=str) + "\n")
    ours = (f"{OUT_DIR}/runs/{TABLE}-{args.scale}", f"{OUT_DIR}/char_ptb_l3_")  # the kept runs, this script's files
    changed = [p for p, h in snapshot(args.root).items() if before.get(p) != h and p.startswith(ours)]
    names = pack(args.root, changed, args.out)
    say(f"{len(changed)} files packed into {', '.join(str(n) for n in names)}; runner exit {record['runner_exit']}")
    return 0 if record["runner_exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
