"""One source of truth for options: their choices, their bounds and the one message style. No torch.

Every model constructor checks its arguments here (`check_model("TransformerLM", locals())` as its first
line), and `highway_repro.train.config.validate` checks the composed config with the same call before torch is
imported, so a bad value fails in about a second with the same message the constructor would give.
Gate placement (`gate_kind`, `gate_layers`, `gate_sublayers`) has its own torch-free parser,
`highway_repro.models.placement`, which both call as well. The same pattern holds for the data options
(`DATA`, `TRAIN_SIZES`) and the trainer options that `engine.trainer.TrainerConfig` does not check itself
(`TRAINER`).

Message style: one line, the field named as in the configs, its value, what is wrong (by default "is not
allowed") and what is allowed:

    model.d_ff=0 is not allowed (valid: a positive integer)
    model.n_heads=3 does not divide model.d_model=512 (valid: a divisor of 512)
    model.mem_len=8 is not allowed: TransformerLM has no option mem_len (valid only for TransformerXL; remove it)

Every such error is a `highway_repro.errors.ConfigError` (a ValueError).

To add an option: add its rule to the model's table in `MODELS` (a test checks that each table lists exactly
the constructor's arguments); a rule between options goes into that model's `_cross_*` function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

from highway_repro.errors import ConfigError


def is_int(v) -> bool:
    """An int that is not a bool (True would pass isinstance(v, int))."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def error(field: str, value, valid: str, problem: str = "is not allowed") -> ConfigError:
    """`<field>=<value!r> <problem> (valid: <valid>)`, the one message style."""
    return ConfigError(f"{field}={value!r} {problem} (valid: {valid})")


@dataclass(frozen=True)
class Rule:
    """What a value must be: `ok(value)`, and `valid`, what the message says is allowed."""

    valid: str
    ok: Callable[[object], bool]

    def check(self, field: str, value) -> None:
        if not self.ok(value):
            raise error(field, value, self.valid)


def at_least(n: int) -> Rule:
    return Rule("a positive integer" if n == 1 else f"an integer >= {n}", lambda v: is_int(v) and v >= n)


def one_of(*choices: str) -> Rule:
    return Rule(", ".join(choices), lambda v: isinstance(v, str) and v in choices)


def optional(rule: Rule) -> Rule:
    return Rule(f"{rule.valid}, or null", lambda v: v is None or rule.ok(v))


def shape(n: int | None = None) -> Rule:
    what = f"{n} positive integers" if n else "a list of positive integers"
    return Rule(what, lambda v: isinstance(v, (list, tuple)) and (n is None or len(v) == n) and len(v) > 0
                and all(is_int(x) and x >= 1 for x in v))


POSITIVE_INT = at_least(1)
NON_NEGATIVE_INT = at_least(0)
INT = Rule("an integer", is_int)
NUMBER = Rule("a number", is_number)
POSITIVE_NUMBER = Rule("a number > 0", lambda v: is_number(v) and v > 0)
PROBABILITY = Rule("a probability in [0, 1)", lambda v: is_number(v) and 0 <= v < 1)
BOOL = Rule("true or false", lambda v: isinstance(v, bool))
STR = Rule("a string", lambda v: isinstance(v, str))
LIST = Rule("a list", lambda v: isinstance(v, (list, tuple)))
PLACEMENT = Rule("a gate placement (see highway_repro.models.placement)", lambda v: True)  # checked there

# ----------------------------------------------------------------------------- choices
# The model modules take their choices from here (a torch-side map name -> class, where one exists, is tied to
# these names by tests/test_options.py).
NORM_POSITIONS = ("post", "pre")  # TransformerLM, TransformerXL: LayerNorm after the residual sum | before the sublayer
POSITIONS = ("sinusoidal", "learned", "none")  # TransformerLM
RNNS = ("gru", "lstm")  # RTransformer local RNN
NORM_IMPLS = ("official", "torch")  # RTransformer LayerNorm: unbiased std + eps (official code) | nn.LayerNorm
MLP_KINDS = ("plain", "highway", "residual")
CONV_KINDS = ("highway", "plain")
ACTIVATIONS = ("relu", "tanh")
WIDTHS = ("paper", "match")  # MLP width besides an integer

