# Set-up, main job and tests. `make demo` and `make test` each do all the set-up they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The torch pin, in one place: torch is installed first from it, and every later install runs
# under it (PIP_CONSTRAINT), so resolving the extras cannot pull another (CUDA) build.
# Another torch: make CONSTRAINTS=path/to/constraints.txt
CONSTRAINTS ?= .ci/constraints.txt
LINT_PATHS := dataflow server client bench tests examples .ci

.PHONY: setup demo-setup demo peers test lint ruff typecheck clean

# `make demo` installs only what the demo runs (the package, torch, the bench's matplotlib and
# pillow); `make setup` (for the tests) adds the dev tools: lightning, accelerate, datasets, moto, mypy...
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

# The bench's peer loaders (MosaicML Streaming, LitData, Ray Data), never in $(VENV): they pin
# older releases of packages $(VENV) holds (streaming: transformers<5, so huggingface-hub<1.0,
# which breaks `datasets`; numpy<2.2). $(PEERS_VENV) sees $(VENV)'s packages (torch, the
# editable dataflow) behind its own, as a --system-site-packages venv sees the system's: pip
# writes only into $(PEERS_VENV) (an older release there shadows $(VENV)'s; pip's note that
# `datasets` then conflicts is about $(VENV)'s copy, which the bench does not import), and
# under the torch pin never pulls another torch. Streaming and LitData need a torchvision
# built for this torch: PyPI's is built for a CUDA torch, so for a CPU torch name the index
# torch came from (over an existing $(PEERS_VENV): rm -r it first):
# make peers TORCH_INDEX=https://download.pytorch.org/whl/cpu
# Then: $(PEERS_VENV)/bin/python -m dataflow.bench run --loaders dataflow,torch,litdata ...
PEERS_VENV := .venv-peers
PEERS := mosaicml-streaming litdata ray[data]
TORCH_INDEX ?=
PURELIB := -c "import sysconfig; print(sysconfig.get_path('purelib'))"
PEERS_PIP := PIP_CONSTRAINT="$(abspath $(CONSTRAINTS))" $(PEERS_VENV)/bin/python -m pip install -q

peers: $(PEERS_VENV)/.installed

$(PEERS_VENV)/.installed: $(VENV)/.demo-installed Makefile $(CONSTRAINTS)
	test -d $(PEERS_VENV) || $(BIN)/python -m venv $(PEERS_VENV)
	echo "import site; site.addsitedir('$$($(BIN)/python $(PURELIB))')" \
		> "$$($(PEERS_VENV)/bin/python $(PURELIB))/dataflow-main-venv.pth"
	$(if $(TORCH_INDEX),$(PEERS_PIP) --index-url '$(TORCH_INDEX)' -U torchvision)
	$(PEERS_PIP) $(foreach p,$(PEERS),'$(p)')
	touch $@

test: lint
	$(BIN)/python -m pytest tests -q -p no:cacheprovider

lint: ruff typecheck

ruff: setup
	$(BIN)/ruff check $(LINT_PATHS)

# mypy over the package as installed (server/ as dataflow.server, ...): see .ci/typecheck.py.
typecheck: setup
	$(BIN)/python .ci/typecheck.py

clean:
	rm -rf $(VENV) $(PEERS_VENV) bench-out build *.egg-info
