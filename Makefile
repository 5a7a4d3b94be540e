# The two commands a newcomer needs:
#   make up    build and run the reference gateway (embedded SQLite store)
#   make test  install what is missing, build once, run every test and linter
SHELL := /bin/bash
CARGO ?= cargo
RUN_DIR ?= .run
LISTEN ?= 127.0.0.1:17670

.PHONY: up status test setup build lint check-modules test-rust bench clean-run

REPLICAS ?= 3
# `make up CONFIG_DELIVERY_MODE=push` runs the replicas in push mode.
CONFIG_DELIVERY_MODE ?=
# `make up HOSTS=4` runs sandboxes on 4 shared supervisor hosts instead of
# one supervisor process per sandbox.
HOSTS ?= 0
# `make up RESTART=never` leaves a process that died down (failover tests).
RESTART ?= always

up: build
	@mkdir -p $(RUN_DIR)
	./target/debug/openshell-gateway up --replicas $(REPLICAS) --hosts $(HOSTS) --listen $(LISTEN) --data-dir $(RUN_DIR)/data \
		--restart $(RESTART) $(if $(CONFIG_DELIVERY_MODE),--config-delivery-mode $(CONFIG_DELIVERY_MODE))

# What the processes of a running `make up` are doing.
status:
	./target/debug/openshell-gateway status --data-dir $(RUN_DIR)/data

test: setup build lint check-modules check-generated lint-python lint-typescript test-rust test-python test-typescript conformance check-docs check-wheel check-npm-install lint-go test-go check-go-release check-helm lint-jvm test-jvm

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
# modules and typed raw stubs, TypeScript protobuf-es types and typed raw
# stubs, Go message packages and raw stubs, docs/PARITY.md). `node`:
# protoc-gen-es comes from sdk-typescript's pinned dev dependencies; `go-deps`:
# protoc-gen-go from the Go module's. The C header of bindings/c is written by
# its build script, only when asked (every other build checks it).
generate: setup node go-deps
	$(CARGO) run -q -p sdkgen -- --python $(PYTHON)
	OPENSHELL_WRITE_HEADER=1 $(CARGO) build -q -p openshell-c

# Fails when a generated file differs from what `make generate` would write.
check-generated: setup node go-deps
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
conformance: build python typescript conformance-go conformance-jvm
	$(PYTHON) conformance/harness --self-test
	$(PYTHON) conformance/harness

# Docs that run: every code block of the READMEs (docs-check/check_docs.py).
# rust blocks are compiled as binaries of a scratch crate in the target dir and
# run, python blocks run with the venv, sh commands run, against a 3-replica
# cluster the check starts on loopback (127.0.0.1:17670 when free).
check-docs: build python typescript go-native jvm-install
	$(PYTHON) docs-check/check_docs.py

# The wheel with the gateway's executables inside (scripts/build-wheel.sh,
# debug: it reuses `make python`'s build) in a clean venv without cargo: a
# user's pytest file on the plugin's cluster, as root and as uid 65534, and a
# SIGKILLed holder of a cluster leaving nothing (scripts/check-wheel.sh).
check-wheel: build python
	CARGO_TARGET_DIR=$(TARGET_DIR) MATURIN=$(VENV)/bin/maturin bash scripts/check-wheel.sh

# ---------------------------------------------------------------- TypeScript
# SDK (sdk-typescript, package @openshell/sdk, over the napi-rs addon in
# bindings/node). `npm ci` installs the pinned Node packages from the
# committed lockfile; the package's own install script builds the addon once
# (debug) on the one cargo target dir.
.PHONY: node typescript lint-typescript test-typescript check-npm-install

node: setup
	cd sdk-typescript && CARGO_TARGET_DIR=$(TARGET_DIR) npm ci --no-audit --no-fund -q

# Compiles the package, its tests and the conformance runner into dist/.
typescript: node
	cd sdk-typescript && ./node_modules/.bin/tsc -p tsconfig.json