CLAMP_LEN = Rule("-1 (no clamping) or a positive integer", lambda v: is_int(v) and (v == -1 or v >= 1))
_GATES = {"gate_kind": PLACEMENT, "gate_layers": PLACEMENT, "gate_sublayers": PLACEMENT, "gate_bias": NUMBER,
          "fused": BOOL}
_LM = {"vocab_size": POSITIVE_INT, "n_layers": POSITIVE_INT, "d_model": POSITIVE_INT, "n_heads": POSITIVE_INT,
       "d_ff": POSITIVE_INT, "dropout": PROBABILITY, "tie_embeddings": BOOL, **_GATES}

# model class name -> {constructor argument -> rule}
MODELS: dict[str, dict[str, Rule]] = {
    "TransformerLM": {
        **_LM, "attn_dropout": PROBABILITY, "emb_dropout": optional(PROBABILITY),
        "norm_position": one_of(*NORM_POSITIONS), "pos": one_of(*POSITIONS), "max_len": optional(POSITIVE_INT),
        "bias": BOOL},
    "RTransformer": {
        **_LM, "rnn": one_of(*RNNS), "window": POSITIVE_INT, "rnn_layers_per_block": POSITIVE_INT,
        "emb_dropout": PROBABILITY, "attn_dropout": optional(PROBABILITY), "norm_impl": one_of(*NORM_IMPLS),
        "final_norm": BOOL},
    "TransformerXL": {
        **_LM, "d_model": Rule("an even positive integer (sinusoidal positions)",
                               lambda v: is_int(v) and v >= 2 and v % 2 == 0),
        "d_head": POSITIVE_INT, "attn_dropout": PROBABILITY, "tgt_len": POSITIVE_INT, "mem_len": NON_NEGATIVE_INT,
        "clamp_len": CLAMP_LEN,
        "same_length": BOOL, "eval_tgt_len": optional(POSITIVE_INT), "eval_mem_len": optional(NON_NEGATIVE_INT),
        "eval_clamp_len": optional(CLAMP_LEN),
        "eval_same_length": optional(BOOL), "norm_position": one_of(*NORM_POSITIONS),
        "tie_embeddings": Rule("true (only the tied softmax of the paper's runs is implemented)", lambda v: v is True),
        "flex_attention": BOOL},
    "MLP": {
        "kind": one_of(*MLP_KINDS), "depth": Rule("an integer >= 2 (1 plain input layer + depth - 1 layers)",
                                                  lambda v: is_int(v) and v >= 2),
        "width": Rule("a positive integer, paper or match", lambda v: v in WIDTHS if isinstance(v, str)
                      else is_int(v) and v >= 1),
        "activation": one_of(*ACTIVATIONS), "gate_bias": NUMBER, "match_to": one_of(*MLP_KINDS),
        "num_classes": POSITIVE_INT, "input_shape": shape()},
    "MnistHighwayNet": {
        "width": POSITIVE_INT, "kind": one_of(*CONV_KINDS), "gate_bias": NUMBER, "num_classes": POSITIVE_INT,
        "input_shape": shape(3)},
    "CifarHighwayNet": {
        "kind": one_of(*CONV_KINDS), "gate_bias": NUMBER, "num_classes": POSITIVE_INT, "input_shape": shape(3),
        "widths": optional(Rule("4 positive integers (stage 1, stage 2, stage 3, 1x1 head; paper 32, 80, 128, 100)",
                                shape(4).ok)),
        "width_mult": POSITIVE_NUMBER},
}

# Model options renamed: the old name is an error naming the new one (`check_model`); a saved config that holds it
# is another recipe until scripts/migrate_kept_runs.py rewrites it (`recipe.recipe_diff` names the script).
RENAMED = {"norm": "norm_position", "norm_style": "norm_impl"}


def renamed(name: str, key: str, value, prefix: str = "model.") -> ConfigError | None:
    """The error for option `key` of model `name` (a key of MODELS) when `key` is the old name of one it has."""
    new = RENAMED.get(key)
    if new is None or new not in MODELS.get(name, {}):
        return None
    return ConfigError(f"{prefix}{key}={value!r} is not allowed: the option is now called {new} (valid: "
                       f"{prefix}{new}, one of {MODELS[name][new].valid})")


