# The two commands: `make up` runs the platform, `make test` runs lint + the test suite.
# Both create the virtualenv when missing and start embedded PostgreSQL/Redis
# unless DATABASE_URL / REDIS_URL point at real servers.
# The virtualenv's interpreter: the system's CPython when it is 3.11 or newer and can
# make a virtualenv, else the first python3 on PATH. Distributions build CPython with
# PGO and LTO (as does the python Docker image of docker-compose.yml); a pyenv build
# without --enable-optimizations ran the API 8-13 % slower per request (bench/api.py).
PYTHON ?= $(or $(shell /usr/bin/python3 -c \
	'import sys, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
	&& echo /usr/bin/python3),python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: up test demo simulate bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -U pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

up: $(STAMP)
	$(PY) scripts/stack.py up

test: $(STAMP)
	$(PY) scripts/stack.py test

simulate: $(STAMP)
	$(PY) -m apps.scheduler.simulate --scenario steady --gpus 1000 --policy all

clean:
	rm -rf .data

demo: $(STAMP)
	$(PY) scripts/stack.py demo

# `make bench`: every benchmark under bench/, one after another (a few minutes on 2 cores
# with these short settings), each one's output also written to artifacts/bench/<name>.txt.
# Against DATABASE_URL / REDIS_URL when set, else embedded servers (scripts/stack.py run).
#   CPUS=0,1          pin the whole run: the launcher under `taskset` (so the embedded
#                     PostgreSQL and Valkey it starts), and each benchmark with --cpus
#                     (its clients and the servers it starts); servers started by others
#                     are not pinned, and each benchmark's header says so
#   BENCHES=api       run only these (default: all five)
#   BENCH_ARGS=...    appended to every benchmark's arguments (with several benchmarks,
#                     only options all of them take; with one, any of its options, which
#                     override the short settings below)
#   BENCH_ARGS_<name> replace one benchmark's short settings (the defaults of each script
#                     are the longer runs quoted in docs/performance.md)
CPUS ?=
BENCH_ARGS ?=
BENCHES ?= scheduler dispatch ledger api stream
BENCH_ARGS_scheduler ?= --queued 10000 100000 --repeat 3
BENCH_ARGS_dispatch ?= --queued 10000 100000 --no-apply --crowd 100000
BENCH_ARGS_ledger ?= --seconds 5 --warm-up 2
BENCH_ARGS_api ?= --duration 5 --warmup 2 --rounds 3
BENCH_ARGS_stream ?= --duration 5 --warmup 2 --probes 100

define bench_one
	set -o pipefail; $(if $(CPUS),taskset -c $(CPUS) )$(PY) scripts/stack.py run -- \
	python bench/$(1).py $(BENCH_ARGS_$(1)) $(if $(CPUS),--cpus $(CPUS)) $(BENCH_ARGS) 2>&1 \
	| tee artifacts/bench/$(1).txt

endef

bench: SHELL := /bin/bash
bench: $(STAMP)
	mkdir -p artifacts/bench
	$(foreach name,$(BENCHES),$(call bench_one,$(name)))