# tsc --noEmit (strict), then biome: one tool for lint and format.
lint-typescript: node
	cd sdk-typescript && ./node_modules/.bin/tsc -p tsconfig.json --noEmit && ./node_modules/.bin/biome check .

# node:test suites against a real cluster the tests start (sdk-typescript/test).
test-typescript: build typescript
	cd sdk-typescript && CARGO_TARGET_DIR=$(TARGET_DIR) node --test --test-timeout=600000 dist/test/main.test.js

# `npm install` of a clean copy of sdk-typescript (no node_modules, dist or
# native) into a temporary project, as on a fresh machine
# (scripts/check-npm-install.sh); the working tree's sdk-typescript is untouched.
# Then the packages a release publishes (scripts/pack-npm.sh, from the debug
# build): @openshell/sdk and @openshell/sdk-<platform> (the addon, the gateway
# and the supervisor) installed from their tarballs with no cargo and no
# install script, and a user's node:test file using startLocalCluster
# (scripts/check-npm-packages.sh).
check-npm-install: build typescript
	CARGO_TARGET_DIR=$(TARGET_DIR) bash scripts/check-npm-install.sh
	CARGO_TARGET_DIR=$(TARGET_DIR) bash scripts/check-npm-packages.sh

# ---------------------------------------------------------------- Go SDK
# (sdk-go, module example.invalid/openshell/sdk-go, over the C ABI in
# bindings/c through cgo). `make go-native` is the one build step before
# `go test` works in the repository: the static library (debug, on the one
# cargo target dir; its build fails on a stale header) linked where cgo looks.
.PHONY: go-deps go-native lint-go test-go conformance-go check-go-release

GO ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
GOFMT ?= $(dir $(GO))gofmt
GO_PLATFORM = $(shell $(GO) env GOOS)_$(shell $(GO) env GOARCH)

# Downloads the module's dependencies once (a no-op when cached).
go-deps:
	cd sdk-go && $(GO) mod download

go-native: go-deps
	$(CARGO) build -q -p openshell-c
	mkdir -p sdk-go/internal/native/lib/$(GO_PLATFORM)
	ln -sf $(TARGET_DIR)/debug/libopenshell_c.a sdk-go/internal/native/lib/$(GO_PLATFORM)/libopenshell_c.a

lint-go: go-native
	@out="$$($(GOFMT) -l sdk-go)"; if [ -n "$$out" ]; then echo "gofmt -l:"; echo "$$out"; exit 1; fi
	cd sdk-go && $(GO) vet ./...

# A release as `go get` users get it (debug archive here): scripts/release-go.sh
# writes a release commit and a module proxy directory, then a consumer
# module builds against it with cargo off PATH.
check-go-release: go-native
	CARGO_TARGET_DIR=$(TARGET_DIR) bash scripts/release-go.sh v0.0.0-ci --profile debug --scratch --out $(TARGET_DIR)/go-release
	CARGO_TARGET_DIR=$(TARGET_DIR) bash scripts/check-go-consumer.sh $(TARGET_DIR)/go-release v0.0.0-ci

# The Go conformance runner, next to the other binaries the harness runs.
conformance-go: go-native
	cd sdk-go && $(GO) build -o $(TARGET_DIR)/debug/openshell-conformance-go ./conformance

# go test -race against a real cluster the tests start (sdk-go/*_test.go).
test-go: build go-native
	cd sdk-go && CARGO_TARGET_DIR=$(TARGET_DIR) $(GO) test -race -count=1 -timeout 20m ./...

# `make bench BENCH=config` (or sdk, routing, typescript, go, jvm, languages, dataplane, hosts, files,
# scale, isolation, egress, all) runs another benchmark; none of them is part of `make test`.
# Every one installs iperf3 and socat first (scripts/bench-setup.sh,
# idempotent). typescript also needs the release addon and dist/bench; go
# runs its own program (bench-go); languages builds every language's
# program (bench-languages).
BENCH ?= gateway

