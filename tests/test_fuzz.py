"""Property-based tests (hypothesis) of the two parsers users feed by hand: the gate placement parser
(`models.placement.resolve_placement`, re-exported by `models.gates`) and the config validator
(`config.validate`). Random input never raises anything but the documented one-line ValueError /
ConfigError naming the option; valid input gives consistent results. max_examples is kept modest
(the whole file runs in a few seconds)."""

from __future__ import annotations

import copy
import re

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from conftest import compose
from highway_repro.train.config import ConfigError, validate
from highway_repro.models import gates
from highway_repro.models.placement import GATE_KINDS as REGISTRY
from highway_repro.models.placement import SUBLAYERS, check_placement, resolve_placement

GATE_KINDS = tuple(REGISTRY)  # "none" first
OPTIONS = ("model.n_layers", "model.gate_kind", "model.gate_layers", "model.gate_sublayers")

junk = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=10), st.binary(max_size=4), st.lists(st.integers(-3, 14), max_size=6),
    st.lists(st.one_of(st.integers(-3, 14), st.text(max_size=3), st.none(), st.floats()), max_size=4),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2), st.tuples(st.integers(), st.text(max_size=2)),
    st.sets(st.integers(0, 12), max_size=3), st.just(object()),
)
layer_specs = st.one_of(
    st.just("all"), st.just(" ALL "), st.integers(-3, 14), st.lists(st.integers(-3, 14), max_size=8),
    st.builds(lambda a, b: f"{a}-{b}", st.integers(-3, 14), st.integers(-3, 14)),
    st.builds(lambda a, b: f"{a}-{b}", st.integers(1, 5), st.integers(10**6, 10**15)),  # a huge range
    st.lists(st.integers(-3, 14), max_size=5).map(lambda xs: ",".join(map(str, xs))),
    st.text(alphabet="0123456789-, al", max_size=10), junk,
)
sublayer_specs = st.one_of(st.sampled_from(["both", "attn", "ffn", "mlp", ""]),
                           st.lists(st.sampled_from(["attn", "ffn", "mlp", 3]), max_size=3), junk)
kind_specs = st.one_of(st.sampled_from(GATE_KINDS + ("sdu_relu", "", "SDU_TANH")),
                       st.lists(st.sampled_from(GATE_KINDS + ("bad",)), max_size=14), junk)
n_layer_specs = st.one_of(st.integers(1, 12), st.integers(-3, 0),  # (resolve_placement builds one dict per layer:
                          junk.filter(lambda v: not isinstance(v, int) or v < 100))  # no huge models here)


def _assert_clear(e: Exception, names=OPTIONS) -> None:
    msg = str(e)
    assert type(e) in (ValueError, ConfigError), repr(e)
    assert msg and "\n" not in msg, repr(msg)
    assert any(msg.startswith(n) for n in names), msg


@settings(max_examples=250, deadline=None)
@given(n_layer_specs, kind_specs, layer_specs, sublayer_specs)
def test_placement_never_crashes(n_layers, kind, layers, sublayers):
    try:
        check_placement(n_layers, kind, layers, sublayers)
    except ValueError as e:
        _assert_clear(e)
        with pytest.raises(ValueError, match=f"^{re.escape(str(e))}$"):  # the same verdict as resolve_placement
            resolve_placement(n_layers, kind, layers, sublayers)
        return
    out = resolve_placement(n_layers, kind, layers, sublayers)
    assert isinstance(out, list) and len(out) == n_layers
    for p in out:
        assert set(p) == set(SUBLAYERS) and all(v is None or v in GATE_KINDS[1:] for v in p.values())


