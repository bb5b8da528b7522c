# FastServe developer entry points. `make serve` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch; on a CUDA machine install the matching CUDA build first.
TORCH_SPEC ?= torch==2.13.0

.PHONY: install proto model tools serve test lint bench-engine bench-overhead bench-kvstore clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev,plot]"
	touch $@

# Python modules generated from protos/ (never edited by hand, not committed). The package
# build (setup.py) generates them too, so `pip install .` needs no make; this regenerates them
# in the checkout after a .proto changes.
proto: install
	$(PY) -m fastserve.proto.build

# Downloads and converts the default model once; later runs find it cached.
model: install
	$(PY) -m fastserve.cli model pull

# Worker + scheduler on this machine with the default model; Ctrl-C stops both.
serve: proto model
	$(VENV)/bin/fastserve serve

# helm, kubectl, promtool (deploy/tools.sh) and a real kube-apiserver with etcd
# (deploy/kube-apiserver.sh: built from Debian's source once, 4-13 minutes, then cached) for
# the deployment tests. Without them (no npm, not root) those tests skip and say why.
tools:
	-./deploy/tools.sh
	-./deploy/kube-apiserver.sh

test: proto model tools
	$(PY) -m pytest -q

# ruff over the project (rules in pyproject.toml), mypy --strict on scheduler_svc/core
# ([tool.mypy] files).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

bench-engine: proto model
	$(VENV)/bin/fastserve bench engine --repeats 2 --json docs/bench-engine.json

bench-overhead: proto model
	$(VENV)/bin/fastserve bench overhead --json docs/bench-overhead.json

bench-kvstore: proto
	$(VENV)/bin/fastserve bench kvstore --json docs/bench-kvstore.json

clean:
	rm -rf $(VENV) fastserve/proto/fastserve