bench: $(if $(filter typescript all,$(BENCH)),typescript)
	bash scripts/bench-setup.sh
ifeq ($(BENCH),go)
	$(MAKE) bench-go
else ifeq ($(BENCH),jvm)
	$(MAKE) bench-jvm
else ifeq ($(BENCH),languages)
	$(MAKE) bench-languages
else ifeq ($(BENCH),egress)
	bash scripts/bench-egress.sh
else
	$(CARGO) build --release --workspace --bins
	$(if $(filter typescript all,$(BENCH)),$(CARGO) build --release -p openshell-sdk-node)
	OPENSHELL_BIN_DIR=$(TARGET_DIR)/release $(TARGET_DIR)/release/openshell-bench $(BENCH)
endif

# `make bench BENCH=languages`: one table for every language (BENCHMARKS.md).
# One release cargo build of what it runs (gateway, supervisor, the
# benchmark, the C library for Go, the Node addon, the uniffi library for the
# JVM) and the Python extension in release into the venv (maturin, same
# target dir); the Node packages without a debug addon build, tsc; the Go
# program against the release static library; the JVM program
# (jvm-bench-program) on the release uniffi library. Then `openshell-bench languages` starts one gateway, one
# sandbox and an edge and runs every language's program.
.PHONY: bench-languages
bench-languages: setup go-deps
	$(CARGO) build --release -p openshell-gateway -p openshell-supervisor -p openshell-bench \
		-p openshell-c -p openshell-sdk-node -p openshell-uniffi
	$(MAKE) jvm-install jvm-bench-program
	cd sdk-python && VIRTUAL_ENV=$(VENV) CARGO_TARGET_DIR=$(TARGET_DIR) \
		$(VENV)/bin/maturin develop --release -q
	cd sdk-typescript && OPENSHELL_SDK_SKIP_BUILD=1 npm ci --no-audit --no-fund -q \
		&& ./node_modules/.bin/tsc -p tsconfig.json
	cd sdk-go/bench && CGO_LDFLAGS="$(TARGET_DIR)/release/libopenshell_c.a -ldl -lm -lpthread" \
		$(GO) build -tags openshell_external -o $(TARGET_DIR)/release/openshell-go-bench .
	OPENSHELL_BIN_DIR=$(TARGET_DIR)/release OPENSHELL_BENCH_PYTHON=$(PYTHON) \
		$(TARGET_DIR)/release/openshell-bench languages

# `make bench BENCH=jvm`: the JVM program of the languages table alone
# (sdk-jvm/bench, its own Maven project, never run by make test: the SDK
# beside grpc-java) against a release gateway it starts.
.PHONY: bench-jvm jvm-bench-program
bench-jvm: jvm-install
	$(CARGO) build --release -p openshell-gateway -p openshell-supervisor -p openshell-uniffi
	$(MAKE) jvm-bench-program
	OPENSHELL_BIN_DIR=$(TARGET_DIR)/release $(JVM_BENCH_RELEASE)/openshell-jvm-bench

# The JVM benchmark program and its launcher, $(JVM_BENCH_RELEASE)/openshell-jvm-bench
# (`make jvm-install` and a release build of openshell-uniffi first). It is
# compiled against the installed SDK artifact and runs on the release library
# (uniffi's libraryOverride property) in place of the artifact's debug one:
# the Kotlin bindings generated from the release library must equal the
# artifact's (checked here; uniffi checks its checksums again at load).
JVM_BENCH_RELEASE ?= $(TARGET_DIR)/release
JVM_BENCH_OUT = $(JVM_OUT)/bench
jvm-bench-program:
	rm -rf $(JVM_BENCH_OUT)/uniffi-kotlin
	$(JVM_BENCH_RELEASE)/uniffi-bindgen generate --library $(JVM_BENCH_RELEASE)/libopenshell_uniffi.so \
		--language kotlin --no-format --out-dir $(JVM_BENCH_OUT)/uniffi-kotlin
	@diff -r -q $(JVM_GENERATED) $(JVM_BENCH_OUT)/uniffi-kotlin || \
		{ echo "jvm-bench-program: the release library's bindings differ from the installed SDK's (make jvm-install)"; exit 1; }
	cd sdk-jvm/bench && $(MVN) -q -B -Dopenshell.bench.dir=$(JVM_BENCH_OUT) package
	printf '#!/bin/sh\n# Written by make jvm-bench-program: the JVM benchmark on the release library.\nexec java -Duniffi.component.openshell_uniffi.libraryOverride="%s" -cp "%s" dev.openshell.bench.MainKt "$$@"\n' \
		"$(JVM_BENCH_RELEASE)/libopenshell_uniffi.so" \
		"$(JVM_BENCH_OUT)/maven/classes:$$(cat $(JVM_BENCH_OUT)/maven/classpath.txt)" \
		> $(JVM_BENCH_RELEASE)/openshell-jvm-bench
	chmod +x $(JVM_BENCH_RELEASE)/openshell-jvm-bench

