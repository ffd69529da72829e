# coschedule: `make run` serves the webhook, `make test` runs every check.
# Every dependency comes from pyproject.toml into .venv; nothing is installed by hand.

# Python >= 3.11 (pyproject.toml's requires-python).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INTERPRETER := $(VENV)/.interpreter
RUNTIME := $(VENV)/.runtime-stamp
STAMP := $(VENV)/.dev-stamp
# `make run` is for a dev machine: it listens on the loopback only (the container's
# `coschedule serve` listens on every address, serve's --host default).
HOST ?= 127.0.0.1
PORT ?= 8443
HEALTH_PORT ?= 8080

.PHONY: help venv run test lint typecheck unit e2e e2e-real realstack-deps bench certs clean FORCE

help:
	@echo "make run        serve the webhook on https://$(HOST):$(PORT) (probes on http://$(HOST):$(HEALTH_PORT)); runtime dependencies only"
	@echo "make test       lint, type-check and run the tests (e2e too when KUBEBUILDER_ASSETS is set); adds the dev tools"
	@echo "make lint       ruff check and format check, import contracts (lint-imports), actionlint"
	@echo "make typecheck  mypy, strict"
	@echo "make unit       the tests alone (pytest)"
	@echo "make e2e        the end-to-end suite against a real control plane"
	@echo "make e2e-real   real PipelineRuns on real kubelets and Tekton (../shared/realstack, root)"
	@echo "make realstack-deps  the real tier's system packages (realstack deps; root)"
	@echo "make bench      the benchmarks (not part of make test)"
	@echo "make certs      a CA and a serving certificate for localhost in certs/"
	@echo "make venv       the .venv with the dev tools"
	@echo "make clean      remove the .venv and the tools' caches"
	@echo "make help       this list"

# The venv belongs to $(PYTHON). One made by another interpreter, by another Python version
# or by an interpreter that no longer runs is made again here, not left to fail until
# `make clean`. The file is rewritten only then, so the installs below rerun only then.
VENV_ID = import sys; print("%d.%d" % sys.version_info[:2], sys.base_prefix)
VENV_OK = import os, sysconfig; assert os.path.isdir(sysconfig.get_path("purelib"))
$(INTERPRETER): FORCE
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "coschedule needs Python >= 3.11; $(PYTHON) is " + sys.version.split()[0] + ": make ... PYTHON=python3.11 (or newer)")'
	@want=$$($(PYTHON) -c '$(VENV_ID)'); \
	have=$$($(BIN)/python -c '$(VENV_OK); $(VENV_ID)' 2>/dev/null || true); \
	if [ "$$want" != "$$have" ] || [ ! -f $@ ]; then \
		if [ -d $(VENV) ] && [ "$$want" = "$$have" ]; then \
			echo "$(VENV) has no record of the interpreter that made it: making it again"; \
		elif [ -d $(VENV) ]; then \
			echo "$(VENV) was made by $${have:-an interpreter that no longer runs}, not by $(PYTHON) ($$want): making it again"; \
		fi; \
		rm -rf $(VENV) && $(PYTHON) -m venv $(VENV) && echo "$$want" > $@; \
	fi

# `make run` needs the runtime dependencies only; `make test` adds the [dev] extra.
$(RUNTIME): pyproject.toml $(INTERPRETER)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(STAMP): pyproject.toml $(INTERPRETER)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@ $(RUNTIME)

venv: $(STAMP)

run: $(RUNTIME)
	$(BIN)/coschedule serve --host $(HOST) --port $(PORT) --health-port $(HEALTH_PORT)

lint: $(STAMP)
	$(BIN)/ruff check coschedule tests bench .github/scripts
	$(BIN)/ruff format --check coschedule tests bench .github/scripts
	$(BIN)/lint-imports --no-cache
	@# The GitHub workflows; actionlint's wheel is for linux x86_64 (see pyproject.toml).
	@if [ -x $(BIN)/actionlint ]; then \
		echo "$(BIN)/actionlint -shellcheck=$(BIN)/shellcheck .github/workflows/*.yml"; \
		$(BIN)/actionlint -shellcheck=$(BIN)/shellcheck -pyflakes= .github/workflows/*.yml; \
	else echo "actionlint: not installed on this platform (linux x86_64 only): skipped"; fi

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest

test: lint typecheck unit

# Asked to run the e2e suite, it fails (not skips) when no control-plane binaries are found;
# without KUBEBUILDER_ASSETS it takes the shared v1.36.2 control plane when it is beside us.
SHARED_K8S ?= ../shared/k8s/envtest-assets.sh
e2e: $(STAMP)
	@assets="$$KUBEBUILDER_ASSETS"; \
	if [ -z "$$assets" ] && [ -x "$(SHARED_K8S)" ]; then assets=$$($(SHARED_K8S) | tail -n 1); fi; \
	KUBEBUILDER_ASSETS="$$assets" COSCHEDULE_E2E_REQUIRED=1 $(BIN)/pytest tests/e2e -m e2e -p no:randomly

# The real-stack tier (tests/real, marker `real`): real kubelets and a real Tekton controller
# from ../shared/realstack. Asked for, it fails (not skips) when the stack cannot start; its
# system packages come from `realstack deps` (apt-get, root), never by hand.
REALSTACK ?= ../shared/realstack/realstack
realstack-deps:
	@if [ -x "$(REALSTACK)" ] && [ "$$(id -u)" = 0 ]; then $(REALSTACK) deps; \
	else echo "realstack-deps: no $(REALSTACK) or not root: nothing to install"; fi

e2e-real: $(STAMP) realstack-deps
	@assets="$$KUBEBUILDER_ASSETS"; \
	if [ -z "$$assets" ] && [ -x "$(SHARED_K8S)" ]; then assets=$$($(SHARED_K8S) | tail -n 1); fi; \
	KUBEBUILDER_ASSETS="$$assets" COSCHEDULE_REAL_REQUIRED=1 $(BIN)/pytest tests/real -m real -p no:randomly

bench: $(STAMP)
	$(BIN)/python -m bench

certs: $(RUNTIME)
	$(BIN)/coschedule certs --dns-name localhost --dns-name 127.0.0.1 --out certs

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
