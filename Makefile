# edgemon — the two commands of the quick start are `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed

.PHONY: test test-fleet lint typecheck unit demo bench bench-fleet clean

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

# The fleet end-to-end test (tests/test_e2e_fleet.py: 3 boxes and a central store, 16 real
# processes, about a minute) runs in its own target; .ci/run runs both.
FLEET_TEST = tests/test_e2e_fleet.py

unit: $(STAMP)
	$(BIN)/pytest --cov --cov-report=term --ignore=$(FLEET_TEST)

test-fleet: $(STAMP)
	$(BIN)/pytest $(FLEET_TEST) -p no:cacheprovider

test: lint typecheck unit

# The showcase: broker, simulated devices, the daemon and a live view in one process
# (the dev extra includes the embedded broker). `make demo DEMO_ARGS="--duration 60"`.
demo: $(STAMP)
	$(BIN)/edgemon demo $(DEMO_ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/engine.py

# Series per box, remote-write bytes per box, central store per 1,000 boxes (docs/fleet.md).
bench-fleet: $(STAMP)
	$(BIN)/python benchmarks/fleet_cost.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .coverage build *.egg-info
