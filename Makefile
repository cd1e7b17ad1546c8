# GPU Cloud Portal. `make run` for the demo, `make test` for the whole suite.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PORT   ?= 8000

.DEFAULT_GOAL := help
.PHONY: help venv run test lint typecheck migrations-check deploy-check ci bench e2e clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}'

$(VENV)/.installed: requirements.txt requirements-dev.txt requirements-focus.txt cli/pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "Python 3.11 is needed (set PYTHON=...)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r requirements-dev.txt
	$(VENV)/bin/pip install -q --no-deps -r requirements-focus.txt
	@touch $@

venv: $(VENV)/.installed ## Create the virtualenv with every dependency

run: venv ## Set up and start the portal with workers on the embedded default
	@PORT=$(PORT) bash scripts/run.sh

test: venv ## Run the whole suite on real PostgreSQL, Redis and Chromium
	@bash scripts/test.sh $(ARGS)

e2e: venv ## Only the browser tests
	@bash scripts/test.sh tests/e2e $(ARGS)

lint: venv ## ruff (lint and format check)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: venv ## mypy on the typed packages (strict for scheduler.core)
	DJANGO_SECRET_KEY=typecheck $(VENV)/bin/mypy config web foundation portal storage scheduler billing monitoring agent
	cd cli && $(abspath $(VENV))/bin/mypy --strict --config-file= gpucloud_cli

migrations-check: venv ## Fail if a model change has no migration
	DJANGO_SECRET_KEY=check DATABASE_URL=sqlite:///:memory: $(PY) manage.py makemigrations --check --dry-run

ci: lint migrations-check typecheck deploy-check test ## Everything CI runs

bench: venv ## Run the benchmarks (see docs/benchmarks.md)
	$(PY) -m bench.packing
	$(PY) -m bench.speed
	$(PY) -m bench.queueing
	$(PY) -m bench.cycle_scale
	$(PY) -m bench.submit_throughput
	$(PY) -m bench.billing_close
	$(PY) bench/telemetry_ingest.py --write-docs

clean: ## Remove local state (database, broker files); keeps the virtualenv
	rm -rf var db.sqlite3

deploy-check: venv ## Django's deployment checks with production settings
	DJANGO_SETTINGS_MODULE=config.settings.production \
	DJANGO_SECRET_KEY="$$($(PY) -c 'import secrets; print(secrets.token_urlsafe(50))')" \
	DATABASE_URL=postgres://portal@db.invalid/portal DJANGO_ALLOWED_HOSTS=portal.example.org \
	REDIS_URL=redis://:deploy-check@redis.invalid:6379/0 \
	sh -c '$(PY) manage.py check --deploy --fail-level WARNING && \
	PORTAL_URLCONF=config.urls_agent $(PY) manage.py check --deploy --fail-level WARNING'
