# The two commands: `make up` runs the platform, `make test` runs lint + the test suite.
# Both create the virtualenv when missing and start embedded PostgreSQL/Redis
# unless DATABASE_URL / REDIS_URL point at real servers.
PYTHON ?= python3
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
