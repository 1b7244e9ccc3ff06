"""Speed benchmarks: `make bench` = `python -m bench --out results/bench`, run from the repository root.

Development tooling, not part of the installed package (`highway_repro`): it needs the `bench` extra
(`pip install -e ".[bench]"`, x-transformers) and imports the package, never the other way round.
The FLOP counter it uses lives in the package (`highway_repro/engine/flops.py`): the trainer logs
MFU with the same counts.

Sections (one file each in bench/sections/; each writes a part of results/bench.md and rows of
results/bench.csv; the report itself is bench/report.py, the reference contenders bench/peers.py):

1. training throughput of our `transformer_lm` against x-transformers' TransformerWrapper(Decoder)
   at identical size (parameter counts printed), 3. its MFU against a large fp32 matmul;
1b. the same comparison at the cpu scale of the tables (d 128, batch 16 x 160), one thread;
4. our Transformer-XL against HF transformers 4.36.2 TransfoXLLMHeadModel (a worker process
   in its own venv, `.venv-bench-hf`), and its MFU;
2. the cost of each gate kind (step time gated / baseline next to the FLOP ratio) for
   transformer_lm, r_transformer and transformer_xl;
5. Highway MLP (depth 100) and conv nets, plain vs highway;
6. enwik8-prefix preparation MB/s and start-up time with a warm cache;
7. peak memory of training steps (fresh process per case);
P. fp32 against bf16 autocast at the cpu scale of the tables (Transformer-L3, Transformer-XL L6,
   R-Transformer; real data of the mirror), step time and loss after a fixed number of steps, with the
   CPU's bf16 features (recorded, not adopted);
C. with `--compile`: eager vs torch.compile.

Method: contenders of one comparison are built in one process and timed in rounds, one step
each per round, order alternating (`timing.interleaved`); figures are medians over rounds,
ratios medians of per-round ratios. Rounds are bounded by a wall-clock budget (`--budget-min`).
Benchmarks are never part of the test suite.
"""
