# trilm — set-up and the main jobs. `make quickstart` and `make test` work on a fresh machine.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
RUN_DIR ?= runs/quickstart
PYTEST_ARGS ?=

.PHONY: install quickstart test test-gpu lint format clean

install: $(STAMP)

# torch goes first and alone: `torch==2.13.0` resolves to the CPU wheel on a machine without a GPU
# (and to the CUDA build elsewhere); DeepSpeed builds against that torch, hence --no-build-isolation.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip setuptools wheel
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q --no-build-isolation -e '.[dev]'
	touch $(STAMP)

quickstart: install
	$(BIN)/trilm quickstart --run-dir $(RUN_DIR)

test: install
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-gpu: install
	$(BIN)/python -m pytest -q -m gpu $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache runs
