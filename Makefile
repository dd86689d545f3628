# trilm — set-up and the main jobs. `make quickstart` and `make test` work on a fresh machine.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
RUN_DIR ?= runs/quickstart
PYTEST_ARGS ?=
TEST_WORKERS ?= 2

.PHONY: install quickstart test test-portability test-gpu typecheck lint format clean reference-data

install: $(STAMP)

# torch goes first and alone: `torch==2.13.0` resolves to the CPU wheel on a machine without a GPU
# (and to the CUDA build elsewhere); DeepSpeed builds against that torch, hence --no-build-isolation.
# On success the steps below are all it prints. setuptools announces every editable install with an
# "Editable installation." notice (a package-dir mapping selects its import-hook strategy); the filter
# drops that notice only, and pyproject declares the package data so that nothing else is warned about.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip setuptools wheel
	$(BIN)/pip install -q torch==2.13.0
	PYTHONWARNINGS='ignore:Editable installation' $(BIN)/pip install -q --no-build-isolation -e '.[dev]'
	touch $(STAMP)

quickstart: install
	$(BIN)/trilm quickstart --run-dir $(RUN_DIR)

# The 30 slowest tests close the report: CI's budget (about 20 minutes on 2 cores) is kept by trimming them.
# TEST_WORKERS processes (pytest-xdist) share the cores, one torch thread per core between them; a test file
# runs in one worker (its module fixtures are built once), and the cluster tests share one worker
# (tests/support/xdist_groups.py). TEST_WORKERS=0 runs everything in this process.
test: install
	$(BIN)/python -m pytest -q --durations=30 -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The suite under other CPU code paths: torch's own kernels at each instruction set (ATEN_CPU_CAPABILITY),
# with MKL (BLAS, LAPACK) and oneDNN capped to the same set, at 1 and 2 torch threads; avx512 only where
# the CPU has it. Each leg is a full `make test` run: a verdict must not depend on summation order.
PORTABILITY_CAPS    ?= default avx2 $(shell grep -qw avx512bw /proc/cpuinfo 2>/dev/null && echo avx512)
PORTABILITY_THREADS ?= 1 2
MKL_ISA_default := SSE4_2
MKL_ISA_avx2    := AVX2
MKL_ISA_avx512  := AVX512
DNNL_ISA_default := SSE41
DNNL_ISA_avx2    := AVX2
DNNL_ISA_avx512  := AVX512_CORE

test-portability: install
	@set -e; for cap in $(PORTABILITY_CAPS); do for threads in $(PORTABILITY_THREADS); do \
	    case $$cap in default) mkl=$(MKL_ISA_default) dnnl=$(DNNL_ISA_default) ;; \
	        avx2) mkl=$(MKL_ISA_avx2) dnnl=$(DNNL_ISA_avx2) ;; *) mkl=$(MKL_ISA_avx512) dnnl=$(DNNL_ISA_avx512) ;; esac; \
	    echo "== test-portability: ATEN_CPU_CAPABILITY=$$cap MKL_ENABLE_INSTRUCTIONS=$$mkl ONEDNN_MAX_CPU_ISA=$$dnnl, $$threads thread(s)"; \
	    ATEN_CPU_CAPABILITY=$$cap MKL_ENABLE_INSTRUCTIONS=$$mkl ONEDNN_MAX_CPU_ISA=$$dnnl TRILM_TEST_THREADS=$$threads \
	        $(BIN)/python -m pytest -q $(PYTEST_ARGS); \
	done; done

test-gpu: install
	$(BIN)/python -m pytest -q -m gpu $(PYTEST_ARGS)

# mypy over the layout a wheel installs (pyproject's [tool.mypy] says why a tree of links): trilm/ with
# kernels/ as trilm/kernels and configs/ as trilm/configs.
TYPECHECK_TREE := $(VENV)/typecheck
typecheck: install
	rm -rf $(TYPECHECK_TREE)/trilm && mkdir -p $(TYPECHECK_TREE)/trilm
	for f in trilm/*; do ln -s "$(CURDIR)/$$f" $(TYPECHECK_TREE)/trilm/; done
	ln -s "$(CURDIR)/kernels" $(TYPECHECK_TREE)/trilm/kernels
	ln -s "$(CURDIR)/configs" $(TYPECHECK_TREE)/trilm/configs
	cd $(TYPECHECK_TREE) && "$(CURDIR)/$(BIN)/mypy" --config-file "$(CURDIR)/pyproject.toml" \
	    --cache-dir "$(CURDIR)/$(TYPECHECK_TREE)/.mypy_cache" -p trilm

# Package data built from committed evidence: the CPU ladder's best-rate final losses
# (configs/reference/ladder-finals.json), which `trilm quickstart` compares its family order with; a wheel has
# no docs/, so they travel with trilm.configs. Rebuilt when the ladder's results table changes.
LADDER_FINALS := configs/reference/ladder-finals.json
reference-data: $(LADDER_FINALS)

$(LADDER_FINALS): docs/results/ladder/analysis/results.csv experiments/ladder/finals.py | $(STAMP)
	$(BIN)/python -m experiments.ladder.finals

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache runs
