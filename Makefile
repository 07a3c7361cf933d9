# `make test` and `make serve` are the two commands README promises on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: setup test test-fast serve

$(BIN)/activate:
	$(PY) -m venv $(VENV)

setup: $(BIN)/activate
	$(BIN)/pip install -qq --upgrade pip
	$(BIN)/pip install -qq -c constraints-cpu.txt torch==2.13.0
	$(BIN)/pip install -qq -c constraints-cpu.txt -e '.[test]'

test: setup
	$(BIN)/python -m pytest -q -ra $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest -q -ra -m "not slow" $(PYTEST_ARGS)

serve: setup
	$(BIN)/kvserve serve