def _ranges(layers: list[int]) -> str:
    """[1, 2, 3, 5] -> '1-3,5' (consecutive runs as ranges)."""
    parts, run = [], []
    for i in sorted(layers):
        if run and i != run[-1] + 1:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(i)
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_placement_gates_exactly_the_chosen_layers(data):
    n = data.draw(st.integers(1, 12), "n_layers")
    chosen = data.draw(st.sets(st.integers(1, n)), "layers")
    kind = data.draw(st.sampled_from(GATE_KINDS[1:]), "kind")
    subs, expected = data.draw(st.sampled_from([("both", SUBLAYERS), ("attn", ("attn",)), ("ffn", ("ffn",)),
                                                (["ffn", "attn"], SUBLAYERS), (None, SUBLAYERS), ([], ())]), "subs")
    as_list = sorted(chosen)
    forms = [as_list, list(reversed(as_list)), as_list + as_list, ",".join(map(str, as_list)), _ranges(as_list),
             " , ".join(map(str, as_list))]
    if len(as_list) == 1:
        forms.append(as_list[0])
    results = [resolve_placement(n, kind, f, subs) for f in forms]
    assert all(r == results[0] for r in results)
    for i, p in enumerate(results[0], start=1):
        for s in SUBLAYERS:
            assert p[s] == (kind if i in chosen and s in expected else None)
    assert resolve_placement(n, kind, "all", subs) == resolve_placement(n, kind, list(range(1, n + 1)), subs)
    check_placement(n, kind, forms[-1], subs)  # what validation runs: no error for a valid placement
    lo = data.draw(st.integers(1, n), "lo")
    hi = data.draw(st.integers(lo, n), "hi")
    assert resolve_placement(n, kind, f"{lo}-{hi}") == resolve_placement(n, kind, list(range(lo, hi + 1)))
    per_layer = data.draw(st.lists(st.sampled_from(GATE_KINDS), min_size=n, max_size=n), "per-layer kinds")
    out = resolve_placement(n, per_layer, "all", subs)
    assert [p[s] for p in out for s in SUBLAYERS] == \
        [(k if k != "none" and s in expected else None) for k in per_layer for s in SUBLAYERS]


def test_placement_known_bad_inputs():
    """The crashes the fuzzing found (TypeError / a 10^15-element list / silently empty ranges) stay fixed."""
    for args, start in [((4, "sdu_tanh", "all", 5), "model.gate_sublayers=5 is not"),
                        ((4, 7), "model.gate_kind=7 is not a gate kind"), ((4, None), "model.gate_kind=None"),
                        ((4, "sdu_tanh", "1-1000000000000000"),
                         "model.gate_layers='1-1000000000000000' names layer 1000000000000000, but the model's "
                         "layers are 1-4"),
                        ((4, "sdu_tanh", "4-2"), "model.gate_layers='4-2' has the empty range '4-2'"),
                        ((4, "sdu_tanh", b"\x01"), "model.gate_layers=b'\\x01' is not a layer selection"),
                        ((4, "sdu_tanh", "all", ["attn", 1]), "model.gate_sublayers=['attn', 1] contains 1")]:
        with pytest.raises(ValueError) as e:
            gates.resolve_placement(*args)
        assert str(e.value).startswith(start), str(e.value)


# ----------------------------------------------------------------------------- the config validator

BASES = {
    "mlp": ["experiment=demo", "scale=smoke"],
    "transformer_lm": ["model=transformer_lm", "data=ptb_char", "scale=smoke", "model.gate_kind=sdu_tanh",
                       "model.gate_layers=2-3"],
    "transformer_xl": ["model=transformer_xl", "data=enwik8_prefix", "scale=smoke"],
    "r_transformer": ["model=r_transformer", "data=ptb_word", "scale=smoke", "model.gate_kind=[none,highway,sdu_tanh]"],
}
FIELDS = ["model.depth", "model.width", "model.n_layers", "model.d_model", "model.n_heads", "model.d_ff",
          "model.fused", "model.norm_impl", "model.d_inner", "model.d_head", "model.tgt_len", "model.mem_len",
          "model.window", "model.gate_kind",
          "model.gate_layers", "model.gate_sublayers", "data.batch_size", "data.eval_batch_size", "data.seq_len",
          "data.score_len", "data.train_limit", "data.train_limit_tokens", "data.val_size", "trainer.max_steps",
          "trainer.log_every", "trainer.eval_every", "trainer.checkpoint_every", "trainer.grad_clip",
          "trainer.nan_policy", "trainer.precision", "trainer.max_bad_steps", "trainer.eval_max_batches",
          "trainer.device", "resume"]
