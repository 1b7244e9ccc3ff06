"""The models the check measures: each a paper-scale experiment config, its baseline and one gated variant, the
table whose time its step time sets, and the mirror files it reads."""

from __future__ import annotations

from dataclasses import dataclass

from .common import REPO

ENWIK8 = ("enwik8/enwik8.prefix",)
PTB = tuple(f"ptb/ptb.{s}.txt" for s in ("train", "valid", "test"))
MNIST = tuple(f"mnist/{n}.gz" for n in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"))
CIFAR = tuple(f"cifar10/cifar-10-batches-py/{n}" for n in ("data_batch_1", "test_batch", "batches.meta"))


@dataclass(frozen=True)
class Case:
    """One paper-scale model: an experiment config, its variants (baseline first) and the data it needs."""

    key: str
    label: str
    experiment: str
    table: str  # the `make reproduce-<table>` whose time this case's step time sets
    variants: tuple  # ((name, (overrides, ...)), ...)
    overrides: tuple = ()
    files: tuple = ()  # mirror-layout files it reads
    group: str = "B"  # A: the cases with MFU targets (measured first), B: the rest, C: only for the table times
    bf16_lstm: bool = False  # True: holds an LSTM; on CPU, oneDNN runs it in bf16 only with AVX512-BF16 or AMX
    dry: tuple = ()  # extra overrides of the dry run (smaller image batches: bf16 convolutions are slow on CPU)


VARIANTS = frozenset(p.stem for p in (REPO / "configs" / "variant").glob("*.yaml"))


def variant(name: str) -> str:
    """A Highway Transformer variant by its config name; a name with no `configs/variant/<name>.yaml` fails at import,
    not minutes into a GPU run."""
    if name not in VARIANTS:
        raise ValueError(f"variant={name!r}: no configs/variant/{name}.yaml; allowed: {', '.join(sorted(VARIANTS))}")
    return name


def _ht(gated: str | None = "sdu_tanh") -> tuple:
    base = ((variant("baseline"), ("variant=baseline",)),)
    return base + (((variant(gated), (f"variant={gated}",)),) if gated else ())


def cpu_bf16_features() -> list[str]:  # in the package; imported late, once setup_paths put this checkout first
    from highway_repro.engine.loggers import cpu_bf16_features as features
    return features()


HN = (("plain", ("model.kind=plain",)), ("highway", ("model.kind=highway",)))
SMALL_IMAGES = ("data.batch_size=10", "data.eval_batch_size=50")
CASES = (
    Case("txl6", "Transformer-XL 6 layers, enwik8", "ht_enwik8_l6", "ht_enwik8_l6", _ht(),
         ("data=enwik8_prefix",), ENWIK8, "A"),
    Case("tlm3", "Transformer-L3, char-PTB", "ht_char_ptb", "ht_char_ptb", _ht(), (), PTB, "A"),
    Case("txl12", "Transformer-XL 12 layers, enwik8", "ht_enwik8_l12", "ht_enwik8_l12", _ht("sdu_tanh"),
         ("data=enwik8_prefix",), ENWIK8),
    Case("rt_word", "R-Transformer-L3, word-PTB", "ht_word_ptb", "ht_word_ptb", _ht(), (), PTB, bf16_lstm=True),
    Case("mnist_conv", "highway conv net, 10 layers width 32, MNIST", "hn_table1", "hn_table1", HN, (), MNIST,
         dry=SMALL_IMAGES),
    Case("cifar_conv", "highway conv net, 19 layers, CIFAR-10", "hn_cifar", "hn_cifar", HN,
         ("data.allow_partial=true",), CIFAR[:2], dry=SMALL_IMAGES),
    Case("mlp100", "FC net depth 100, MNIST", "hn_fig1", "hn_fig1", HN, ("model.depth=100", "trial=0"), MNIST,
         dry=SMALL_IMAGES),
    Case("rt_char", "R-Transformer-L3, char-PTB", "ht_char_ptb_rt", "ht_char_ptb_rt", _ht(None), (), PTB, "C"),
    Case("tlm_word", "Transformer-L3, word-PTB", "ht_word_ptb_l3", "ht_word_ptb_l3", _ht(None), (), PTB, "C"),
)
CASE_BY_KEY = {c.key: c for c in CASES}
# tables whose time another case's step time estimates (upper bounds: the measured net is the larger one)
TABLE_CASE = {c.table: c.key for c in CASES} | {"hn_analysis": "mlp100"}
BASE_VARIANTS = ("baseline", "plain")


def label(variant: str, mode: str, flex: bool = False) -> str:
    """The run's name in the report: the eager run keeps the variant's name (phase 4's rows are reused)."""
    return variant if mode == "eager" else f"{variant}{'+flex' if flex else ''}+compile-{mode}"