# `make bench BENCH=go`: the Go program of the languages table alone
# (sdk-go/bench, its own module so the SDK does not depend on grpc-go),
# against a release gateway it starts: the Go SDK (release static library)
# beside grpc-go.
.PHONY: bench-go
bench-go: go-deps
	$(CARGO) build --release -p openshell-gateway -p openshell-supervisor -p openshell-edge --bins
	$(CARGO) build --release -p openshell-c
	cd sdk-go/bench && CGO_LDFLAGS="$(TARGET_DIR)/release/libopenshell_c.a -ldl -lm -lpthread" \
		$(GO) build -tags openshell_external -o $(TARGET_DIR)/release/openshell-go-bench .
	OPENSHELL_BIN_DIR=$(TARGET_DIR)/release $(TARGET_DIR)/release/openshell-go-bench

# ---------------------------------------------------------------- JVM SDK
# (sdk-jvm, Maven artifact dev.openshell:openshell-sdk: Kotlin and Java over
# the uniffi exports in bindings/uniffi). `make jvm` builds the cdylib (debug,
# on the one cargo target dir) and regenerates the Kotlin bindings from it
# with the crate's own uniffi-bindgen (library mode) into the target dir:
# generated, never committed or edited.
# The cdylib comes out of `make build`'s own command, as the library of the
# crate's uniffi-bindgen binary (cargo leaves it in deps/, not uplifted): a
# `-p openshell-uniffi` build would unify features differently and relink
# the unhashed .so on every switch. It is copied to $(JVM_NATIVE), where the
# Maven build packs it.
.PHONY: jvm lint-jvm test-jvm jvm-install check-jvm-consumer conformance-jvm

MVN ?= mvn
# Where `make jvm` puts the library and the bindings, and Maven its build
# (JVM_OUT=DIR keeps several checkouts' or builds' JVM outputs apart).
JVM_OUT ?= $(TARGET_DIR)/jvm
JVM_GENERATED := $(JVM_OUT)/uniffi-kotlin
JVM_NATIVE := $(JVM_OUT)/native
JVM_MVN := cd sdk-jvm && $(MVN) -q -B -Dopenshell.target.dir=$(TARGET_DIR) -Dopenshell.jvm.dir=$(JVM_OUT)

jvm:
	@command -v $(MVN) >/dev/null && command -v java >/dev/null || \
		{ echo "jvm: Maven ($(MVN)) and a JDK 17 or newer are needed"; exit 1; }
	$(CARGO) build -q --workspace --bins
	mkdir -p $(JVM_NATIVE)
	cp $(TARGET_DIR)/debug/deps/libopenshell_uniffi.so $(JVM_NATIVE)/libopenshell_uniffi.so
	rm -rf $(JVM_GENERATED)
	$(TARGET_DIR)/debug/uniffi-bindgen generate --library $(JVM_NATIVE)/libopenshell_uniffi.so \
		--language kotlin --no-format --out-dir $(JVM_GENERATED)

