"""The command line of `make wandb-export` and `make wandb-dashboards`.

    python -m highway_repro.dashboards export [--jobs 2]   # kept runs -> runs/wandb_export/wandb/offline-run-*
    python -m highway_repro.dashboards dashboards           # a saved view per table, or its JSON spec offline
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from highway_repro import files
from highway_repro.dashboards.export import EXPORT_DIR, PROJECT, export, shown
from highway_repro.dashboards.spec import build_specs
from highway_repro.errors import HighwayError, make_folder
from highway_repro.targets import ROOT


def run_export(args) -> int:
    try:
        r = export(args.results, args.out, jobs=args.jobs)
    except HighwayError as e:  # a damaged export record: one line, nothing removed
        print(f"error: {e}", file=sys.stderr)
        return 2
    where = shown(args.out / "wandb")
    print(f"{r['runs']} W&B runs in {where}: {r['written']} written, {r['skipped']} unchanged, {r['removed']} removed, "
          f"in {r['seconds']:.0f} s; upload: wandb sync {where}/offline-run-*")
    for folder, why in r["damaged"].items():
        print(f"error: left out of the export: {folder}: {why}", file=sys.stderr)
    return 1 if r["damaged"] else 0


def run_dashboards(args) -> int:
    from highway_repro.dashboards.publish import offline_reason, publish

    specs = build_specs(args.results)
    folder = args.out / "dashboards"
    make_folder(folder)
    for spec in specs:
        files.write_atomic(folder / f"{spec['table']}-{spec['scale']}.json", json.dumps(spec, indent=1) + "\n", folder)
    why = offline_reason()
    if why:
        print(f"W&B offline ({why}): wrote {len(specs)} dashboard specs to {shown(folder)}/ (nothing published)")
        return 0
    entity, project = os.environ["WANDB_ENTITY"], os.environ.get("WANDB_PROJECT") or PROJECT
    try:
        urls = publish(specs, entity, project)
    except Exception as e:  # the network, the server or the key: one line, the specs are written
        print(f"error: could not publish to W&B {entity}/{project} ({type(e).__name__}: {str(e)[:200]}); "
              f"the specs are in {shown(folder)}/", file=sys.stderr)
        return 1
    for spec, url in zip(specs, urls):
        print(f"{spec['name']}: {url}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m highway_repro.dashboards", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, helptext in (("export", "the kept runs as offline W&B runs"),
                           ("dashboards", "a W&B dashboard per table: published online, else its JSON spec")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("--results", type=Path, default=ROOT / "results", help="the kept runs and summary.csv")
        s.add_argument("--out", type=Path, default=EXPORT_DIR, help="the export folder (git-ignored)")
        if name == "export":
            s.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    args = p.parse_args(argv)
    if not (args.results / "summary.csv").exists():
        print(f"error: --results={args.results} has no summary.csv (valid: the results folder, e.g. results)",
              file=sys.stderr)
        return 2
    if args.command == "export" and args.jobs < 1:
        print(f"error: --jobs={args.jobs} is not allowed (valid: a positive integer)", file=sys.stderr)
        return 2
    args.results, args.out = args.results.resolve(), args.out.resolve()
    return run_export(args) if args.command == "export" else run_dashboards(args)


if __name__ == "__main__":
    sys.exit(main())
