# memlib: the two quick-start commands are `make demo` and `make test`.
# Both bootstrap the environment first (Debian 12, as root): graph-tool from apt,
# a venv that can see it, and the pinned Python dependencies.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.memlib-installed
INPUT ?= memlib/data/sample_conversations.jsonl
FORMAT ?=
STORE ?= demo-store
export RAY_AUTH_MODE ?= disabled
export RAY_USAGE_STATS_ENABLED ?= 0
export HF_HUB_OFFLINE ?= 1

.PHONY: setup demo lint test test-fast test-all bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@bash cluster/bootstrap.sh
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/memlib build --input $(INPUT) $(if $(FORMAT),--format $(FORMAT)) --out $(STORE)
	$(VENV)/bin/memlib demo-report --store $(STORE) --input $(INPUT) $(if $(FORMAT),--format $(FORMAT))

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: $(STAMP)
	$(VENV)/bin/memlib check-env
	$(PY) -m pytest -q -ra

# the quick loop while editing: no test that starts Ray (`ray`) or takes seconds to minutes (`heavy`)
test-fast: $(STAMP)
	$(PY) -m pytest -q -ra -m "not ray and not heavy and not slow and not integration and not llm_model"

test-all: $(STAMP)
	$(PY) -m pytest -q -ra -m ""

clean:
	rm -rf $(STORE) .pytest_cache
