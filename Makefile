# coschedule: `make run` serves the webhook, `make test` runs every check.
# Every dependency comes from pyproject.toml into .venv; nothing is installed by hand.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PORT ?= 8443
HEALTH_PORT ?= 8080

.PHONY: help venv run test lint typecheck unit e2e bench certs clean

help:
	@echo "make run    serve the webhook on https://localhost:$(PORT) (probes on :$(HEALTH_PORT))"
	@echo "make test   lint, type-check and run the tests (e2e too when KUBEBUILDER_ASSETS is set)"
	@echo "make e2e    the end-to-end suite against a real control plane"
	@echo "make bench  the benchmarks (not part of make test)"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/coschedule serve --port $(PORT) --health-port $(HEALTH_PORT)

lint: $(STAMP)
	$(BIN)/ruff check coschedule tests bench .github/scripts
	$(BIN)/ruff format --check coschedule tests bench .github/scripts
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

bench: $(STAMP)
	$(BIN)/python -m bench

certs: $(STAMP)
	$(BIN)/coschedule certs --dns-name localhost --dns-name 127.0.0.1 --out certs

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
