# The two commands a newcomer needs:
#   make up    build and run the reference gateway (embedded SQLite store)
#   make test  install what is missing, build once, run every test and linter
SHELL := /bin/bash
CARGO ?= cargo
RUN_DIR ?= .run
LISTEN ?= 127.0.0.1:17670

.PHONY: up test setup build lint check-modules test-rust bench clean-run

REPLICAS ?= 3
# `make up CONFIG_DELIVERY_MODE=push` runs the replicas in push mode.
CONFIG_DELIVERY_MODE ?=

up: build
	@mkdir -p $(RUN_DIR)
	./target/debug/openshell-gateway up --replicas $(REPLICAS) --listen $(LISTEN) --data-dir $(RUN_DIR)/data \
		$(if $(CONFIG_DELIVERY_MODE),--config-delivery-mode $(CONFIG_DELIVERY_MODE))

test: setup build lint check-modules check-generated lint-python test-rust test-python conformance check-docs check-wheel

setup:
	@bash scripts/setup.sh

build:
	$(CARGO) build --workspace --bins

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# No crate's modules import each other in a circle (tools/modcheck).
check-modules:
	$(CARGO) run -q -p openshell-modcheck

test-rust: build
	$(CARGO) test --workspace -- --test-threads=2

# ---------------------------------------------------------------- generator,
# Python SDK, conformance. Python tools live in the project venv (.venv),
# made by scripts/setup.sh; the extension shares the one cargo target dir.
VENV ?= $(CURDIR)/.venv
PYTHON := $(VENV)/bin/python
# The one cargo target dir (CARGO_TARGET_DIR when set, as cargo itself does).
TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)

.PHONY: generate check-generated python lint-python test-python conformance check-docs check-wheel

# Regenerates every generated file from proto/ (method table, Python message
# modules and typed raw stubs, docs/PARITY.md).
generate: setup
	$(CARGO) run -q -p sdkgen -- --python $(PYTHON)

# Fails when a generated file differs from what `make generate` would write.
check-generated: setup
	$(CARGO) run -q -p sdkgen -- --check --python $(PYTHON)

# Builds the extension module into the venv (debug, editable install).
python: setup
	cd sdk-python && VIRTUAL_ENV=$(VENV) CARGO_TARGET_DIR=$(TARGET_DIR) \
		$(VENV)/bin/maturin develop -q

lint-python: setup
	cd sdk-python && $(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy
	cd conformance && $(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
	cd docs-check && $(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

test-python: build python
	cd sdk-python && $(PYTHON) -m pytest -q

# The judge's own tests first (no cluster), then every runner on a cluster.
conformance: build python
	$(PYTHON) conformance/harness --self-test
	$(PYTHON) conformance/harness

# Docs that run: every code block of the READMEs (docs-check/check_docs.py).
# rust blocks are compiled as binaries of a scratch crate in the target dir and
# run, python blocks run with the venv, sh commands run, against a 3-replica
# cluster the check starts on loopback (127.0.0.1:17670 when free).
check-docs: build python
	$(PYTHON) docs-check/check_docs.py

# `pip install ./sdk-python` into a clean venv (PEP 517 abi3 wheel, release).
check-wheel:
	bash scripts/check-wheel.sh

# `make bench BENCH=config` (or sdk, routing, all) runs another benchmark.
BENCH ?= gateway

bench:
	$(CARGO) build --release --workspace --bins
	OPENSHELL_BIN_DIR=$(CURDIR)/target/release ./target/release/openshell-bench $(BENCH)

clean-run:
	rm -rf $(RUN_DIR)