def _cross_heads(v: Mapping, prefix: str) -> None:
    d, h = v.get("d_model"), v.get("n_heads")
    if is_int(d) and is_int(h) and d >= 1 and h >= 1 and d % h:
        raise error(f"{prefix}n_heads", h, f"a divisor of {d}", f"does not divide {prefix}d_model={d}")


def _cross_transformer_lm(v: Mapping, prefix: str) -> None:
    _cross_heads(v, prefix)
    if v.get("pos", "sinusoidal") == "sinusoidal" and is_int(v.get("d_model")) and v["d_model"] % 2:
        raise error(f"{prefix}d_model", v["d_model"], "an even integer",
                    f"is not allowed with {prefix}pos='sinusoidal'")
    if v.get("pos") == "learned" and "max_len" in v and v["max_len"] is None:
        raise error(f"{prefix}max_len", None, "a positive integer, the number of learned positions",
                    f"is not allowed with {prefix}pos='learned'")


def _cross_transformer_xl(v: Mapping, prefix: str) -> None:
    for p in ("", "eval_"):  # eval_* = the training value when null
        same = v.get(p + "same_length") if v.get(p + "same_length") is not None else v.get("same_length")
        mem = v.get(p + "mem_len") if v.get(p + "mem_len") is not None else v.get("mem_len")
        if same is True and mem == 0:
            raise error(f"{prefix}{p}same_length", True, "false when the memory is empty: the window is mem_len keys",
                        f"is not allowed with {prefix}{p}mem_len=0")
    if v.get("flex_attention") is True and is_number(v.get("attn_dropout")) and v["attn_dropout"] > 0:
        raise error(f"{prefix}attn_dropout", v["attn_dropout"], "0.0: FlexAttention has no attention dropout",
                    f"is not allowed with {prefix}flex_attention=True")


CROSS_CHECKS: dict[str, Callable[[Mapping, str], None]] = {
    "TransformerLM": _cross_transformer_lm, "RTransformer": _cross_heads, "TransformerXL": _cross_transformer_xl}


def check_model(name: str, values: Mapping, prefix: str = "model.") -> None:
    """Raise ConfigError for the first bad value of model `name` (a key of MODELS).

    `values` maps argument names to values: a constructor passes `locals()` (`self` and `__class__` are skipped,
    as are Hydra's `_target_`-style keys); the validator passes the config's model node, which may leave out
    arguments (their defaults are the constructor's). Unknown keys are errors naming the models that have them.
    """
    spec = MODELS[name]
    values = {k: v for k, v in values.items() if k not in ("self", "__class__") and not k.startswith("_")}
    for key, value in values.items():
        if renamed(name, key, value, prefix) is not None:
            raise renamed(name, key, value, prefix)
        if key not in spec:
            owners = [m for m, s in MODELS.items() if key in s]
            valid = (f"valid only for {', '.join(owners)}; remove it" if owners else
                     f"valid: {', '.join(spec)}")
            raise ConfigError(f"{prefix}{key}={value!r} is not allowed: {name} has no option {key} ({valid})")
        spec[key].check(prefix + key, value)
    if name in CROSS_CHECKS:
        CROSS_CHECKS[name](values, prefix)


# ----------------------------------------------------------------------------- data

# data options checked before anything is loaded (the data builders check the rest)
DATA = {k: POSITIVE_INT for k in ("batch_size", "eval_batch_size", "seq_len", "score_len", "eval_seq_len",
                                  "eval_score_len", "vocab_size", "train_limit", "train_limit_tokens")}

# Training-set size of each registered data set: (unit, upper bound: images, or tokens with the default
# tokenizer), so that a batch larger than the data fails before anything is loaded. Upper bounds (CIFAR-10 with
# allow_partial may have fewer images); `config.validate_against_data` checks the built data exactly.
TRAIN_SIZES = {"mnist": ("images", 60_000), "cifar10": ("images", 50_000), "cifar100": ("images", 50_000),
               "ptb_word": ("tokens", 929_589), "ptb_char": ("tokens", 5_017_482),
               "ptb_char_raw": ("tokens", 5_101_618), "enwik8": ("tokens", 90_000_000),
               "enwik8_prefix": ("tokens", 3_738_959)}
