# Set-up, main job and tests. `make demo` and `make test` each do all the set-up they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The torch pin, in one place: torch is installed first from it, and every later install runs
# under it (PIP_CONSTRAINT), so resolving the extras cannot pull another (CUDA) build.
# Another torch: make CONSTRAINTS=path/to/constraints.txt
CONSTRAINTS ?= .ci/constraints.txt
LINT_PATHS := dataflow server client bench tests examples .ci

.PHONY: setup demo-setup demo test lint ruff typecheck clean

# `make demo` installs only what the demo runs (the package, torch, the bench's matplotlib and
# pillow); `make setup` (for the tests) adds the dev tools: lightning, datasets, moto, mypy...
setup: $(VENV)/.installed
demo-setup: $(VENV)/.demo-installed

$(VENV)/.demo-installed: pyproject.toml Makefile $(CONSTRAINTS)
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	PIP_CONSTRAINT="$(abspath $(CONSTRAINTS))" $(BIN)/python -m pip install -q torch
	PIP_CONSTRAINT="$(abspath $(CONSTRAINTS))" $(BIN)/python -m pip install -q -e ".[client,bench]"
	touch $@

$(VENV)/.installed: $(VENV)/.demo-installed
	PIP_CONSTRAINT="$(abspath $(CONSTRAINTS))" $(BIN)/python -m pip install -q -e ".[client,bench,dev]"
	touch $@

demo: demo-setup
	$(BIN)/python -m dataflow.bench demo --out bench-out

test: lint
	$(BIN)/python -m pytest tests -q -p no:cacheprovider

lint: ruff typecheck

ruff: setup
	$(BIN)/ruff check $(LINT_PATHS)

# mypy over the package as installed (server/ as dataflow.server, ...): see .ci/typecheck.py.
typecheck: setup
	$(BIN)/python .ci/typecheck.py

clean:
	rm -rf $(VENV) bench-out build *.egg-info
