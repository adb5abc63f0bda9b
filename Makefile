# `make demo` and `make test` set up .venv on first use (torch pinned by constraints.txt).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/trainwise demo

# PYTHONFAULTHANDLER: spawned and torchrun processes inherit it, so a fatal signal (a gloo abort) prints their stacks
test: $(STAMP)
	$(BIN)/python -m ruff check .
	$(BIN)/trainwise doctor src examples benchmarks
	PYTHONFAULTHANDLER=1 $(BIN)/python -m pytest -q

test-fast: $(STAMP)  # the inner loop: every test but those marked slow (CI runs them all with make test)
	$(BIN)/python -m pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/python -m ruff check .

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/startup.py
	$(BIN)/python benchmarks/step_work.py
	$(BIN)/python benchmarks/epoch_end.py
	$(BIN)/python benchmarks/trainer_costs.py
	$(BIN)/python benchmarks/run_overhead.py

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
