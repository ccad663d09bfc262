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

.PHONY: install run test bench lint clean

$(UV):
	$(PYTHON) -m venv $(UV_HOME)
	$(UV_HOME)/bin/pip install --quiet "uv==$(UV_VERSION)"

$(STAMP): uv.lock pyproject.toml | $(UV)
	$(UV) sync --locked --all-groups --python "$$($(PYTHON) -c 'import sys; print(sys.executable)')"
	touch $@

install: $(STAMP)

run: install
	$(VENV)/bin/gateway start --data-dir ./data

test: install
	$(VENV)/bin/pytest -q tests

bench: install
	$(VENV)/bin/python bench/store_bench.py

lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) $(UV_HOME) .pytest_cache .ruff_cache .hypothesis build dist *.egg-info
	find . -name __pycache__ -type d -prune -not -path './.git/*' -exec rm -rf {} +
