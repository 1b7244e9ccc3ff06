# highway-repro: `make help` lists every target.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SCALE ?= cpu
JOBS ?= 1
GROUP ?=
TABLE ?=
# torch is pinned: on the reference machine this is a local CPU wheel; set TORCH_SPEC for CUDA builds.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=
# Hydra overrides for every run of a table (ARGS="trainer.max_steps=10"); CLUSTER=slurm PARTITION=<p>: runs as
# SLURM jobs (PRESET=cpu|gpu, JOBS = jobs in flight)
ARGS ?=
CLUSTER ?=
PARTITION ?=
PRESET ?= cpu
RUNNER_ARGS = $(if $(CLUSTER),--cluster $(CLUSTER) --preset $(PRESET)) $(if $(PARTITION),--partition $(PARTITION)) $(ARGS)

.DEFAULT_GOAL := help
.PHONY: help setup test lint test-slow slurm-deps test-all demo bench bench-grouped bench-cpu-scale bench-precision bench-compile tables reproduce-table reproduce-all estimate-all parity readme clean wandb-export wandb-dashboards
# (not the reproduce-<table> names: make skips pattern rules for .PHONY targets)

help: ## list every target with one line each (the paper tables: reproduce-<table>, from highway_repro/targets.py)
	@grep -E '^[a-zA-Z0-9_%-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-26s %s\n", $$1, $$2}'
	@python3 -c "import sys; sys.path.insert(0, '.'); from highway_repro.targets import TARGETS, make_target; \
	[print(f'  {make_target(n):<26} {t.help}') for n, t in TARGETS.items() if n != 'demo']"

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[test]"
	touch $@

setup: $(VENV)/.installed ## create .venv and install the package (torch pinned to a CPU wheel here)

test: setup ## fast test suite (pytest -m "not slow", on every core: pytest-xdist; set HIGHWAY_DATA_MIRROR for the data tests)
	$(BIN)/python -m pytest -m "not slow" -q -n auto $(PYTEST_ARGS)

lint: setup ## ruff (unused imports and names, undefined names, lines over 120), import-linter (the import layers: pyproject.toml), the length rules (scripts/check_lengths.py)
	$(BIN)/ruff check highway_repro scripts bench hydra_plugins tests
	$(BIN)/lint-imports
	$(BIN)/python scripts/check_lengths.py

test-slow: setup ## the slow tests only (pytest -m slow: subprocess, two-process, kill -9, compile and dry-run tests)
	$(BIN)/python -m pytest -m slow -q $(PYTEST_ARGS)

slurm-deps: ## Debian's slurm-wlm and munge, where missing (root; for the real-SLURM slow test, tests/test_cluster.py)
	@command -v slurmctld >/dev/null && command -v munged >/dev/null || \
		{ apt-get install -y -q slurm-wlm munge >/dev/null || { apt-get update -q >/dev/null && \
		apt-get install -y -q slurm-wlm munge >/dev/null; }; }

test-all: setup ## every test, slow ones included
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

demo: setup ## plain vs highway MLP at depths 10 and 50 on real MNIST: prints a table, writes runs/demo_results/
	$(BIN)/python -m highway_repro.runner demo --scale cpu --fresh --results runs/demo_results

reproduce-table: setup ## run one table's sweep and report: make reproduce-table TABLE=hn_table1 SCALE=cpu
	@test -n "$(TABLE)" || { echo "set TABLE=<name> (see: $(BIN)/python -m highway_repro.runner --list)"; exit 2; }
	$(BIN)/python -m highway_repro.runner $(TABLE) --scale $(SCALE) --jobs $(JOBS) $(if $(GROUP),--group $(GROUP)) $(RUNNER_ARGS)

# One rule for every table of highway_repro/targets.py: make reproduce-ht-char-ptb -> table ht_char_ptb.
reproduce-%: setup
	$(BIN)/python -m highway_repro.runner $(subst -,_,$*) --scale $(SCALE) --jobs $(JOBS) $(if $(GROUP),--group $(GROUP)) $(RUNNER_ARGS)

estimate-all: setup ## every paper table's plan and estimated cost, then the total, for JOBS jobs (default 1; JOBS=2 on 2 cores); trains nothing
	@$(BIN)/python -m highway_repro.runner --all --scale $(SCALE) --jobs $(JOBS) --estimate

estimate-%: setup ## print a table's plan and its estimated cost, train nothing: make estimate-ht-char-ptb JOBS=2
	@$(BIN)/python -m highway_repro.runner $(subst -,_,$*) --scale $(SCALE) --jobs $(JOBS) --estimate $(ARGS)

reproduce-all: setup ## every paper table at SCALE, JOBS runs at once (default 1; give JOBS=2 on a 2-core machine)
	$(BIN)/python -m highway_repro.runner --all --scale $(SCALE) --jobs $(JOBS) $(RUNNER_ARGS)

tables: setup ## rebuild every report and results/summary.csv from the kept runs in results/ (no training); fails on a damaged metrics.json unless ALLOW_DAMAGED=1
	$(BIN)/python -m highway_repro.runner --all --scale $(SCALE) --report-only $(if $(ALLOW_DAMAGED),--allow-damaged)

wandb-export: setup ## every kept run as an offline W&B run in runs/wandb_export/ (~1 min on 2 cores; then: wandb sync)
	$(BIN)/python -m highway_repro.dashboards export --jobs 2

