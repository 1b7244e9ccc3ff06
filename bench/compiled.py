"""Eager vs torch.compile for a group of benchmark cases, in a fresh process (run with a timeout).

    python -m bench.compiled CASE[,CASE...] [--rounds 3] [--threads N]

Builds the cases, compiles each model (`torch.compile(model)`, default mode; the optimizer
step stays eager), times the first compiled steps (compile time), then measures eager and
compiled steps of all cases interleaved. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = ap.parse_args(argv)
    import torch

    from bench import cases, timing

    if args.threads:
        torch.set_num_threads(args.threads)
    timing.set_clock(args.clock)
    names = args.cases.split(",")
    eager = {n: cases.build(n) for n in names}
    comp = {n: cases.build(n) for n in names}
    out = {"cases": {}}
    for n in names:
        c = comp[n]
        c.compile()
        t0 = time.perf_counter()
        c.step()  # compiles forward and backward
        c.step()
        out["cases"][n] = {"compile_s": time.perf_counter() - t0, "items": c.items, "unit": c.unit}
    steps = {}
    for n in names:
        steps[f"{n}|eager"] = eager[n].step
        steps[f"{n}|compiled"] = comp[n].step
    times = timing.interleaved(steps, warmup=1, min_rounds=args.rounds, max_rounds=args.rounds,
                               budget_s=1e9)  # exactly --rounds rounds
    for n in names:
        e, c = times[f"{n}|eager"], times[f"{n}|compiled"]
        out["cases"][n].update(eager_s=timing.median(e), compiled_s=timing.median(c), rounds=len(e),
                               speedup=timing.ratio(times, f"{n}|eager", f"{n}|compiled"))
    if len(names) == 2:  # the pair's ratio, compiled, side by side
        a, b = names
        out["pair_ratio_compiled"] = timing.ratio(times, f"{b}|compiled", f"{a}|compiled")
        out["pair_ratio_eager"] = timing.ratio(times, f"{b}|eager", f"{a}|eager")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
