# Build/test entry points. Everything is installed from uv.lock into .venv.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DELETE_ON_ERROR:
.DEFAULT_GOAL := test

UV_VERSION := 0.13.8
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
# uv itself lives in its own small tool venv so the project venv stays lock-exact.
UV_HOME := .uv-tool
UV := $(UV_HOME)/bin/uv

export UV_PYTHON_DOWNLOADS := never
# Spark's Python workers otherwise run whatever `python3` is on PATH (no pyarrow there).
export PYSPARK_PYTHON := $(abspath $(VENV))/bin/python

# Conformance clients: the official RocketMQ 5 clients, each in its own locked environment, never in
# .venv (the Python client's generated protos clash with the gateway's in one process).
CONF_VENV := .venv-conformance
CONF_PY_DIR := conformance/clients/python
CONF_PY_STAMP := $(CONF_VENV)/.installed
CONF_NODE_DIR := conformance/clients/node
CONF_NODE_STAMP := $(CONF_NODE_DIR)/node_modules/.installed
NPM ?= npm

# RocketMQ 4.x remoting clients for tests/adapters/remoting: PyPI rocketmq 0.4.4 (the Apache C++ client; its
# import name clashes with the 5.x client, hence its own venv) and ali-ons (npm).
REM_VENV := .venv-remoting
REM_PY_DIR := tests/adapters/remoting/clients/python
REM_PY_STAMP := $(REM_VENV)/.installed
REM_NODE_DIR := tests/adapters/remoting/clients/node
REM_NODE_STAMP := $(REM_NODE_DIR)/node_modules/.installed

.PHONY: install install-system install-bench-system install-conformance lock-conformance install-remoting-clients lock-remoting-clients conformance run test test-workers soak bench lint clean

$(UV):
	$(PYTHON) -m venv $(UV_HOME)
	$(UV_HOME)/bin/pip install --quiet "uv==$(UV_VERSION)"

