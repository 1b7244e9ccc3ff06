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

from highway_repro import files
from highway_repro.analysis import gates as ga
from highway_repro.train.job import build
from highway_repro.train.config import check_targets
from highway_repro.engine import checkpoint as ckpt_lib
from highway_repro.errors import ArgumentParser, HighwayError
from highway_repro.report import build_table, findings_path, load_runs
from highway_repro.files import read_config
from highway_repro.report.runs import RunFolderError, read_overrides
from highway_repro.targets import CONFIG_DIR, scale_files
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException


def load_trained(run_dir: Path):
    """(config, data, model with the weights of ckpt/last.pt) of a run folder. Nothing of the folder is built from:
    its overrides (`.hydra/overrides.yaml`, plain key=value lines) are composed with the project's own config files,
    the folder's config_resolved.yaml must hold that same recipe (`train.recipe.recipe_diff`), and the composed
    config, resolved, builds only what `config.TARGETS` allows (`job.build`)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from highway_repro.resolvers import register
    from highway_repro.train.recipe import recipe_diff

    path = run_dir / "config_resolved.yaml"
    saved, overrides = read_config(path), read_overrides(run_dir / ".hydra" / "overrides.yaml")
    if not isinstance(saved, dict) or overrides is None:
        raise RunFolderError(f"{path} holds no run's config (valid: the folder of a finished run, with its "
                             "config_resolved.yaml and .hydra/overrides.yaml)")
    register()
    job = [o for o in overrides if not o.startswith(("hydra", "logger"))]  # (where a run logs: not its recipe)
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            resolved = OmegaConf.to_container(compose("train", overrides=job), resolve=True)
    except (HydraException, OmegaConfBaseException) as e:
        raise RunFolderError(f"{run_dir / '.hydra' / 'overrides.yaml'} does not compose with the project's configs "
                             f"({type(e).__name__}: {' '.join(str(e).split())[:160]})") from None
    diff = recipe_diff(saved, resolved)
    if diff:
        raise RunFolderError(f"{path} holds another recipe than its overrides give ({'; '.join(diff[:3])}) (valid: "
                             "the config the run's overrides compose; train the run again)")
    check_targets(resolved, where=f"the config composed for {run_dir}")
    data = build(resolved["data"], "data")
    model = build(resolved["model"], "model", **data.meta)
    ckpt = ckpt_lib.load(run_dir / "ckpt" / "last.pt")
    ckpt_lib.load_model_state(model, ckpt["model"], str(run_dir / "ckpt" / "last.pt"))
    return resolved, data, model


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
    files.write_atomic(findings_path(out), "\n".join(lines) + "\n")  # kept: `make tables` rebuilds the report from it
    scale = args.scale or cfg.get("scale_name")
    meta = {"commands": args.command or [f"python -m highway_repro.analysis.run {run_dir}"], "scale": scale,
            "wall_s": args.wall_s, "findings": "\n".join(lines), "scale_files": scale_files("hn_analysis", scale)}
    print(build_table("hn_analysis", load_runs(run_dir), out, meta))  # header, trained-net table, floor, findings
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
