"""README.md's "Results at a glance" from results/summary.csv (`make readme`; standard library only).

First the findings: for each table with a paper trend claim, in plain words, what held and what did not, with the
difference and its interval, and how many stay unresolved (`findings`). Then the claims picture results/claims.png,
the counts of verdicts (each claim type apart), then one line per table (a study's parts counted in the study's
line): its headline number against the paper's and how many of its distinct
comparisons each verdict got (a level claim of the paper at another scale than the paper's gets none: its scale
cell counts it). The headline is the table's reference row (the row of its first floor, else its first row with a paper
number, else its first row) on the metric that row reports. The full list of comparisons and floors is in
results/README.md (`highway_repro/report/claims_list.py`, loaded here by path). results/summary.csv,
results/claims.png and results/README.md are written by `make tables`.

It also writes the costs the runner's estimate gives, so that no cost is typed by hand: every paper table from scratch
on 2 jobs (the estimate's `[all]` line) between the cost markers of docs/guide.md (`whole_set_cost`), and each paper
table's runs on 1 to 32 GPUs between the cost markers of docs/cluster.md (`cluster_costs`).
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- glance:begin -->", "<!-- glance:end -->"
COST_MARKERS = ("<!-- cost:begin -->", "<!-- cost:end -->")
COST = re.compile(r"(<!-- cost:begin -->).*?(<!-- cost:end -->)")
CLUSTER_MARKERS, GPUS = ("<!-- costs:begin -->", "<!-- costs:end -->"), (1, 8, 32)
ESTIMATE = ["-m", "highway_repro.runner", "--all", "--fresh", "--estimate", "--jobs", "2", "--scale", "cpu"]
_spec = importlib.util.spec_from_file_location("claims_list", ROOT / "highway_repro" / "report" / "claims_list.py")
claims_list = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(claims_list)
num, counts, scale, VERDICTS = claims_list.num, claims_list.counts, claims_list.scale, claims_list.VERDICTS
counted, apart = claims_list.counted, claims_list.apart
SHORT = {"HELD": "held", "DID NOT HOLD": "did not hold", "NO DIFFERENCE": "no difference",
         "NOT RESOLVED": "not resolved"}


def _title(results: Path, file: str, table: str) -> str:
    """The table's title from its claims file (`<file stem>.claims.json`), else its name."""
    path = results / Path(file).with_suffix(".claims.json")
    try:
        return json.loads(path.read_text())["title"]
    except (OSError, ValueError, KeyError):
        return table


def headline(mine: list[dict]) -> str:
    """'<ours> <metric> <split> (paper <theirs>)' of the table's reference row; a dash where there is none."""
    table_rows = [r for r in mine if r["kind"] == "row"]
    floors = [r["row"] for r in mine if r["kind"] == "floor"]
    ref = next((r for r in table_rows if floors and r["row"] == floors[0]), None)
    ref = ref or next((r for r in table_rows if r["paper"]), None) or (table_rows[0] if table_rows else None)
    if ref is None:
        return "—"
    paper = f" (paper {num(ref['paper'])})" if ref["paper"] else ""
    return f"{ref['row'].split(' (')[0]}: {num(ref['mean'])} {ref['metric']} {ref['split']}{paper}"


def compact(rows: list[dict], results: Path) -> str:
    """One line per table: link, headline against the paper, the verdicts of its distinct comparisons, scale."""
    home = {r["table"]: r["file"] for r in rows if not r.get("part_of")}
    groups: dict[str, list[dict]] = {}  # file -> its rows
    for r in rows:  # a study's parts: in the study's line (on their own where the study's table is not made)
        groups.setdefault(home.get(r.get("part_of"), r["file"]), []).append(r)
    lines = ["| table | headline: ours (paper) | " + " | ".join(SHORT[v] for v in VERDICTS) + " | scale |",
             "|---|---|" + "---|" * len(VERDICTS) + "---|"]
    for file, mine in groups.items():
        main = [r for r in mine if r["file"] == file]
        claims = [r for r in mine if r["kind"] == "claim" and counted(r)]
        aside = apart([r for r in mine if r["kind"] == "claim"])
        lines.append(f"| [{_title(results, file, main[0]['table'])}](results/{file}) | {headline(main)} | "
                     + " | ".join(str(sum(r["verdict"] == v for r in claims)) for v in VERDICTS)
                     + f" | {scale(main[0])}{f'; {aside}' if aside else ''} |")
    return "\n".join(lines)


def _said(r: dict) -> str:
    """A claim line in plain words: '<row> <claim>' without the paper's numbers after ';' or ':'."""
    claim = r["claim"].split(";")[0].split(": ")[0]
    return f"{r['row'].split(' (')[0]} {claim} ({r['metric']} {r['split']}: {num(r['diff'])} [{num(r['ci_low'])}, " \
           f"{num(r['ci_high'])}])"


def findings(rows: list[dict], results: Path) -> str:
    """One line per table with a paper trend claim, read with Holm over all the papers' trend claims as one family
    (`papers_family_verdict`): what held, what did not (each with its difference and interval), how many are not
    resolved and how many of those a raw interval decides; the tables' own readings are in results/README.md."""
    lines = []
    tables: dict[str, list[dict]] = {}
    for r in rows:
        if r["kind"] == "claim" and r.get("claim_type") == "trend" and counted(r):
            tables.setdefault(r["file"], []).append(r)
    size = next((r["papers_family_size"] for t in tables.values() for r in t if r.get("papers_family_size")), "")
    for file, mine in tables.items():
        family = [r.get("papers_family_verdict") or r["verdict"] for r in mine]
        said = [f"{SHORT[v]}: " + "; ".join(_said(r) for r, f in zip(mine, family) if f == v)
                for v in ("HELD", "DID NOT HOLD", "NO DIFFERENCE") if v in family]
        open_ = [r for r, f in zip(mine, family) if f == "NOT RESOLVED"]
        raw = sum(r["verdict"] != "NOT RESOLVED" for r in open_)
        said += [f"{len(open_)} not resolved" + (f" ({raw} of them decided by "
                                                  "their own interval alone)" if raw else "")] if open_ else []
        lines.append(f"- **{_title(results, file, mine[0]['table'])}** ({scale(mine[0])}): " + ". ".join(said) + ".")
    return "\n".join([f"What the papers' trend claims came to, read as one family (Holm over the {size} of them with a "
                      "test; a difference of ours and its 95 % interval; the level claims, the project's own and the "
                      "rest below):", "", *lines])


