# The two commands a newcomer needs:
#   make up    build and run the reference gateway (embedded SQLite store)
#   make test  install what is missing, build once, run every test and linter
SHELL := /bin/bash
CARGO ?= cargo
RUN_DIR ?= .run
LISTEN ?= 127.0.0.1:17670

.PHONY: up test setup build lint test-rust bench clean-run

REPLICAS ?= 3

up: build
	@mkdir -p $(RUN_DIR)
	./target/debug/openshell-gateway up --replicas $(REPLICAS) --listen $(LISTEN) --data-dir $(RUN_DIR)/data

test: setup build lint test-rust

setup:
	@bash scripts/setup.sh

build:
	$(CARGO) build --workspace --bins

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test-rust: build
	$(CARGO) test --workspace -- --test-threads=2

bench:
	$(CARGO) build --release --workspace --bins
	OPENSHELL_BIN_DIR=$(CURDIR)/target/release ./target/release/openshell-bench gateway

clean-run:
	rm -rf $(RUN_DIR)