wandb-dashboards: setup ## a W&B dashboard per table: published with WANDB_API_KEY + WANDB_ENTITY (pip install -e ".[wandb]"), else its JSON spec
	$(BIN)/python -m highway_repro.dashboards dashboards

# folder with checkouts transformer-xl/, Highway-Transformer/, R-transformer/ (empty: clone the pinned commits)
OFFICIAL_DIR ?=
parity: setup ## our models vs the official code, weights copied across (results/parity.md, ~1 min): OFFICIAL_DIR=<checkouts>
	$(BIN)/python scripts/parity.py $(if $(OFFICIAL_DIR),--official-dir "$(OFFICIAL_DIR)")

readme: setup ## the README's glance (one line per table, the claims picture) from results/summary.csv; the costs in docs/guide.md and docs/cluster.md from the runner's estimate
	$(BIN)/python scripts/update_readme.py

# HF transformers 4.36.2 (the last with Transformer-XL) pins clash with this project's: its own venv
HF_VENV ?= .venv-bench-hf
$(HF_VENV)/.installed:
	$(PYTHON) -m venv $(HF_VENV)
	$(HF_VENV)/bin/pip install -q "$(TORCH_SPEC)" "transformers==4.36.2" "numpy<2"
	touch $@

bench: setup $(HF_VENV)/.installed ## speed benchmarks vs x-transformers and HF Transformer-XL, fp32 vs bf16 (results/bench.md, < 20 min)
	$(BIN)/python -c "import x_transformers" 2>/dev/null || $(BIN)/pip install -q -e ".[bench]"
	$(BIN)/python -m bench --out results/bench --hf-python $(HF_VENV)/bin/python

bench-cpu-scale: setup ## Transformer-L3 at its cpu-scale size vs x-transformers, 1 thread (results/bench_cpu_scale.md, ~1 min)
	$(BIN)/python -c "import x_transformers" 2>/dev/null || $(BIN)/pip install -q -e ".[bench]"
	$(BIN)/python -m bench --sections xt_cpu --threads 1 --clock cpu --budget-min 4 --min-rounds 9 --out results/bench_cpu_scale

bench-precision: setup ## fp32 vs bf16 autocast at the cpu scale of Transformer-L3, Transformer-XL L6, R-Transformer, 1 thread, with the CPU's bf16 features (results/bench_precision.md, ~3 CPU-min; needs the data mirror)
	$(BIN)/python -m bench --sections precision --threads 1 --clock cpu --out results/bench_precision

bench-grouped: setup ## runs trained together vs one after another: Fig. 1's nets (26 runs), the cpu-scale language models (5 seeds); 1 thread (results/bench_grouped.md, ~6 min; needs the data mirror)
	$(BIN)/python -m bench --sections grouped --threads 1 --clock cpu --budget-min 4 --min-rounds 9 --out results/bench_grouped

bench-compile: setup ## eager vs torch.compile for the benchmark models (results/bench_compile.md, about 10 min, 1 thread)
	$(BIN)/python -c "import x_transformers" 2>/dev/null || $(BIN)/pip install -q -e ".[bench]"
	$(BIN)/python -m bench --sections "" --compile --compile-rounds 9 --threads 1 --clock cpu \
		--out results/bench_compile

# one GPU, no network: carry data/gpu_mirror, data/gpu_cache, .gpu_deps and .gpu_peers (made here by `python scripts/gpu_check.py --prepare`)
# the venv's Python where there is one (DRY=1: the one `setup` makes), else the machine's (GPU_PYTHON=... to choose)
GPU_PYTHON ?= $(if $(DRY)$(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
GPU_CHECK_ARGS ?=
.PHONY: gpu-check gpu-check-compiled paper-recipe
gpu-check: $(if $(DRY),setup) ## one GPU, < 8 min: speed, MFU, memory, bf16, nccl, NaN policy, enwik8 curve (results/gpu_check.md); DRY=1: CPU, tiny
	$(GPU_PYTHON) scripts/gpu_check.py $(if $(DRY),--dry-run) $(GPU_CHECK_ARGS)

gpu-check-compiled: $(if $(DRY),setup) ## one GPU, < 9 min: the language models eager vs compiled vs CUDA graphs (results/gpu_check_compiled.md)
	$(GPU_PYTHON) scripts/gpu_check.py $(if $(DRY),--dry-run) --compiled --skip nan,throughput,curve,ddp,tests,grouped,tables --budget-s 510 --out $(if $(DRY),runs/gpu_check_dry/gpu_check_compiled,results/gpu_check_compiled) $(GPU_CHECK_ARGS)

# char-PTB at the paper's full recipe, one command of < 10 min each (docs/gpu.md): PART=compare, then PART=run
# ROWS=<row> for baseline, sdu_tanh, sdu_sigmoid; the pack goes to $(OUT) (the GPU machine's folder that comes back),
# then here: make paper-recipe PART=unpack SRC=<folder> && make tables
PART ?= run
ROWS ?= baseline
PAPER_RECIPE_ARGS ?=
paper-recipe: $(if $(DRY),setup) ## one GPU, < 10 min: char-PTB at the paper's recipe (PART=compare|run ROWS=...; DRY=1)
	$(GPU_PYTHON) scripts/paper_recipe.py $(PART) $(SRC) --rows $(ROWS) $(if $(DRY),--dry-run) \
		$(if $(OUT),--out "$(OUT)") $(PAPER_RECIPE_ARGS)

clean: ## remove run folders (not results/)
	rm -rf runs multirun outputs