# a message about one of these fields may name the other (e.g. n_heads must divide d_model)
RELATED = {"model.d_model": ("model.n_heads",), "model.n_heads": ("model.d_model",),
           "model.n_layers": ("model.gate_layers", "model.gate_kind"), "data.seq_len": ("data.batch_size",),
           "data.train_limit": ("data.batch_size",), "data.train_limit_tokens": ("data.batch_size",),
           "data.val_size": ("data.batch_size",), "data.score_len": ("data.batch_size",)}

config_values = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 50), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
    st.text(max_size=8), st.sampled_from(["${nope}", "${model.d_model}", "all", "3-6", "2-1", "paper", "skip",
                                          "bf16", "auto", "sdu_tanh", "attn", "5-7"]),
    st.lists(st.one_of(st.integers(-2, 8), st.sampled_from(GATE_KINDS), st.none()), max_size=4),
    st.dictionaries(st.sampled_from(["a", "b"]), st.integers(), max_size=2),
)


@pytest.fixture(scope="module")
def bases():
    return {k: compose(v) for k, v in BASES.items()}


def test_bases_are_valid(bases):
    for cfg in bases.values():
        validate(cfg)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=st.sampled_from(sorted(BASES)), changes=st.lists(st.tuples(st.sampled_from(FIELDS), config_values),
                                                               min_size=1, max_size=2))
def test_validator_gives_only_clear_errors(bases, base, changes):
    cfg = copy.deepcopy(bases[base])
    with open_dict(cfg):
        for field, value in changes:
            try:
                OmegaConf.update(cfg, field, value, merge=False, force_add=True)
            except OmegaConfBaseException:  # a value OmegaConf refuses to hold (e.g. "${"): Hydra rejects it too
                assume(False)
    try:
        validate(cfg)
        outcome = None
    except ConfigError as e:
        msg = str(e)
        assert msg and "\n" not in msg, repr(msg)
        names = [f for field, _ in changes for f in (field, *RELATED.get(field, ()))]
        assert any(n in msg for n in names), (msg, changes)
        outcome = msg
    # deterministic: the same config gives the same verdict
    try:
        validate(cfg)
        again = None
    except ConfigError as e:
        again = str(e)
    assert again == outcome


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(d_model=st.integers(1, 64), n_heads=st.integers(1, 16), depth=st.integers(1, 30), batch=st.integers(1, 600))
def test_validator_accepts_exactly_the_valid_values(bases, d_model, n_heads, depth, batch):
    lm = copy.deepcopy(bases["transformer_lm"])
    lm.model.d_model, lm.model.n_heads = d_model, n_heads
    if d_model % n_heads:
        with pytest.raises(ConfigError, match=rf"^model.n_heads={n_heads} does not divide model.d_model={d_model} "):
            validate(lm)
    elif d_model % 2:  # pos=sinusoidal (the base) needs an even width
        with pytest.raises(ConfigError, match=rf"^model.d_model={d_model} is not allowed with model.pos='sinusoidal'"):
            validate(lm)
    else:
        validate(lm)
    mlp = copy.deepcopy(bases["mlp"])
    mlp.model.depth, mlp.data.batch_size = depth, batch  # smoke: data.train_limit=400
    if depth < 2:  # 1 plain input layer + depth - 1 layers of the kind
        with pytest.raises(ConfigError, match=rf"^model.depth={depth} is not allowed \(valid: an integer >= 2"):
            validate(mlp)
    elif batch > 400:
        with pytest.raises(ConfigError, match=rf"^data.batch_size={batch} is larger than the training data .*"
                                              r"valid: 1\.\.400\)$"):
            validate(mlp)
    else:
        validate(mlp)
