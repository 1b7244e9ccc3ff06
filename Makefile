# highway-repro: `make help` lists every target.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SCALE ?= cpu
JOBS ?= 1
TABLE ?=
# torch is pinned: on the reference machine this is a local CPU wheel; set TORCH_SPEC for CUDA builds.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help setup test test-all demo bench bench-compile tables reproduce-table reproduce-all \
	reproduce-hn-fig1 reproduce-hn-table1 reproduce-hn-cifar reproduce-hn-analysis \
	reproduce-ht-char-ptb reproduce-ht-word-ptb reproduce-ht-char-ptb-rt reproduce-ht-word-ptb-l3 \
	reproduce-ht-enwik8-l6 reproduce-ht-enwik8-l12 readme clean

help: ## list every target with one line each
	@grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-26s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[test]"
	touch $@

setup: $(VENV)/.installed ## create .venv and install the package (torch pinned to a CPU wheel here)

test: setup ## fast test suite (pytest -m "not slow"; set HIGHWAY_DATA_MIRROR for the data tests)
	$(BIN)/python -m pytest -m "not slow" -q $(PYTEST_ARGS)

test-all: setup ## every test, slow ones included
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

demo: setup ## plain vs highway MLP at depths 10 and 50 on real MNIST: prints a table, writes runs/demo_results/
	$(BIN)/python -m highway_repro.reproduce demo --scale cpu --fresh --results runs/demo_results

reproduce-table: setup ## run one table's sweep and report: make reproduce-table TABLE=hn_table1 SCALE=cpu
	@test -n "$(TABLE)" || { echo "set TABLE=<name> (see: $(BIN)/python -m highway_repro.reproduce --help)"; exit 2; }
	$(BIN)/python -m highway_repro.reproduce $(TABLE) --scale $(SCALE) --jobs $(JOBS)

reproduce-hn-fig1: setup ## Highway Networks Fig. 1: FC depth sweep, plain/highway/residual, random search
	$(BIN)/python -m highway_repro.reproduce hn_fig1 --scale $(SCALE) --jobs $(JOBS)
reproduce-hn-table1: setup ## Highway Networks Table 1: 10-layer conv net on MNIST, widths 16/32
	$(BIN)/python -m highway_repro.reproduce hn_table1 --scale $(SCALE) --jobs $(JOBS)
reproduce-hn-cifar: setup ## Highway Networks Tables 2/3: 19-layer net on CIFAR-10
	$(BIN)/python -m highway_repro.reproduce hn_cifar --scale $(SCALE) --jobs $(JOBS)
reproduce-hn-analysis: setup ## Highway Networks Figs. 2-4: gate heat maps, routing, lesioning
	$(BIN)/python -m highway_repro.reproduce hn_analysis --scale $(SCALE)
reproduce-ht-char-ptb: setup ## Highway Transformer: Transformer-L3 on char-PTB, gate kinds
	$(BIN)/python -m highway_repro.reproduce ht_char_ptb --scale $(SCALE) --jobs $(JOBS)
reproduce-ht-word-ptb: setup ## Highway Transformer: R-Transformer-L3 on word-PTB, gate kinds
	$(BIN)/python -m highway_repro.reproduce ht_word_ptb --scale $(SCALE) --jobs $(JOBS)
reproduce-ht-char-ptb-rt: setup ## Highway Transformer: R-Transformer-L3 on char-PTB
	$(BIN)/python -m highway_repro.reproduce ht_char_ptb_rt --scale $(SCALE) --jobs $(JOBS)
reproduce-ht-word-ptb-l3: setup ## Highway Transformer: Transformer-L3 on word-PTB
	$(BIN)/python -m highway_repro.reproduce ht_word_ptb_l3 --scale $(SCALE) --jobs $(JOBS)
reproduce-ht-enwik8-l6: setup ## Highway Transformer: 6-layer Transformer-XL on enwik8, kinds and placement
	$(BIN)/python -m highway_repro.reproduce ht_enwik8_l6 --scale $(SCALE) --jobs $(JOBS)
reproduce-ht-enwik8-l12: setup ## Highway Transformer: 12-layer Transformer-XL on enwik8, placement
	$(BIN)/python -m highway_repro.reproduce ht_enwik8_l12 --scale $(SCALE) --jobs $(JOBS)

reproduce-all: setup ## every table at SCALE (cpu: a few hours on 2 cores)
	@for t in hn_fig1 hn_table1 hn_cifar hn_analysis ht_char_ptb ht_word_ptb ht_char_ptb_rt ht_word_ptb_l3 ht_enwik8_l6 ht_enwik8_l12; do \
		$(BIN)/python -m highway_repro.reproduce $$t --scale $(SCALE) --jobs $(JOBS) || exit $$?; done

tables: setup ## rebuild every report from finished runs (no training)
	@for t in hn_fig1 hn_table1 hn_cifar hn_analysis ht_char_ptb ht_word_ptb ht_char_ptb_rt ht_word_ptb_l3 ht_enwik8_l6 ht_enwik8_l12; do \
		test -d runs/sweeps/$$t-$(SCALE) && $(BIN)/python -m highway_repro.reproduce $$t --scale $(SCALE) --report-only; done; true

readme: ## copy the tables of results/ into README.md
	$(PYTHON) scripts/update_readme.py

# HF transformers 4.36.2 (the last with Transformer-XL) pins clash with this project's: its own venv
HF_VENV ?= .venv-bench-hf
$(HF_VENV)/.installed:
	$(PYTHON) -m venv $(HF_VENV)
	$(HF_VENV)/bin/pip install -q "$(TORCH_SPEC)" "transformers==4.36.2" "numpy<2"
	touch $@

bench: setup $(HF_VENV)/.installed ## speed benchmarks vs x-transformers and HF Transformer-XL (results/bench.md, < 15 min)
	$(BIN)/python -c "import x_transformers" 2>/dev/null || $(BIN)/pip install -q -e ".[bench]"
	$(BIN)/python -m highway_repro.bench --out results/bench --hf-python $(HF_VENV)/bin/python

bench-compile: setup ## eager vs torch.compile for the benchmark models (results/bench_compile.md, about 10 min, 1 thread)
	$(BIN)/python -c "import x_transformers" 2>/dev/null || $(BIN)/pip install -q -e ".[bench]"
	$(BIN)/python -m highway_repro.bench --sections "" --compile --compile-rounds 9 --threads 1 --clock cpu \
		--out results/bench_compile

# one GPU, no network: carry data/gpu_mirror and .gpu_deps (made here by `python scripts/gpu_check.py --prepare`)
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
GPU_CHECK_ARGS ?=
.PHONY: gpu-check
gpu-check: ## one GPU, < 8 min: speed, MFU, memory, bf16, nccl, NaN policy, enwik8 curve (results/gpu_check.md); DRY=1: CPU, tiny
	$(GPU_PYTHON) scripts/gpu_check.py $(if $(DRY),--dry-run) $(GPU_CHECK_ARGS)

clean: ## remove run folders (not results/)
	rm -rf runs multirun outputs
