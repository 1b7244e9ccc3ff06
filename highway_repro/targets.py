"""The paper tables that `make reproduce-<table>` builds: one explicit mapping name -> Target.

A table is made of config files and one report spec; this list only ties them together:

- `configs/experiment/<experiment>.yaml`: the paper's recipe;
- `configs/sweep/<name>/<scale>.yaml` (and `<scale>-*.yaml`, one Cartesian product each: their union is
  the table's grid): the rows and seeds/trials a scale runs (`hydra.sweeper.params`);
- `configs/experiment_scale/<experiment>/<scale>.yaml` (one per scale, required): what the scale changes,
  and the runner's estimates for it (`est_step_s`, `est_peak_gb`);
- `highway_repro.report.registry()[<name>]`: the table spec (rows, columns, claims) that reads the runs.

Adding a table = one line here + those files (docs/DESIGN.md walks through it). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "configs"
SCALES = tuple(sorted(p.stem for p in (CONFIG_DIR / "scale").glob("*.yaml")))  # configs/scale/<name>.yaml
# What a kept run folder holds (results/<paper>/runs/<name>-<scale>/<job>/): its metrics, history, config, machine
# and overrides; never a checkpoint
KEPT_FILES = ("metrics.json", "metrics.jsonl", "config_resolved.yaml", "run_info.json", ".hydra/overrides.yaml")
# What a run writes into its folder (none of them may be a link there: `files.no_links`, before the job writes)
RUN_ENTRIES = ("metrics.json", "metrics.jsonl", "config_resolved.yaml", "run_info.json", ".hydra", "ckpt", "wandb",
               "train.log")


@dataclass(frozen=True)
class Target:
    experiment: str           # configs/experiment/<experiment>.yaml
    results: str              # results/<results>.md|.csv|.png; finished runs in results/<paper>/runs/<name>-<scale>/
    help: str                 # one line for `make help` / `--list`
    sweep: bool = True        # False: a single run (no configs/sweep files)
    after: str | None = None  # a module run on the finished run folder (it writes the report and its kept findings)
    reuse: tuple = ()         # tables (same experiment) whose kept runs of the same name are reused, not trained
    parts: tuple = ()         # a report over the runs of these targets (trained in one queue), not a sweep of its own
    study: bool = False       # not a paper table: `make reproduce-all` leaves it out, `make tables` builds it
    group: str = "1"          # runs of a row trained together by default (runner --group): "auto" where it pays here


TARGETS: dict[str, Target] = {
    "demo": Target("demo", "demo/demo", "plain vs highway MLPs at depths 10 and 50 on MNIST (make demo)"),
    "hn_fig1": Target("hn_fig1", "highway_networks/fig1",
                      "Highway Networks Fig. 1: FC depth sweep, plain/highway/residual, random search",
                      group="auto"),  # 2.3x per run grouped on the reference CPU (results/bench_grouped.md)
    "hn_table1": Target("hn_table1", "highway_networks/table1",
                        "Highway Networks Table 1: 10-layer conv net on MNIST, widths 16/32"),
    "hn_cifar": Target("hn_cifar", "highway_networks/cifar",
                       "Highway Networks Tables 2/3: 19-layer net on CIFAR-10, highway vs plain"),
    "hn_analysis": Target("hn_analysis", "highway_networks/analysis",
                          "Highway Networks Figs. 2-4: gate heat maps, routing, lesioning of a 50-layer net",
                          sweep=False, after="highway_repro.analysis.run"),
    "ht_char_ptb": Target("ht_char_ptb", "highway_transformer/char_ptb_l3",
                          "Highway Transformer: Transformer-L3 on char-PTB, gate kinds"),
    "ht_word_ptb": Target("ht_word_ptb", "highway_transformer/word_ptb_rt",
                          "Highway Transformer: R-Transformer-L3 on word-PTB, gate kinds"),
    "ht_char_ptb_rt": Target("ht_char_ptb_rt", "highway_transformer/char_ptb_rt",
                             "Highway Transformer: R-Transformer-L3 on char-PTB, gate kinds"),
    "ht_word_ptb_l3": Target("ht_word_ptb_l3", "highway_transformer/word_ptb_l3",
                             "Highway Transformer: Transformer-L3 on word-PTB, gate kinds"),
    "ht_enwik8_l6": Target("ht_enwik8_l6", "highway_transformer/enwik8_l6",
                           "Highway Transformer: 6-layer Transformer-XL on enwik8, gate kinds and placement"),
    "ht_enwik8_l12": Target("ht_enwik8_l12", "highway_transformer/enwik8_l12",
                            "Highway Transformer: 12-layer Transformer-XL on enwik8, placement"),
    # studies, at the cpu scale of the tables they extend, reusing those tables' runs
    "ht_placement_scan": Target("ht_enwik8_l6", "highway_transformer/placement_scan",
                                "Study: SDU tanh in exactly one layer k of the 6-layer Transformer-XL, k = 1..6",
                                reuse=("ht_enwik8_l6",), study=True),
    "ht_zoo_char_ptb": Target("ht_char_ptb", "highway_transformer/gate_zoo_char_ptb_l3",
                              "Study (gate zoo, part): every gate kind on Transformer-L3, char-PTB",
                              reuse=("ht_char_ptb",), study=True),
    "ht_zoo_char_ptb_rt": Target("ht_char_ptb_rt", "highway_transformer/gate_zoo_char_ptb_rt",
                                 "Study (gate zoo, part): every gate kind on R-Transformer-L3, char-PTB",
                                 reuse=("ht_char_ptb_rt",), study=True),
    "ht_zoo_enwik8_l6": Target("ht_enwik8_l6", "highway_transformer/gate_zoo_enwik8_l6",
                               "Study (gate zoo, part): every gate kind on the 6-layer Transformer-XL, enwik8",
                               reuse=("ht_enwik8_l6",), study=True),
    "ht_paper_anchor": Target("ht_paper_anchor", "highway_transformer/paper_anchor",
                              "Study: the paper-size 6-layer Transformer-XL's first 400 steps beside the official logs",
                              study=True),
    "ht_gate_zoo": Target("ht_enwik8_l6", "highway_transformer/gate_zoo",
                          "Study: every gate kind x 3 models, with a parameter-matched baseline",
                          parts=("ht_zoo_char_ptb", "ht_zoo_char_ptb_rt", "ht_zoo_enwik8_l6"), study=True),
}

# `make reproduce-all` order: the paper tables (not the demo, not the studies); `make tables`: every report
PAPER_TABLES = [name for name, t in TARGETS.items() if name != "demo" and not t.study]
# `make tables`: a combined report before its parts, which then link to it for the comparisons it holds
REPORTS = list(dict.fromkeys(n for name in TARGETS if name != "demo"
                             for n in [c for c, t in TARGETS.items() if name in t.parts] + [name]))


def make_target(name: str) -> str:
    """The Makefile target of table `name`: ht_char_ptb -> reproduce-ht-char-ptb (one pattern rule for all)."""
    return f"reproduce-{name.replace('_', '-')}"


def runs_folder(name: str, scale: str, apart: bool = False) -> str:
    """Where the finished runs of a table are kept, relative to the results root: <paper>/runs/<name>-<scale>; with
    `apart`, <name>-<scale>-gpu, where the runs made on a GPU at a scale made for CPUs (every scale but the paper's)
    are kept (`runner.keep.keep`): a CPU twin of such a run, same folder name, never collides with it, and a
    report compares the runs of one device only (`report.runs.one_device`)."""
    return f"{TARGETS[name].results.split('/')[0]}/runs/{name}-{scale}{'-gpu' if apart else ''}"


def kept_apart(scale: str) -> bool:
    """Whether runs made on a GPU at `scale` are kept apart from its CPU runs: at every scale but the paper's."""
    return scale != "paper"


def scale_files(name: str, scale: str) -> list[tuple[str, str]]:
    """(path in the repository, text) of the scale file of each experiment of table `name` (its parts'), for the
    report: what the scale changes from the paper's recipe and the pilots behind each change."""
    exps = dict.fromkeys(TARGETS[p].experiment for p in TARGETS[name].parts or (name,))
    paths = [CONFIG_DIR / "experiment_scale" / e / f"{scale}.yaml" for e in exps]
    return [(p.relative_to(ROOT).as_posix(), p.read_text()) for p in paths if p.exists()]