# hatch_build.py and the .pyx (and .pxd) sources: the compiled hot path is rebuilt when they change.
$(STAMP): uv.lock pyproject.toml hatch_build.py $(wildcard store/*.pyx store/*.pxd adapters/mqtt/codec/*.pyx cluster/*.pyx adapters/grpc/*.pyx adapters/amqp/codec/*.pyx adapters/amqp/codec/*.pxd) | $(UV)
	$(UV) sync --locked --all-groups --python "$$($(PYTHON) -c 'import sys; print(sys.executable)')"
	touch $@

install: $(STAMP)

# Pinned Debian packages: deps/debian-packages.txt for the tests (mosquitto-clients, mosquitto, etcd-server,
# rabbitmq-server), deps/debian-bench-packages.txt as well for `make bench`.
install-system:
	deps/install-debian.sh deps/debian-packages.txt

install-bench-system:
	deps/install-debian.sh deps/debian-packages.txt deps/debian-bench-packages.txt

$(CONF_PY_STAMP): $(CONF_PY_DIR)/requirements.lock | $(UV)
	test -x $(CONF_VENV)/bin/python || $(UV) venv --quiet --python "$$($(PYTHON) -c 'import sys; print(sys.executable)')" $(CONF_VENV)
	$(UV) pip sync --quiet --require-hashes --python $(CONF_VENV)/bin/python $<
	touch $@

$(CONF_NODE_STAMP): $(CONF_NODE_DIR)/package-lock.json $(CONF_NODE_DIR)/package.json
	cd $(CONF_NODE_DIR) && $(NPM) ci --no-audit --no-fund --loglevel=error
	touch $@

install-conformance: $(CONF_PY_STAMP) $(CONF_NODE_STAMP)

$(REM_PY_STAMP): $(REM_PY_DIR)/requirements.lock | $(UV)
	test -x $(REM_VENV)/bin/python || $(UV) venv --quiet --python "$$($(PYTHON) -c 'import sys; print(sys.executable)')" $(REM_VENV)
	$(UV) pip sync --quiet --require-hashes --python $(REM_VENV)/bin/python $<
	touch $@

$(REM_NODE_STAMP): $(REM_NODE_DIR)/package-lock.json $(REM_NODE_DIR)/package.json
	cd $(REM_NODE_DIR) && $(NPM) ci --no-audit --no-fund --loglevel=error
	touch $@

install-remoting-clients: $(REM_PY_STAMP) $(REM_NODE_STAMP)

lock-remoting-clients: | $(UV)
	$(UV) pip compile --quiet --generate-hashes --python-version 3.11 \
		-o $(REM_PY_DIR)/requirements.lock $(REM_PY_DIR)/requirements.in
	cd $(REM_NODE_DIR) && $(NPM) install --package-lock-only --no-audit --no-fund

# Re-resolve the conformance locks after editing requirements.in / package.json.
lock-conformance: | $(UV)
	$(UV) pip compile --quiet --generate-hashes --python-version 3.11 \
		-o $(CONF_PY_DIR)/requirements.lock $(CONF_PY_DIR)/requirements.in
	cd $(CONF_NODE_DIR) && $(NPM) install --package-lock-only --no-audit --no-fund

# All scenarios against a gateway the runner starts itself (see docs/conformance.md for --target).
conformance: install install-system install-conformance
	$(VENV)/bin/python -m conformance --spawn

run: install
	$(VENV)/bin/gateway start --data-dir ./data

# Lint first: a broken layer contract or unformatted file fails the run before the tests start.
# Then the suite on TEST_WORKERS processes (pytest-xdist, one test file per worker at a time: a
# module's fixtures stay in one process), and last the serial group alone on the machine: the
# tests that measure rates, memory or latency (tests/conftest.py SERIAL says which and why).
# One worker more than cores: most tests wait on sockets and subprocesses (clients, Java, Node)
# rather than compute; on 2 cores 3 workers took the parallel part from 9:33 to 6:49.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
test: install install-system install-conformance install-remoting-clients
	$(MAKE) --no-print-directory lint
	$(VENV)/bin/pytest -q tests -m 'not slow_bench and not serial' -n $(TEST_WORKERS) --dist loadfile --durations=30
	$(VENV)/bin/pytest -q tests -m 'serial and not slow_bench' --durations=10

# Every conformance run (real clients of every protocol: the official RocketMQ 5 clients, aiormq's and
# aio-pika's own suites, MQTT, HTTP) against `gateway start --workers 2`, and the workers tests.
test-workers: install install-system install-conformance install-remoting-clients
	CONFORMANCE_WORKERS=2 $(VENV)/bin/pytest -q tests/conformance tests/gateway/test_workers.py

# The long randomized fault test of a replica group (the short one runs in `make test`); replay a
# failure with FAULT_SEED=<the printed seed>. Its pytest timeout grows with FAULT_ITERATIONS.
# Then every name server killed for NAMESRV_OUTAGE_S seconds under load (5 s in `make test`).
FAULT_ITERATIONS ?= 40
NAMESRV_OUTAGE_S ?= 60
# The bridge soak (docs/bridges.md): Mosquitto -> gateway -> RabbitMQ and back under kill -9 of each part.
BRIDGE_SOAK_MESSAGES ?= 100000
soak: install install-system
	FAULT_ITERATIONS=$(FAULT_ITERATIONS) $(VENV)/bin/pytest -q -s tests/cluster/test_fault_loop.py
	NAMESRV_OUTAGE_S=$(NAMESRV_OUTAGE_S) $(VENV)/bin/pytest -q -s tests/cluster/test_namesrv_loss.py
	$(VENV)/bin/python bench/bridge_soak.py --messages $(BRIDGE_SOAK_MESSAGES)

bench: install install-bench-system install-system
	$(VENV)/bin/pytest -q -m slow_bench tests/bench
	$(VENV)/bin/python bench/store_bench.py
	$(VENV)/bin/python bench/grpc_bench.py
	$(VENV)/bin/python bench/mqtt_codec_bench.py
	$(VENV)/bin/python bench/mqtt_bench.py
	$(VENV)/bin/python bench/lonely_trace.py --flow mqtt
	$(VENV)/bin/python bench/lonely_trace.py --flow amqp
	$(VENV)/bin/python bench/amqp_codec_bench.py
	$(VENV)/bin/python bench/amqp_bench.py
	$(VENV)/bin/python bench/amqp_declare_bench.py
	$(VENV)/bin/python bench/scale_bench.py
	$(VENV)/bin/python bench/http_bench.py
	$(VENV)/bin/python bench/analytics_bench.py
	$(VENV)/bin/python bench/cluster_bench.py

# ruff (style), import-linter (the layer contracts of pyproject.toml, docs/architecture.md) and the
# module-level import cycles inside the packages (a ratchet over its allow-list).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/python tests/architecture/import_cycles.py

clean:
	rm -rf $(VENV) $(UV_HOME) $(CONF_VENV) $(CONF_NODE_DIR)/node_modules $(REM_VENV) $(REM_NODE_DIR)/node_modules .pytest_cache .ruff_cache .hypothesis build dist *.egg-info
	find . -name __pycache__ -type d -prune -not -path './.git/*' -exec rm -rf {} +
