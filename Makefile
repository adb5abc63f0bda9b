# `make demo` and `make test` set up .venv on first use (torch pinned by constraints.txt).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow test-fast lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/trainwise demo

# `make test` runs every test not marked slow; `make test-slow` runs the others (kills, signals, 2-process runs,
# whole-ecosystem resumes). CI (.ci/run) runs both, so every test runs there.
# PYTHONFAULTHANDLER: spawned and torchrun processes inherit it, so a fatal signal (a gloo abort) prints their stacks
test: $(STAMP)
	$(BIN)/python -m ruff check .
	$(BIN)/trainwise doctor src examples benchmarks
	PYTHONFAULTHANDLER=1 $(BIN)/python -m pytest -q -m "not slow"

test-slow: $(STAMP)
	PYTHONFAULTHANDLER=1 $(BIN)/python -m pytest -q -m slow

test-fast: $(STAMP)  # the inner loop: make test's tests without ruff and the doctor
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
