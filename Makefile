# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test bench venv services db fixtures setup lint worker web flower clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first and pinned: 2.13.0 is the CPU build on local disk; anything else downloads GBs.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev]"
	touch $@

venv: $(VENV)/.installed

services:
	bash scripts/ensure_services.sh

db: venv services
	$(PY) scripts/ensure_database.py
	$(PY) manage.py migrate --noinput -v 0

fixtures: venv
	$(PY) fixtures/build_tiny_models.py

setup: db fixtures
	$(PY) manage.py loaddata fixtures/demo.json -v 0
	$(PY) manage.py load_routing_config fixtures/routing.yaml

test: setup
	$(PY) -m ruff check .
	$(PY) -m pytest

demo: setup
	$(PY) scripts/demo.py

bench: setup
	$(PY) bench/run_all.py

lint: venv
	$(PY) -m ruff check .

# Long-running processes, for use by hand (the demo starts and stops its own).
web: setup
	$(VENV)/bin/gunicorn renq_site.wsgi -b 127.0.0.1:8000 -w 2
worker: setup
	$(VENV)/bin/celery -A renq_site worker -l info --concurrency 1 \
	  -Q embedding.realtime,embedding.api,embedding.batch,embedding.offline
flower: venv
	FLOWER_UNAUTHENTICATED_API=true $(VENV)/bin/celery -A renq_site flower --port=5555

clean:
	rm -rf $(VENV) fixtures/models .pytest_cache .ruff_cache
