"""The benchmark harness (`make bench`, top-level `bench/`): what it counts and how it compares, on tiny sizes.

The benchmarks themselves are not timed here (speed is measured by `make bench`, never by
tests); these tests check the counting and the bookkeeping the reported figures rest on.
"""

from __future__ import annotations

import torch

from bench import cases, timing

TINY_TXL = {"n_layers": 1, "d_model": 16, "n_heads": 2, "d_head": 8, "d_ff": 32, "tgt_len": 8, "mem_len": 8}


def test_txl_case_is_timed_and_counted_with_full_memory(monkeypatch):
    """The FLOP count must describe the steps that are timed: every one attends to mem_len + tgt_len keys.

    (The first segment of a fresh model has no memory; counting FLOPs on it understated the MFU.)
    """
    monkeypatch.setattr(cases, "TXL", TINY_TXL)
    monkeypatch.setattr(cases, "TXL_DATA", {"batch": 2, "vocab": 11})
    c = cases.build("txl-none")
    first, second = c.flops(), c.flops()
    assert first == second
    # the attention score matmuls see K = 16 keys: q k^T costs 2*B*H*Q*K*dh FLOPs forward
    B, H, Q, dh = 2, 2, 8, 8
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        c.loss(c.model)  # forward only (the training path: grad enabled)
    bmm = fc.get_flop_counts()["Global"][torch.ops.aten.bmm]  # the batched attention matmuls
    assert bmm == 3 * 2 * B * H * Q * (TINY_TXL["mem_len"] + Q) * dh  # AC, BD, probabilities @ values


def test_interleaved_alternates_order_and_ratio_is_per_round_median():
    calls = []
    secs = {"a": iter([1.0, 1.0, 2.0, 3.0, 4.0]), "b": iter([2.0, 2.0, 2.0, 9.0, 2.0])}

    def step(name):
        def run():
            calls.append(name)
            return next(secs[name])  # the step reports its own seconds (as the HF worker does)
        return run

    t = timing.interleaved({"a": step("a"), "b": step("b")}, warmup=1, min_rounds=4, max_rounds=4, budget_s=1e9)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a"]  # warm-up, then the order alternates
    assert t == {"a": [1.0, 2.0, 3.0, 4.0], "b": [2.0, 2.0, 9.0, 2.0]}
    assert timing.ratio(t, "a", "b") == 0.75  # median of 0.5, 1.0, 1/3, 2.0


def test_interleaved_budget_sets_rounds_within_bounds():
    t = timing.interleaved({"a": lambda: 10.0}, warmup=1, min_rounds=3, max_rounds=9, budget_s=35.0)
    assert len(t["a"]) == 3  # 35 s budget / 10 s per round
    t = timing.interleaved({"a": lambda: 10.0}, warmup=1, min_rounds=3, max_rounds=9, budget_s=1.0)
    assert len(t["a"]) == 2  # never fewer than floor_rounds, even when nothing fits


def test_median_ci_uses_the_exact_binomial_ranks():
    # textbook distribution-free 95% intervals of the median: n = 36 -> ranks 12 and 25, n = 9 -> 2 and 8
    assert timing.median_ci(range(1, 37)) == (12.0, 25.0)
    assert timing.median_ci([9, 1, 8, 2, 7, 3, 6, 4, 5]) == (2.0, 8.0)
    assert timing.median_ci(range(1, 7)) == (1.0, 6.0)  # n = 6: coverage 1 - 2/64 = 96.9%
    assert timing.median_ci([3.0, 1.0, 2.0, 4.0, 5.0]) is None  # n = 5: even min-max covers only 93.8%


def test_cpu_scale_xt_case_has_the_size_of_the_char_ptb_cpu_scale():
    """Section 1b measures the size the tables spend their hours on: the one in the scale file."""
    from pathlib import Path

    import yaml

    cfg = yaml.safe_load((Path(__file__).parents[1] / "configs/experiment_scale/ht_char_ptb/cpu.yaml").read_text())
    assert {k: cfg["model"][k] for k in ("d_model", "n_heads", "d_ff")} == {
        k: cases.TLM_CPU[k] for k in ("d_model", "n_heads", "d_ff")}
    assert (cfg["data"]["batch_size"], cfg["data"]["seq_len"]) == (cases.TLM_CPU_DATA["batch"],
                                                                    cases.TLM_CPU_DATA["seq"])
    c = cases.build("ours_tlm_xt_cpu")
    d, f, L, V, T = 128, 512, cases.TLM_CPU["n_layers"], cases.TLM_CPU_DATA["vocab"], cases.TLM_CPU_DATA["seq"]
    # no biases (LayerNorms included): tied embedding V*d, learned positions T*d, per layer 4d^2 attention +
    # 2df FFN + two LayerNorm weights, final LayerNorm weight
    assert c.params == V * d + T * d + L * (4 * d * d + 2 * d * f + 2 * d) + d
    assert c.items == 32 * 160


def test_cpu_bf16_features_come_from_the_cpu_flags(tmp_path, monkeypatch):
    """The precision section and the GPU check name the CPU's bf16 units as /proc/cpuinfo lists them."""
    from highway_repro.engine import loggers

    fake, real = tmp_path / "cpuinfo", loggers.Path
    monkeypatch.setattr(loggers, "Path", lambda p: real(fake) if str(p) == "/proc/cpuinfo" else real(p))
    fake.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16\n\nflags\t\t: fpu\n")
    assert loggers.cpu_bf16_features() == ["avx512_bf16", "amx_bf16"]  # the first processor's flags
    fake.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_vnni\n")
    assert loggers.cpu_bf16_features() == []
