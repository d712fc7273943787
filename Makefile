# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test bench venv services db fixtures setup browser lint worker web flower clean chaos fuzz cluster

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

# A per-checkout secret key for local runs (never committed); deployments set DJANGO_SECRET_KEY.
secret:
	@mkdir -p .run && test -s .run/secret_key || python3 -c "import secrets; print(secrets.token_urlsafe(50))" > .run/secret_key

db: venv services secret
	$(PY) scripts/ensure_database.py
	$(PY) manage.py migrate --noinput -v 0

fixtures: venv
	$(PY) fixtures/build_tiny_models.py

setup: db fixtures
	$(PY) manage.py renq_config load fixtures/config.yaml
	$(PY) manage.py loaddata fixtures/demo_tenant.json -v 0
	$(PY) manage.py collectstatic --noinput -v 0

# Headless Chromium + chromedriver (browser tests) and docker-compose v1, which validates
# docker/docker-compose.yml without an engine. Best effort: without apt (or root) those
# tests skip or check the file against the vendored schema only.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null && command -v docker-compose >/dev/null \
	  || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	       && (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	           chromium chromium-driver docker-compose) >/tmp/renq-apt.log 2>&1 \
	       || echo "note: chromium/chromedriver/docker-compose not installed (see /tmp/renq-apt.log)"; }

test: setup browser
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports
	$(PY) -m pytest

# Faults under load (tests/chaos): the reduced forms run in `make test`; this runs the full-size
# forms and those that stop and start the machine's real PostgreSQL, RabbitMQ and Redis
# (RENQ_CHAOS_REAL_SERVICES=0 to skip them). Own database, queues and Redis db by default.
CHAOS_ENV = RENQ_TEST_DATABASE=$${RENQ_TEST_DATABASE:-renq_test_chaos} \
	RENQ_TEST_QUEUE_PREFIX=$${RENQ_TEST_QUEUE_PREFIX:-chaostest.} \
	RENQ_TEST_REDIS_URL=$${RENQ_TEST_REDIS_URL:-redis://127.0.0.1:6379/8}
chaos: setup
	rm -f .run/chaos-report.txt
	$(CHAOS_ENV) RENQ_CHAOS_FULL=1 RENQ_CHAOS_REAL_SERVICES=$${RENQ_CHAOS_REAL_SERVICES:-1} \
	  $(PY) -m pytest tests/chaos -m "chaos or chaos_full" -p no:cacheprovider -q; \
	  status=$$?; cat .run/chaos-report.txt 2>/dev/null; exit $$status

# Faults across hosts (tests/cluster: each host a network namespace the test makes; needs
# root, else the tests skip): the reduced forms run in `make test`; this runs the full forms
# and prints the report. Own database, queues and Redis db by default.
CLUSTER_ENV = RENQ_TEST_DATABASE=$${RENQ_TEST_DATABASE:-renq_test_cluster} \
	RENQ_TEST_QUEUE_PREFIX=$${RENQ_TEST_QUEUE_PREFIX:-clustertest.} \
	RENQ_TEST_REDIS_URL=$${RENQ_TEST_REDIS_URL:-redis://127.0.0.1:6379/9}
cluster: setup
	rm -f .run/cluster-report.txt
	$(CLUSTER_ENV) RENQ_CLUSTER_FULL=1 \
	  $(PY) -m pytest tests/cluster -m "cluster or cluster_full" -p no:cacheprovider -q; \
	  status=$$?; cat .run/cluster-report.txt 2>/dev/null; exit $$status

# schemathesis against /api/schema/ (a real gunicorn, authenticated as a tenant), with many
# more cases than the test in `make test`; prints the report and the number of cases.
fuzz: setup
	$(CHAOS_ENV) RENQ_FUZZ_MAX_EXAMPLES=$${RENQ_FUZZ_MAX_EXAMPLES:-100} \
	  $(PY) -m pytest tests/inference/api/test_schema_fuzz.py -p no:cacheprovider -q -s

demo: setup
	$(PY) scripts/demo.py

# BENCH_ARGS, e.g. "--quick --only noop,priority --results-dir /tmp/bench" (bench/run_all.py).
bench: setup
	$(PY) bench/run_all.py $(BENCH_ARGS)
	# A queued job's predicted start vs its real start (issue 27's position/ETA figures).
	RENQ_MEASURE=1 $(PY) -m pytest tests/inference/dispatch/test_wait_prediction.py -q -s -p no:cacheprovider

lint: venv
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports

# Long-running processes, for use by hand (the demo starts and stops its own).
web: setup
	# ASGI (uvicorn workers): /v1/ requests wait for their jobs without holding a thread each.
	$(VENV)/bin/gunicorn renq_site.asgi:application -k uvicorn_worker.UvicornWorker -b 127.0.0.1:8000 -w 2
worker: setup
	$(VENV)/bin/celery -A renq_site worker -l info --concurrency 1 \
	  -Q embedding.realtime,embedding.api,embedding.batch,embedding.offline
flower: venv
	@test -n "$${FLOWER_BASIC_AUTH:-}" || { echo "FLOWER_BASIC_AUTH is not set:" \
	  "export FLOWER_BASIC_AUTH=user:password (the login for Flower's pages and API)"; exit 1; }
	$(VENV)/bin/celery -A renq_site flower --port=5555 --basic-auth=$${FLOWER_BASIC_AUTH}

clean:
	rm -rf $(VENV) fixtures/models .pytest_cache .ruff_cache
