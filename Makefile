# edgemon — the two commands of the quick start are `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed

.PHONY: test lint typecheck unit demo bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check edgemon tests benchmarks dashboards
	$(BIN)/ruff format --check edgemon tests benchmarks dashboards
	$(BIN)/python dashboards/generate.py --check

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest --cov --cov-report=term

test: lint typecheck unit

# The showcase: broker, simulated devices, the daemon and a live view in one process
# (the dev extra includes the embedded broker). `make demo DEMO_ARGS="--duration 60"`.
demo: $(STAMP)
	$(BIN)/edgemon demo $(DEMO_ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/engine.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .coverage build *.egg-info
