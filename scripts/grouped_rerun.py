"""Fig. 1's runs re-trained in groups against the kept lone runs: per-run differences and the table's verdicts.

    python -m highway_repro.train -m sweep=hn_fig1/cpu scale=cpu model.depth=10,20 model.kind=highway \
        hydra/launcher=grouped hydra.sweep.dir=runs/grouped/hn_fig1-cpu resume=auto      # (and plain,residual)
    python -m highway_repro.train -m sweep=hn_fig1/cpu scale=cpu model.depth=10 model.kind=plain,highway \
        'trial=range(0,6)' hydra.sweep.dir=runs/grouped/hn_fig1-cpu-lone resume=auto    # some alone, for scale
    python scripts/grouped_rerun.py --runs runs/grouped/hn_fig1-cpu --lone runs/grouped/hn_fig1-cpu-lone \
        --commit 8efce1a70910e888da3535e1e6543ab086945119

For every grouped run with a kept lone twin (same folder name in results/highway_networks/runs/hn_fig1-cpu): both
statuses, the step a diverged one stopped at, the final training loss (a full pass over the 60,000 images) and its
relative difference, the CPU time. Then Fig. 1's report twice from the kept runs, once as kept and once with the
grouped runs in their twins' places (`--report-only` into a temporary results folder), and every row's numbers and
verdicts side by side. Writes results/highway_networks/fig1_grouped.md and .csv, and keeps each grouped run's
metrics.json and run_info.json in results/highway_networks/fig1_grouped_runs/ (the table's runs stay the lone ones).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEPT = ROOT / "results/highway_networks/runs/hn_fig1-cpu"
OUT = ROOT / "results/highway_networks/fig1_grouped"
KEEP = ROOT / "results/highway_networks/fig1_grouped_runs"
LOSS = "train/loss"


def _read(run: Path, name: str) -> dict:
    try:
        return json.loads((run / name).read_text())
    except (OSError, ValueError):
        return {}


def pairs(runs: Path) -> list[dict]:
    out = []
    for run in sorted(p for p in runs.iterdir() if (p / "metrics.json").exists()):
        lone, grouped = _read(KEPT / run.name, "metrics.json"), _read(run, "metrics.json")
        if not lone:
            continue
        a, b = lone.get(LOSS) if lone.get("status") == "done" else None, grouped.get(LOSS) if grouped.get(
            "status") == "done" else None
        group = _read(run, "run_info.json").get("group", {})
        out.append({"run": run.name, "lone_status": lone.get("status"), "grouped_status": grouped.get("status"),
                    "lone_step": lone.get("step"), "grouped_step": grouped.get("step"), "lone_loss": a,
                    "grouped_loss": b, "rel_diff": abs(a - b) / abs(a) if a and b is not None else None,
                    "lone_cpu_s": lone.get("time/cpu_s"), "grouped_cpu_s": grouped.get("time/cpu_s"),
                    "group": group.get("id"), "group_size": group.get("size")})
    return out


def verdicts(runs: Path, names: list[str]) -> dict:
    """Fig. 1's claim rows from the kept runs with `names` taken from `runs` (none: as kept), by (row, metric)."""
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results"
        shutil.copytree(KEPT, results / KEPT.relative_to(ROOT / "results"))
        for name in names:
            dest = results / KEPT.relative_to(ROOT / "results") / name
            shutil.rmtree(dest)
            shutil.copytree(runs / name, dest, ignore=shutil.ignore_patterns("ckpt", ".writer.lock", "*.log"))
        subprocess.run([sys.executable, "-m", "highway_repro.runner", "hn_fig1", "--scale", "cpu", "--report-only",
                        "--results", str(results), "--runs", str(Path(tmp) / "none")], cwd=ROOT, check=True,
                       capture_output=True)
        rows = json.loads((results / "highway_networks/fig1.claims.json").read_text())["rows"]
    return {(r["row"], r["metric"], r.get("claim", "")): r for r in rows}


