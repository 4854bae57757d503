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
