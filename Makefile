# Set-up, main job and tests. `make demo` and `make test` each do all the set-up they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch first, pinned, so that no install step pulls another (CUDA) build from the registry.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup demo test lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[client,bench,dev]"
	touch $@

demo: setup
	$(BIN)/python -m dataflow.bench demo --out bench-out

test: setup
	$(BIN)/python -m pytest tests -q -p no:cacheprovider

lint: setup
	$(BIN)/ruff check dataflow server client bench tests

clean:
	rm -rf $(VENV) bench-out build *.egg-info