DEFAULT_TOKENIZER = {"ptb_word": "word", "ptb_char": "char", "ptb_char_raw": "char"}  # else "byte"


def check_data(values: Mapping, prefix: str = "data.") -> None:
    """The bounds of DATA, then: a batch larger than the training data fails here, from TRAIN_SIZES."""
    for key, rule in DATA.items():
        if values.get(key) is not None:
            rule.check(prefix + key, values[key])
    name, batch = values.get("name"), values.get("batch_size")
    if not isinstance(name, str) or name not in TRAIN_SIZES or batch is None:
        return
    unit, n = TRAIN_SIZES[name]
    if unit == "images":
        val = values.get("val_size") or 0
        if not is_int(val) or not 0 <= val < n:
            raise error(f"{prefix}val_size", val, f"0..{n - 1}, {name} has {n:,} training images")
        n -= val
        what = f"{name} has at most {n:,} training images" + (f" with {prefix}val_size={val}" if val else "")
        limit = values.get("train_limit")
        if limit is not None and limit < n:
            n, what = limit, f"{name} has {limit:,} training images with {prefix}train_limit={limit}"
        if batch > n:
            raise ConfigError(f"{prefix}batch_size={batch} is larger than the training data ({what}; valid: 1..{n})")
        return
    if values.get("tokenizer") not in (None, DEFAULT_TOKENIZER.get(name, "byte")):
        return  # a subword vocabulary: the token count is only known after tokenising
    what = f"{name} has at most {n:,} training tokens"
    limit = values.get("train_limit_tokens")
    if limit is not None and limit < n:
        n, what = limit, f"{name} has {limit:,} training tokens with {prefix}train_limit_tokens={limit}"
    seq_len = values.get("seq_len") or 1
    most = (n - 1) // seq_len  # batchify: batch_size columns of (n - 1) // batch_size >= seq_len tokens
    if batch > most:
        raise ConfigError(f"{prefix}batch_size={batch} is larger than the training data ({what}, in columns of at "
                          f"least {prefix}seq_len={seq_len}; valid: 1..{most})" if most >= 1 else
                          f"{prefix}batch_size={batch} is larger than the training data ({what}, fewer than "
                          f"{prefix}seq_len={seq_len} + 1; valid: none, lower {prefix}seq_len)")


# ----------------------------------------------------------------------------- optimizer

# The learning rate of every optimizer (torch's SGD takes nan and inf; Adam refuses them and negative values).
LEARNING_RATE = Rule("a finite number >= 0", lambda v: is_number(v) and math.isfinite(v) and v >= 0)


# ----------------------------------------------------------------------------- trainer

# The bounds that engine.trainer.TrainerConfig does not check itself (it checks max_steps, log_every, eval_every,
# checkpoint_every, grad_clip, precision, memory_format, nan_policy, final_eval). The types of all its fields come from
# its annotations (`annotation_rule`).
TRAINER = {"gate_stats_every": NON_NEGATIVE_INT, "max_bad_steps": NON_NEGATIVE_INT,
           "eval_max_batches": optional(POSITIVE_INT), "final_max_batches": optional(POSITIVE_INT),
           "device": Rule("auto, cpu, cuda, cuda:N", lambda v: isinstance(v, str))}  # torch.device parses it

# The run's own keys (configs/train.yaml), checked before anything is built: numpy seeds take 0 .. 2**32 - 1.
RUN = {"seed": Rule("an integer in [0, 2**32)", lambda v: is_int(v) and 0 <= v < 2**32),
       "threads": Rule("an integer >= 0 (0: torch's default)", lambda v: is_int(v) and v >= 0),
       "deterministic": BOOL}

_TYPES = {"int": INT, "float": NUMBER, "str": STR, "bool": BOOL, "list": LIST}


def annotation_rule(annotation: str) -> Rule | None:
    """The type rule of a dataclass field annotated 'int', 'float | None', ... (None: not a simple type)."""
    parts = [p.strip() for p in str(annotation).split("|")]
    nullable = "None" in parts
    parts = [p for p in parts if p != "None"]
    if len(parts) != 1 or parts[0] not in _TYPES:
        return None
    return optional(_TYPES[parts[0]]) if nullable else _TYPES[parts[0]]