def fmt(x, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}g}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=Path, default=ROOT / "runs/grouped/hn_fig1-cpu")
    ap.add_argument("--lone", type=Path, default=None, help="runs of the same grid re-made alone on this machine: "
                    "how far a lone run lands from its kept twin, for scale")
    ap.add_argument("--commit", default=None, help="the commit the grouped runs' process started from, where their "
                    "run_info.json recorded a later HEAD (written into the kept copies, and said in the report)")
    args = ap.parse_args(argv)
    rows = pairs(args.runs)
    if not rows:
        print(f"error: --runs={args.runs}: no finished run with a kept twin in {KEPT}", file=sys.stderr)
        return 2
    with OUT.with_suffix(".csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    KEEP.mkdir(parents=True, exist_ok=True)
    for r in rows:
        (KEEP / r["run"]).mkdir(exist_ok=True)
        shutil.copy2(args.runs / r["run"] / "metrics.json", KEEP / r["run"] / "metrics.json")
        info = _read(args.runs / r["run"], "run_info.json")
        if args.commit:
            info["git_commit"] = args.commit
        (KEEP / r["run"] / "run_info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    kept, mixed = verdicts(args.runs, []), verdicts(args.runs, [r["run"] for r in rows])
    same_status = sum(r["lone_status"] == r["grouped_status"] for r in rows)
    both = [r for r in rows if r["rel_diff"] is not None]
    diffs = sorted(r["rel_diff"] for r in both)
    cpu = [(r["lone_cpu_s"], r["grouped_cpu_s"]) for r in rows if r["lone_cpu_s"] and r["grouped_cpu_s"]]
    info = _read(KEEP / rows[0]["run"], "run_info.json")
    kept_info = _read(KEPT / rows[0]["run"], "run_info.json")
    lower = sum(r["grouped_loss"] < r["lone_loss"] for r in both)
    higher = sum(r["grouped_loss"] > r["lone_loss"] for r in both)
    n = lower + higher  # the sign test: is a grouped run as likely above its twin as below it?
    sign_p = min(1.0, 2 * sum(math.comb(n, k) for k in range(min(lower, higher) + 1)) / 2 ** n) if n else None
    lone = pairs(args.lone) if args.lone else []
    lone_diffs = sorted(r["rel_diff"] for r in lone if r["rel_diff"] is not None)
    same = sum(r["lone_status"] == r["grouped_status"] for r in lone)
    baseline = (f" For scale, {len(lone)} of these runs re-made alone on the grouped runs' machine "
                f"({args.lone.name}): the same status in {same}, "
                f"relative difference of the final training loss to the kept twin median "
                f"{fmt(lone_diffs[len(lone_diffs) // 2] if lone_diffs else None, 2)}, largest "
                f"{fmt(lone_diffs[-1] if lone_diffs else None, 2)}"
                + (": a lone run made again lands exactly on its twin, so the differences above are the group's "
                   "rounding, grown over the run." if lone_diffs and lone_diffs[-1] == 0 else ".") if lone else "")
    def shown_path(v):
        return v.resolve().relative_to(ROOT) if isinstance(v, Path) and v.resolve().is_relative_to(ROOT) else v

    shown = " ".join(f"--{k} {shown_path(v)}" for k, v in vars(args).items() if v is not None)
    sizes = [r["group_size"] or 0 for r in rows]
    both_diverged = [r for r in rows if r["lone_status"] == r["grouped_status"] == "diverged"]
    lone_h, grouped_h = sum(a for a, _ in cpu) / 3600, sum(b for _, b in cpu) / 3600
    lines = ["# Fig. 1, depths 10 and 20, re-run in groups", "",
             f"Written by `python scripts/grouped_rerun.py {shown}`. "
             f"The grouped runs: `sweep=hn_fig1/cpu scale=cpu model.depth=10,20 hydra/launcher=grouped` (groups of "
             f"one (depth, kind, activation): {len({r['group'] for r in rows})} groups of "
             f"{min(sizes)}-{max(sizes)} runs), "
             f"machine {info.get('cpu_model')}, {info.get('cpu_count')} cores, torch {info.get('torch')}, commit "
             f"{str(info.get('git_commit'))[:12]}"
             + (" (the process's own: its run_info.json recorded the checkout's later HEAD, corrected in the kept "
                "copies)" if args.commit else "") + "; the lone runs: the kept runs of the table "
             "(results/highway_networks/runs/hn_fig1-cpu, made one after another, 1 thread each). The table's runs "
             "stay the lone ones; the grouped runs' metrics.json and run_info.json are kept in "
             "results/highway_networks/fig1_grouped_runs/, the per-run comparison in fig1_grouped.csv.", "",
             "## Per run", "",
             f"- {len(rows)} runs; the same status (done / diverged) in {same_status}; "
             f"diverged at the same step in {sum(r['lone_step'] == r['grouped_step'] for r in both_diverged)} of "
             f"{len(both_diverged)} diverged in both.",
             f"- Final training loss, {len(both)} runs done in both: relative difference median "
             f"{fmt(diffs[len(diffs) // 2] if diffs else None, 2)}, 90th percentile "
             f"{fmt(diffs[int(0.9 * (len(diffs) - 1))] if diffs else None, 2)}, largest "
             f"{fmt(diffs[-1] if diffs else None, 2)}. "
             "A grouped run is not bit-identical to its lone twin (other kernels: batched matmuls, which round "
             "differently); over 16,000 steps of SGD with momentum such differences grow, most where a run is "
             f"near the edge of divergence. No direction: the grouped run ends lower in {lower} and higher in "
             f"{higher} (two-sided sign test p = {fmt(sign_p, 2)}). The kept runs were made on "
             f"{kept_info.get('cpu_model')} "
             f"({kept_info.get('torch')}, commit {str(kept_info.get('git_commit'))[:12]}).{baseline}",
             f"- CPU time: lone {lone_h:.2f} CPU-hours, grouped {grouped_h:.2f} (each member's share of its group's), "
             f"{lone_h / max(grouped_h, 1e-9):.2f}x, not a measure of speed: the kept runs ran in another session "
             "(two runs side by side), the grouped ones two groups side by side, all under the code that stepped "
             "each member's optimizer alone (the stacked SGD update came after: it changes the rounding again, not the "
             "method). The benchmark "
             "(results/bench_grouped.md) compares both on one machine in one process.", "",
             "## Fig. 1's rows and verdicts, kept runs vs the grouped runs in their places", "",
             "| row | metric | claim | kept | grouped in | kept verdict | grouped verdict |",
             "|---|---|---|---:|---:|---|---|"]
    changed = 0
    for key, a in kept.items():
        b = mixed.get(key, {})
        if a.get("verdict") != b.get("verdict"):
            changed += 1
        lines.append(f"| {key[0]} | {key[1]} | {key[2] or ''} | {fmt(a.get('mean'))} | {fmt(b.get('mean'))} | "
                     f"{a.get('verdict') or ''} | {b.get('verdict') or ''} |")
    lines += ["", f"Verdicts changed: {changed} of {sum(1 for a in kept.values() if a.get('verdict'))}."]
    OUT.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
