# tollfree: `make demo` and `make test` are the only set-up a new machine needs (Python 3.11, pip, make).
# The Makefile bootstraps uv with pip, then builds .venv from the committed uv.lock.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PYTEST_ARGS ?=
# make test runs the suite on TEST_WORKERS pytest-xdist processes, a test file per worker at a time, in the order
# tests/conftest.py sorts them (xdist's reordering by tests per file is off); tests marked `alone` (their
# assertions read the clock) wait until they have the machine to themselves.
TEST_WORKERS ?= 3

export MLFLOW_DISABLE_TELEMETRY := true
export DO_NOT_TRACK := true
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export FEAST_USAGE := False

.PHONY: demo test test-fast env clean-state help up down status soak docs

help:
	@echo "make demo   - create the environment if needed, then run the main job on embedded defaults"
	@echo "make test   - create the environment if needed, then run the whole test suite (slow e2e included)"
	@echo "make test-fast - unit and integration tests only"
	@echo "make up     - start the local stack in the background (Prefect server + UI, MLflow server + UI, gateway,"
	@echo "              Prometheus, Prefect process worker) and register every deployment; ports: TOLLFREE_PREFECT_PORT"
	@echo "              (4200), TOLLFREE_MLFLOW_PORT (5000), TOLLFREE_GATEWAY_PORT (8080), TOLLFREE_PROMETHEUS_PORT (9090);"
	@echo "              TOLLFREE_GATEWAYS=N (2..16): N gateways on"
	@echo "              PostgreSQL (TOLLFREE_POSTGRES_PORT, 5433) behind HAProxy on TOLLFREE_GATEWAY_PORT"
	@echo "              REGIONS=N (2..5): N regions, each a whole stack in TOLLFREE_HOME/regions/NAME on the ports + 100 x i"
	@echo "make status - what runs: services, deployments with their schedules, endpoints (with regions: each region's,"
	@echo "              and every model's champion per region)"
	@echo "make down   - stop exactly what make up started (state in TOLLFREE_HOME is kept)"
	@echo "make soak   - 60 s at 5x capacity (overload), then 10 min at 70 % of capacity with autoscaling (~15 min);"
	@echo "              CHAOS=1: instead, the chaos soak: 10 min of load through HAProxy over 2 gateways (make up's"
	@echo "              stack on free ports) with random replica and gateway kills and one PostgreSQL restart (~15 min)"
	@echo "make docs   - build the documentation site (MkDocs, strict; reference pages generated from the code) into site/"

# Bytecode: this machine and its CI set PYTHONDONTWRITEBYTECODE, so no module compiled on first use is kept and every
# process would compile what it imports from source. Compiling all of .venv at sync time (39,000 files) takes most of
# a clean clone's set-up, for the 10,180 modules the suite's processes import. So make's commands write the bytecode
# of what they import, on first use, under .venv/pycache (PYTHONPYCACHEPREFIX: nothing is written beside the sources,
# and removing .venv removes it).
unexport PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX := $(CURDIR)/$(VENV)/pycache

# The environment: infra/bootstrap.py installs the pinned uv into .tools/ with $(PYTHON)'s pip, then builds .venv from
# uv.lock, or repairs a broken one; it returns at once when .venv is current. It runs with the system Python and
# writes no bytecode (uv refuses a .venv that holds only pycache/).
env:
	@env -u PYTHONPYCACHEPREFIX PYTHONDONTWRITEBYTECODE=1 $(PYTHON) -m infra.bootstrap --python $(PYTHON)

demo: env
	$(PY) -m flows.demo

test: env
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The long versions of the reliability runs (CI runs the overload for 12 s): figures printed.
SOAK_MINUTES ?= 10
soak: env
ifeq ($(CHAOS),1)
	$(PY) -m benchmarks.chaos --minutes $(SOAK_MINUTES)
else
	TOLLFREE_OVERLOAD_S=60 $(PY) -m pytest -s -q tests/e2e/test_overload.py $(PYTEST_ARGS)
	$(PY) -m benchmarks.soak --minutes $(SOAK_MINUTES)
endif

test-fast: env
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not slow" $(PYTEST_ARGS)

up: env
ifdef REGIONS
	$(PY) -m infra.regions up --regions $(REGIONS)
else
	$(PY) -m infra.stack up
endif

# down and status never sync the environment first: they must work while make up's stack runs on it.
down:
	@test -x $(PY) || { echo "no $(VENV): nothing was started"; exit 0; }; $(PY) -m infra.regions down

status:
	@test -x $(PY) || { echo "no $(VENV): tollfree is not running"; exit 3; }; $(PY) -m infra.regions status

# The reference pages are generated from the code at build time (docs/gen/); --strict fails on a broken link.
docs: env
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(PY) -m mkdocs build --strict

clean-state:
	rm -rf .tollfree