# ktlint (Kotlin) and google-java-format (Java) through spotless, over the
# SDK, its tests, the conformance runner and the benchmark; `cd sdk-jvm &&
# mvn spotless:apply` fixes what they can.
lint-jvm:
	cd sdk-jvm && $(MVN) -q -B spotless:check

# JUnit 5 (surefire) against a 3-replica cluster the tests start; Maven's
# default local repository, so its cache persists between runs.
test-jvm: build jvm
	$(JVM_MVN) verify

# The JVM conformance runner (sdk-jvm/conformance, compiled with the tests)
# and a launcher next to the other binaries the harness runs.
conformance-jvm: build jvm
	$(JVM_MVN) test-compile org.apache.maven.plugins:maven-dependency-plugin:3.8.1:build-classpath \
		-Dmdep.includeScope=test -Dmdep.outputFile=$(JVM_OUT)/conformance-classpath.txt
	printf '#!/bin/sh\n# Written by make conformance-jvm.\nexec java -Dopenshell.repo=%s -cp "%s" dev.openshell.sdk.conformance.RunnerKt "$$@"\n' \
		"$(CURDIR)" "$(JVM_OUT)/maven/test-classes:$(JVM_OUT)/maven/classes:$$(cat $(JVM_OUT)/conformance-classpath.txt)" \
		> $(TARGET_DIR)/debug/openshell-conformance-jvm
	chmod +x $(TARGET_DIR)/debug/openshell-conformance-jvm

# The artifacts as users get them (the jar with the native library inside),
# installed into the default local Maven repository (~/.m2) for check-docs'
# Kotlin and Java blocks (docs-check/docscheck/jvm.py: scratch Maven modules
# that depend on it). check-jvm-consumer: those blocks of sdk-jvm/README.md.
# Beside it, dev.openshell:openshell-gateway-bin (sdk-jvm/gateway-bin): the
# gateway, supervisor and sandbox init of this build (debug info stripped, as
# the wheel's) under dev/openshell/gateway/<platform>/ with a build-id, which
# LocalCluster unpacks and runs when OPENSHELL_GATEWAY_BIN is unset.
JVM_GATEWAY_STAGE := $(JVM_OUT)/gateway-bin/dev/openshell/gateway/linux-$(shell uname -m | tr _ -)

jvm-install: build jvm
	$(JVM_MVN) install -Dmaven.test.skip=true
	rm -rf $(JVM_OUT)/gateway-bin
	mkdir -p $(JVM_GATEWAY_STAGE)
	for exe in openshell-gateway openshell-supervisor openshell-sandbox-init; do \
		strip --strip-debug -o $(JVM_GATEWAY_STAGE)/$$exe $(TARGET_DIR)/debug/$$exe || exit 1; done
	cd $(JVM_GATEWAY_STAGE) && cat openshell-gateway openshell-supervisor openshell-sandbox-init | \
		sha256sum | cut -c1-16 > build-id
	cd sdk-jvm/gateway-bin && $(MVN) -q -B -Dopenshell.jvm.dir=$(JVM_OUT) install -Dmaven.test.skip=true

check-jvm-consumer: jvm-install
	$(PYTHON) docs-check/check_docs.py sdk-jvm/README.md

clean-run:
	rm -rf $(RUN_DIR)

# The Helm chart (deploy/helm/openshell): gofmt and go vet of its check
# module, then `go test` there, which builds the helm binary its go.mod pins
# (from the Go module proxy), runs helm lint and helm template for every
# value set in deploy/helm/values, decodes every rendered object strictly
# into its Kubernetes API type and checks what each value set promises.
# -count=1: helm reads the chart, which go test's cache does not track.
.PHONY: check-helm
check-helm:
	@out="$$($(GOFMT) -l deploy/helm/check)"; if [ -n "$$out" ]; then echo "gofmt -l:"; echo "$$out"; exit 1; fi
	cd deploy/helm/check && $(GO) vet ./... && $(GO) test -count=1 ./...