def glance(rows: list[dict], results: Path) -> str:
    claims = [r for r in rows if r["kind"] == "claim"]
    return "\n".join([findings(rows, results), "",
                      "![every distinct comparison: difference, 95 % interval (99 % at a second look), +-delta, the "
                      "paper's effect](results/claims.png)", "", counts(claims), "", compact(rows, results)])


def whole_set_cost(root: Path) -> str | None:
    """What the runner's estimate of every paper table from scratch on 2 jobs says, e.g. '78.6 CPU-hours, 39.42 h
    wall with 2 job(s) ± 25 % across machines'; None where it says nothing."""
    p = subprocess.run([sys.executable, *ESTIMATE], cwd=root, capture_output=True, text=True, timeout=600)
    line = next((x for x in p.stdout.splitlines() if x.startswith("[all]")), "")
    m = re.search(r"estimated (.+?), the runs of every table", line)
    return m[1] if m else None


def write_between(path: Path, begin: str, end: str, inner: str) -> bool:
    """`inner` between the first `begin` and the `end` after it in `path`, written whole or not at all (a temporary
    file, then a rename); False where the file has no such markers."""
    head, found, rest = path.read_text().partition(begin)
    body, closed, tail = rest.partition(end)
    if not (found and closed):
        return False
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(head + begin + inner + end + tail)
    os.replace(tmp, path)
    return True


def write_cost(path: Path, cost: str) -> bool:
    """`cost` between the cost markers of `path`; False where the file has no markers."""
    return write_between(path, *COST_MARKERS, cost)


def cluster_costs(root: Path = ROOT) -> str:
    """docs/cluster.md's cost table: each paper table's runs at the paper scale on GPUs, priced by the runner's one
    cost rule (`runner.estimate.per_run_s`: a cell's kept GPU runs, else the scale file's `est_step_s` x steps) and
    laid out on N GPUs as the queue lays them (`runner.estimate.wall_s`: each run on the first GPU free)."""
    from highway_repro.report.header import duration
    from highway_repro.runner.estimate import MARGIN, per_run_s, wall_s
    from highway_repro.runner.plan import job_names, plan_grids
    from highway_repro.targets import PAPER_TABLES, TARGETS, make_target, runs_folder

    lines = [f"| table | runs | a run | GPU-hours | {' | '.join(f'{n} GPU' + 's' * (n > 1) for n in GPUS)} |",
             "|---|---:|---:|---:|" + "---:|" * len(GPUS)]
    for name in PAPER_TABLES:
        cfg, fgs = plan_grids(name, "paper", ["trainer.device=cuda"])
        names = job_names(cfg, [g for _, g in fgs], TARGETS[name].sweep)
        kept = [p.parent for p in (root / "results" / runs_folder(name, "paper")).glob("*/metrics.json")]
        secs, _ = per_run_s(names, kept, cfg)
        if None in secs:
            lines.append(f"| `make {make_target(name)}` | {len(names)} | no estimate | | " + "| " * len(GPUS))
            continue
        walls = " | ".join(duration(wall_s(secs, n)) for n in GPUS)
        lines.append(f"| `make {make_target(name)}` | {len(names):,} | {duration(sum(secs) / len(secs))} | "
                     f"{sum(secs) / 3600:,.1f} | {walls} |")
    return "\n".join(lines) + f"\n\n± {MARGIN * 100:.0f} % across machines (`runner/estimate.py`)."


def main(root: Path = ROOT) -> int:
    readme, summary = root / "README.md", root / "results" / "summary.csv"
    for path in (readme, summary):
        if path.is_symlink():  # never read or written through a link: a committed file is a plain file
            print(f"error: {path} is a symbolic link (valid: a plain file; remove the link)", file=sys.stderr)
            return 2
    rows = []
    if summary.exists():
        with open(summary, newline="") as fh:
            rows = list(csv.DictReader(fh))
    body = glance(rows, root / "results") if rows else (
        "_results/summary.csv has no claims yet: `make tables` builds it from the run folders of the tables._")
    if not write_between(readme, BEGIN, END, "\n" + body + "\n"):
        print(f"README.md has no {BEGIN} ... {END} markers", file=sys.stderr)
        return 1
    print(f"README.md: {counts([r for r in rows if r['kind'] == 'claim'])}")
    guide = root / "docs" / "guide.md"
    if guide.is_file() and not guide.is_symlink() and COST.search(guide.read_text()):
        cost = whole_set_cost(root)
        if cost is None:
            print("error: the runner's estimate printed no [all] line (see make estimate-all)", file=sys.stderr)
            return 1
        write_cost(guide, cost)
        print(f"docs/guide.md: the whole set costs {cost}")
    cluster = root / "docs" / "cluster.md"
    if cluster.is_file() and not cluster.is_symlink() and CLUSTER_MARKERS[0] in cluster.read_text():
        write_between(cluster, *CLUSTER_MARKERS, "\n" + cluster_costs(root) + "\n")
        print("docs/cluster.md: each paper table's cost on 1 to 32 GPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
