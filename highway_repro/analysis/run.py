"""Highway Networks Figs. 2-4 from a finished run folder: `make reproduce-hn-analysis`.

    python -m highway_repro.analysis.run runs/sweeps/hn_analysis-cpu --out results/highway_networks/analysis

Rebuilds data and model from the run's resolved config, loads `ckpt/last.pt`, and writes <out>_findings.md
(what the figures show), <out>_heatmaps.png (Fig. 2), <out>_routing.png (Fig. 3, digits 0 and 7) and
<out>_lesion.png (Fig. 4), then the report <out>.md (the header and the trained net's table with its floor, from
`highway_repro.report`, then the findings). The findings file is kept, so `make tables` rebuilds the report
without the checkpoint. Analyses use the full training set, as the paper does.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from highway_repro.analysis import gates as ga
from highway_repro.train.job import build
from highway_repro.train.config import check_targets
from highway_repro.engine import checkpoint as ckpt_lib
from highway_repro.errors import ArgumentParser, HighwayError
from highway_repro.report import build_table, findings_path, load_runs
from highway_repro.report.runs import RunFolderError, read_yaml
from highway_repro.targets import scale_files


def load_trained(run_dir: Path):
    """(resolved config, data, model with the weights of ckpt/last.pt) of a run folder. The folder's config is read
    as plain data (`read_yaml`) and builds only what `config.TARGETS` allows (`cli.build`): a file never chooses
    the code that runs."""
    path = run_dir / "config_resolved.yaml"
    cfg = read_yaml(path)
    if not isinstance(cfg, dict) or not isinstance(cfg.get("data"), dict) or not isinstance(cfg.get("model"), dict):
        raise RunFolderError(f"{path} holds no run's config (valid: the config_resolved.yaml of a finished run, "
                             "with its data and model)")
    check_targets(cfg, where=str(path))
    data = build(cfg["data"], "data")
    model = build(cfg["model"], "model", **data.meta)
    ckpt = ckpt_lib.load(run_dir / "ckpt" / "last.pt")
    ckpt_lib.load_model_state(model, ckpt["model"], str(run_dir / "ckpt" / "last.pt"))
    return cfg, data, model


def main(argv=None) -> int:
    ap = ArgumentParser(prog="python -m highway_repro.analysis.run", description=__doc__.split("\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--out", required=True, help="output prefix")
    ap.add_argument("--command", action="append", default=None, help="the command(s) that made the run (repeatable)")
    ap.add_argument("--scale", default=None)
    ap.add_argument("--wall-s", type=float, default=None)
    ap.add_argument("--max-examples", type=int, default=None, help="use only the first N training examples")
    args = ap.parse_args(argv)
    run_dir, out = Path(args.run_dir), Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    try:
        cfg, data, model = load_trained(run_dir)
    except HighwayError as e:  # the user's to fix (a folder, its config, its checkpoint, the data): one line
        print(f"error: {e}", file=sys.stderr)
        return 2
    xs, ys = zip(*data.eval_batches("train"))
    x, y = torch.cat(xs), torch.cat(ys)
    if args.max_examples:
        x, y = x[: args.max_examples], y[: args.max_examples]
    heat = ga.gate_heatmaps(model, x, y, example_index=0)
    routing = ga.class_routing(model, x, y, classes=(0, 7))
    lesion = ga.lesion_curve(model, x, y)
    figs = {"heatmaps": ga.plot_heatmaps(heat, out.with_name(out.name + "_heatmaps.png")),
            "routing": ga.plot_routing(routing, out.with_name(out.name + "_routing.png")),
            "lesion": ga.plot_lesion(lesion, out.with_name(out.name + "_lesion.png"))}
    m = cfg["model"]
    lines = [
        f"- net: {m['depth']} layers, {m['activation']}, width {m['width']}, gate bias init {m['gate_bias']}; "
        f"{cfg['trainer']['max_steps']} steps of batch {cfg['data']['batch_size']}; analysis {time.time() - t0:.0f} s "
        f"on {x.shape[0]:,} training examples", "",
        "## What the figures show", "", ga.summarize(heat, lesion), "",
        "Paper (50-layer tanh highway net, MNIST): most biases become more negative during training; "
        "single-example gate activity is sparse; outputs stay constant over stretches of layers and most change "
        "happens in the first ~15 layers; lesioning layers 15-45 barely changes training performance.", "",
    ]
    lines += [f"![{k}]({p.name})" for k, p in figs.items()]
    findings_path(out).write_text("\n".join(lines) + "\n")  # kept: `make tables` rebuilds the report from it
    scale = args.scale or cfg.get("scale_name")
    meta = {"commands": args.command or [f"python -m highway_repro.analysis.run {run_dir}"], "scale": scale,
            "wall_s": args.wall_s, "findings": "\n".join(lines), "scale_files": scale_files("hn_analysis", scale)}
    print(build_table("hn_analysis", load_runs(run_dir), out, meta))  # header, trained-net table, floor, findings
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
