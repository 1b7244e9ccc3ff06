"""The one header of every report: command(s), scale, seeds, runs, wall time, CPU-hours, machine(s), code; all but
the runner's `meta` (commands, their wall time, the budget) read from the run folders, never from this machine."""

from __future__ import annotations

import math
from collections import Counter

from highway_repro.report.prose import prose
from highway_repro.report.runs import Run, device


def duration(seconds: float) -> str:
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def seeds(runs: list[Run]) -> list[str]:
    vals = {str(r.get("seed")) for r in runs if r.get("seed") is not None}
    return sorted(vals, key=lambda s: (not s.lstrip("-").isdigit(), int(s) if s.lstrip("-").isdigit() else 0, s))


def compute_time(runs: list[Run]) -> dict:
    """Training wall time and CPU time summed over the runs that recorded a wall time (CPU time: wall time x threads
    where it is missing)."""
    timed = [r for r in runs if math.isfinite(r.metric("time/wall_s"))]
    guessed = [r for r in timed if not math.isfinite(r.metric("time/cpu_s"))]

    def cpu_s(r: Run) -> float:
        c = r.metric("time/cpu_s")
        return c if math.isfinite(c) else r.metric("time/wall_s") * r.threads[0]

    return {"wall_s": sum(r.metric("time/wall_s") for r in timed), "cpu_s": sum(cpu_s(r) for r in timed),
            "estimated": len(guessed), "unknown_threads": sum(not r.threads[1] for r in guessed),
            "without_final": sum(r.done and not math.isfinite(r.metric("time/final_eval_s")) for r in timed)}


def machine(info: dict) -> str:
    parts = [info.get("machine") or "?", info.get("cpu_model"), info.get("cpu_count") and f"{info['cpu_count']} CPUs",
             f"torch {info.get('torch', '?')}, Python {info.get('python', '?')}",
             f"GPU {info['cuda_device']}" if info.get("cuda_device") else "no GPU"]
    return ", ".join(p for p in parts if p)


def _s(n: int) -> str:
    return "s" if n > 1 else ""


def _runs_each(counts: Counter) -> str:
    """`4 (10 runs), 2 (1 run)`: each value and its runs, the most common first."""
    return ", ".join(f"{k} ({n} run{_s(n)})" for k, n in counts.most_common())


def header(title: str, runs: list[Run], meta: dict | None = None) -> str:
    """Markdown: the title and one bullet per fact (ends with a blank line)."""
    meta = meta or {}
    lines = [f"# {title}", ""]
    commands = list(dict.fromkeys(meta.get("commands") or []))
    if commands:
        lines.append(f"- command{_s(len(commands))}: " + "; ".join(f"`{c}`" for c in commands))
    status = Counter(r.status for r in runs)
    n_done, n_missing, n_damaged = status["done"], status["missing"], status["damaged"]
    s = seeds(runs)
    planned = meta.get("planned")  # the runs of the table's grid (the runner's plan)
    todo = planned - len(runs) if planned and planned > len(runs) else 0
    lines.append(f"- scale: {meta.get('scale') or 'unknown'}; seeds: {', '.join(s) or 'unknown'}; runs: {n_done} done, "
                 f"{len(runs) - n_done - n_missing - n_damaged} failed, {n_missing} missing"
                 + (f", **{n_damaged} damaged (a kept file cannot be read as plain data)**" if n_damaged else "")
                 + (f"; **{todo} of the grid's {planned} runs not trained yet: a partial table**" if todo else ""))
    other = meta.get("other_recipe") or {}  # kept runs of an older recipe, left out of the table (the runner)
    if other:
        shown = "; ".join(f"`{k}` ({v})" for k, v in list(other.items())[:3]) + ("; ..." if len(other) > 3 else "")
        lines.append(prose("header other recipe", n=len(other), s=_s(len(other)), shown=shown))
    apart = meta.get("other_device") or []  # made on the other device: not compared (report.runs.one_device)
    if apart:
        names = ", ".join(f"`{r.path.name}`" for r in apart[:3]) + (", ..." if len(apart) > 3 else "")
        lines.append(prose("header other device", n=len(apart), s=_s(len(apart)), names=names,
                           device="a GPU" if device(apart[0]) == "gpu" else "a CPU"))
    t = compute_time(runs)
    cpu_h = f"{t['cpu_s'] / 3600:.2f} CPU-hours"
    gpu = [r.metric("time/wall_s") for r in runs if r.run_info.get("cuda_device")]
    if gpu:
        cpu_h = (prose("header gpu hours", hours=f"{sum(x for x in gpu if math.isfinite(x)) / 3600:.2f}",
                       n=len(gpu), s=_s(len(gpu))) + " " + cpu_h + (" of the host" if len(gpu) == len(runs) else ""))
    if t["estimated"]:
        cpu_h += " " + prose("header estimated", n=t["estimated"], threads=f"; {t['unknown_threads']} of them with "
                             "no thread count: 1 assumed" if t["unknown_threads"] else "")
    wall = "" if meta.get("wall_s") is None else f"{duration(meta['wall_s'])} for the command{_s(len(commands))}; "
    lines.append(f"- wall time: {wall}training {duration(t['wall_s'])} summed over runs, {cpu_h}"
                 + (" " + prose("header without final", n=t["without_final"]) if t["without_final"] else ""))
    if meta.get("budget"):
        secs, n, jobs = meta["budget"]
        lines.append(prose("header budget", time=duration(secs), n=n, s=_s(n), jobs=jobs))
    infos = [r.run_info for r in runs if r.run_info]
    machines = Counter(machine(i) for i in infos)
    if machines:
        lines += [f"- machine: {m} ({n} run{_s(n)})" for m, n in machines.most_common()]
        lines.append("- threads per run: " + _runs_each(Counter(str(i.get("threads", "?")) for i in infos)))
        lines.append("- code: commit " + _runs_each(Counter((i.get("git_commit") or "unknown")[:12] for i in infos)))
    else:
        lines.append("- machine: not recorded in the run folders (no run_info.json)")
    if len(infos) < len(runs) and infos:
        n = len(runs) - len(infos)
        lines.append(f"- {n} run folder{_s(n)} {'has' if n == 1 else 'have'} no run_info.json")
    return "\n".join(lines) + "\n\n"
