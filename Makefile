# kinesis-exactly-once: `make setup` once (or let any target do it), then `make test`.
# Needs python3 (>= 3.11), Node.js (>= 18, with npm) and Java 17 (a JDK: Spark, DynamoDB Local).
# No AWS account.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:
MAKEFLAGS += --no-builtin-rules

PYTHON    ?= python3
VENV      := .venv
BIN       := $(VENV)/bin
STATE_DIR ?= .keo
# extra arguments, e.g. `make test PYTEST_ARGS='-m "not spark" -x'`
PYTEST_ARGS ?=
# the soak: `make soak SEEDS=1,2,3 MESSAGES=3000` (each seed's failures replay exactly)
SEEDS    ?= 1,2,3
MESSAGES ?= 400
CHUNK    ?= 40

# The stamps make setup incremental: pip runs again only when pyproject.toml changed, npm only
# when the lockfile did. `npm ci` empties node_modules first, so its stamp is written last.
VENV_STAMP := $(VENV)/.installed
# Spark 3.5's venv, for the tests that must hold there too (`make test-spark35`)
VENV35       := .venv-spark35
VENV35_STAMP := $(VENV35)/.installed
NODE_STAMP := node_modules/.installed

.PHONY: help setup venv venv-spark35 node_modules test test-spark35 lint settings-doc demo demo-relay bench bench-compare soak emulators-up \
	emulators-down emulators-status clean distclean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) \
		| awk 'BEGIN {FS = ":.*## "}; {printf "  make %-17s %s\n", $$1, $$2}'

setup: venv node_modules ## install everything (Python venv and the npm emulators)

venv: $(VENV_STAMP) ## the Python virtualenv in .venv, with test, lint, spark and connect extras

$(VENV_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[test,lint,spark,connect]'
	touch $@

venv-spark35: $(VENV35_STAMP) ## a second virtualenv, .venv-spark35: pyspark 3.5 with the test and spark extras

$(VENV35_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV35)
	$(VENV35)/bin/pip install --quiet -e '.[test,spark]' 'pyspark>=3.5,<3.6'
	touch $@

node_modules: $(NODE_STAMP) ## the emulators (kinesalite, dynalite, DynamoDB Local, kinesis-local), from package-lock.json

$(NODE_STAMP): package-lock.json package.json
	@command -v npm >/dev/null || { echo "npm not found: install Node.js 20 (with npm)" >&2; exit 1; }
	npm ci --no-audit --no-fund
	touch $@

test: setup ## run every test (starts and stops its own emulators)
	$(BIN)/pytest $(PYTEST_ARGS)

test-spark35: venv-spark35 node_modules ## the Spark tests that must hold on Spark 3.5 (marked spark35), on pyspark 3.5
	$(VENV35)/bin/pytest -m spark35 $(PYTEST_ARGS)

lint: setup ## ruff check, ruff format --check, mypy --strict
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

settings-doc: setup ## regenerate docs/settings.md from the settings classes' fields
	$(BIN)/python -m devstack.settings_doc --write

demo: setup ## the end-to-end demo on the local stack
	$(BIN)/keo demo

demo-relay: setup ## the relay demo: stream A into stream B through Spark, under faults, B audited
	$(BIN)/keo demo --relay

bench: setup ## keo bench: the producer, then the Spark data source; figures go to files
	$(BIN)/keo bench

bench-compare: setup ## this tree's producer against BEFORE=<rev>'s, alternating on one stack (DEDUPE=key|replay)
	@if [ -z '$(BEFORE)' ]; then echo "usage: make bench-compare BEFORE=<git revision> [DEDUPE=replay]" >&2; exit 2; fi
	$(BIN)/python -m devstack.compare --before '$(BEFORE)' --state-dir $(STATE_DIR) --dedupe '$(or $(DEDUPE),key)'

soak: setup ## a seeded mix of every fault, then the audit (SEEDS=1,2,3 MESSAGES=400 CHUNK=40)
	SOAK_SEEDS='$(SEEDS)' SOAK_MESSAGES='$(MESSAGES)' SOAK_CHUNK='$(CHUNK)' $(BIN)/pytest tests/integration/test_soak.py -v $(PYTEST_ARGS)

emulators-up: setup ## start the local stack; then `source .keo/endpoints.env`
	$(BIN)/keo emulators up --state-dir $(STATE_DIR)

emulators-down: ## stop the local stack
	@if [ -x $(BIN)/keo ]; then $(BIN)/keo emulators down --state-dir $(STATE_DIR); fi

emulators-status: ## show the local stack; fails if something is down
	$(BIN)/keo emulators status --state-dir $(STATE_DIR)

clean: emulators-down ## stop the emulators, remove their data and every cache
	rm -rf $(STATE_DIR) .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist \
		spark-warehouse metastore_db derby.log
	find . -path ./$(VENV) -prune -o -path ./node_modules -prune -o \
		-name __pycache__ -type d -exec rm -rf {} +

distclean: clean ## clean, and remove .venv and node_modules too
	rm -rf $(VENV) $(VENV35) node_modules
