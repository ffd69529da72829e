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

.PHONY: help venv run test lint typecheck unit e2e e2e-real realstack-deps bench bench-deps bench-load bench-tekton certs dist release-manifest clean lock image image-deps image-clean e2e-faults e2e-artifact FORCE

help:
	@echo "make run        serve the webhook on https://$(HOST):$(PORT) (probes on http://$(HOST):$(HEALTH_PORT)); runtime dependencies only"
	@echo "make test       lint, type-check and run the tests (e2e too when KUBEBUILDER_ASSETS is set); adds the dev tools"
	@echo "make lint       ruff check and format check, import contracts (lint-imports), actionlint"
	@echo "make typecheck  mypy, strict"
	@echo "make unit       the tests alone (pytest)"
	@echo "make e2e        the end-to-end suite against a real control plane"
	@echo "make e2e-real   real PipelineRuns on real kubelets and Tekton (../shared/realstack, root)"
	@echo "make realstack-deps  the real tier's system packages (realstack deps; root)"
	@echo "make e2e-faults  faults injected into live runs on that stack (API server, etcd, reconciler leader, webhook)"
	@echo "make e2e-artifact  the image, installed on real nodes (../shared/realstack and ../shared/image, root)"
	@echo "make image      the container image $(IMAGE), saved to $(IMAGE_TAR) (docker, or podman)"
	@echo "make image-deps the image tools' system packages (imagekit deps; root)"
	@echo "make image-clean  remove what make image made"
	@echo "make lock       requirements/*.lock (hash-pinned, what the image installs) from pyproject.toml"
	@echo "make dist       the wheel in dist/ (what PyPI gets)"
	@echo "make release-manifest  dist/coschedule.yaml: the CRD and the self-signed install, one file"
	@echo "make bench      the benchmarks (not part of make test); installs wrk first (bench-deps)"
	@echo "make bench-deps the benchmarks' system package: Debian's wrk, the closed-loop generator (root)"
	@echo "make bench-load sustained load with faults on the real stack, its figures (root; ../shared/realstack)"
	@echo "make bench-tekton  coschedule beside Tekton's own Affinity Assistant on the real stack: latency and behaviours (root)"
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

# The artifact tier (tests/real/test_artifact.py): the image `make image` builds, installed
# as users install it on nodes of its own (needs $(IMAGEKIT) too; `imagekit deps` installs
# its system packages). A target of its own (a control plane of its own), required by .ci/run.
REAL_PYTEST = KUBEBUILDER_ASSETS="$$assets" COSCHEDULE_REAL_REQUIRED=1 \
	COSCHEDULE_ARTIFACT_REQUIRED=$$([ -x "$(IMAGEKIT)" ] && echo 1) $(BIN)/pytest -p no:randomly
e2e-real: $(STAMP) realstack-deps
	@assets="$$KUBEBUILDER_ASSETS"; \
	if [ -z "$$assets" ] && [ -x "$(SHARED_K8S)" ]; then assets=$$($(SHARED_K8S) | tail -n 1); fi; \
	$(REAL_PYTEST) tests/real -m "real and not faults" --ignore=tests/real/test_artifact.py

# The fault tier: the real stack, faults injected into live runs (tests/real/test_faults.py).
e2e-faults: $(STAMP) realstack-deps
	@assets="$$KUBEBUILDER_ASSETS"; \
	if [ -z "$$assets" ] && [ -x "$(SHARED_K8S)" ]; then assets=$$($(SHARED_K8S) | tail -n 1); fi; \
	$(REAL_PYTEST) tests/real -m "real and faults"

# ARTIFACT_REUSE=1 (.ci/run, right after `make image`): the tier installs the image that
# `make image` left in IMAGE_TAR rather than building it again; without it the tier runs
# `make image` itself. The upgrade's image is always a rebuild with another VERSION (warm).
ARTIFACT_REUSE ?=
e2e-artifact: $(STAMP) realstack-deps image-deps
	@assets="$$KUBEBUILDER_ASSETS"; \
	if [ -z "$$assets" ] && [ -x "$(SHARED_K8S)" ]; then assets=$$($(SHARED_K8S) | tail -n 1); fi; \
	IMAGE_WORK=$(IMAGE_WORK) COSCHEDULE_IMAGEKIT=$(IMAGEKIT) \
	$(if $(ARTIFACT_REUSE),COSCHEDULE_ARTIFACT_IMAGE=$(IMAGE) COSCHEDULE_ARTIFACT_ARCHIVE=$(IMAGE_TAR)) \
	$(REAL_PYTEST) tests/real/test_artifact.py -m real

bench: $(STAMP) bench-deps
	$(BIN)/python -m bench

# The closed loop's generator is Debian's wrk, as the published ratios were measured (C: a
# fraction of its core where bench.openloop's Python loop needs all of it). From the
# distribution's archive, never a downloaded binary; without root the benches fall back to
# bench.openloop and say so in their figures.
bench-deps:
	@if command -v wrk >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get install -y --no-install-recommends wrk >/dev/null || \
		{ apt-get update >/dev/null && apt-get install -y --no-install-recommends wrk >/dev/null; }; \
	else echo "bench-deps: wrk is not installed and this is not a root Debian shell: the benches use bench.openloop (sudo apt-get install wrk)"; fi

# Sustained load with faults on the real stack (bench/load.py, as root): its figures go in
# docs/benchmarks.md. BENCH_LOAD_ARGS="--runs N --minutes M" sizes it.
BENCH_LOAD_ARGS ?=
bench-load: $(STAMP) realstack-deps
	@assets="$$KUBEBUILDER_ASSETS"; \
	if [ -z "$$assets" ] && [ -x "$(SHARED_K8S)" ]; then assets=$$($(SHARED_K8S) | tail -n 1); fi; \
	KUBEBUILDER_ASSETS="$$assets" $(BIN)/python -m bench.load --json bench/results/load.json \
		$(BENCH_LOAD_ARGS)

# coschedule side by side with Tekton's own Affinity Assistant on the real stack (bench/tekton.py,
# as root): the latency table and the behaviours, in docs/benchmarks.md. BENCH_TEKTON_ARGS=
# "--rounds N" sizes it (--wait S bounds each behaviour's wait).
BENCH_TEKTON_ARGS ?=
bench-tekton: $(STAMP) realstack-deps
	@assets="$$KUBEBUILDER_ASSETS"; \
	if [ -z "$$assets" ] && [ -x "$(SHARED_K8S)" ]; then assets=$$($(SHARED_K8S) | tail -n 1); fi; \
	KUBEBUILDER_ASSETS="$$assets" $(BIN)/python -m bench.tekton --json bench/results/tekton.json \
		$(BENCH_TEKTON_ARGS)

# The image installs exactly these: every runtime package, transitive ones included, pinned
# by version and hash, for Python 3.11 on any platform (--universal); the build backend too
# ([build-system].requires). uv keeps the versions already locked unless pyproject.toml asks
# for others (`make lock UV_FLAGS=--upgrade` moves everything to the newest).
UV_FLAGS ?=
LOCK_FLAGS = --quiet --universal --python-version 3.11 --generate-hashes \
	--custom-compile-command 'make lock' $(UV_FLAGS)
lock: $(STAMP)
	mkdir -p requirements
	$(BIN)/uv pip compile $(LOCK_FLAGS) --output-file requirements/runtime.lock pyproject.toml
	$(BIN)/python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")' \
		| $(BIN)/uv pip compile $(LOCK_FLAGS) --output-file requirements/build.lock -

# The image from this Dockerfile, as it is. With docker when its daemon answers, else, where
# no registry is reachable and ../shared/image is beside the checkout (root), podman through
# its imagekit: its work dir IMAGE_WORK holds podman's state and the base
# localhost/python:3.11-local it makes from Debian packages (PYTHON_IMAGE unless given), and
# `imagekit deps` installs podman (apt-get). Else a podman on PATH. IMAGE_TOOL=docker|podman|
# imagekit picks one. The image is saved as a docker-archive to IMAGE_TAR (`docker load`,
# `ctr images import`).
IMAGE ?= localhost/coschedule:dev
IMAGE_TAR ?= build/coschedule-image.tar
PYTHON_IMAGE ?=
VERSION ?= $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml)
IMAGEKIT ?= ../shared/image/imagekit
IMAGE_WORK ?= /tmp/coschedule-image
IMAGE_TOOL ?= $(shell if docker info >/dev/null 2>&1; then echo docker; \
	elif [ -x $(IMAGEKIT) ] && [ "$$(id -u)" = 0 ]; then echo imagekit; \
	elif podman info >/dev/null 2>&1; then echo podman; else echo none; fi)
# The version label is given with --label as well as the Dockerfile's ARG: podman 4.3
# (buildah 1.28) takes a cached LABEL step whatever the ARG's value, so a rebuild with
# another VERSION would keep the old label and be the very same image.
VERSION_LABEL = --label org.opencontainers.image.version=$(VERSION)
BUILD_ARGS = $(if $(PYTHON_IMAGE),--build-arg PYTHON_IMAGE=$(PYTHON_IMAGE)) --build-arg VERSION=$(VERSION) $(VERSION_LABEL)

image-deps:
	@if [ -x "$(IMAGEKIT)" ] && [ "$$(id -u)" = 0 ]; then $(IMAGEKIT) deps; \
	else echo "image-deps: no $(IMAGEKIT) or not root: nothing to install"; fi

image:
	@tool="$(IMAGE_TOOL)"; start=$$(date +%s); set -e; \
	echo "make image: $(IMAGE) (version $(VERSION)) with $$tool"; \
	case "$$tool" in \
	docker|podman) \
		$$tool build $(BUILD_ARGS) -t $(IMAGE) .; \
		mkdir -p $(dir $(IMAGE_TAR)); rm -f $(IMAGE_TAR); \
		$$tool save -o $(IMAGE_TAR) $(IMAGE) ;; \
	imagekit) \
		$(IMAGEKIT) deps; \
		base="$(PYTHON_IMAGE)"; \
		if [ -z "$$base" ]; then out=$$($(IMAGEKIT) base $(IMAGE_WORK)); base=$${out##*[[:space:]]}; fi; \
		$(IMAGEKIT) podman $(IMAGE_WORK) build $$($(IMAGEKIT) build-env $(IMAGE_WORK)) \
			--pull=never --build-arg PYTHON_IMAGE=$$base --build-arg VERSION=$(VERSION) $(VERSION_LABEL) \
			-t $(IMAGE) .; \
		mkdir -p $(dir $(IMAGE_TAR)); rm -f $(IMAGE_TAR); \
		$(IMAGEKIT) podman $(IMAGE_WORK) save --format docker-archive -o $(IMAGE_TAR) $(IMAGE) ;; \
	*) echo "make image: no docker daemon, no podman, and no $(IMAGEKIT) (as root)" >&2; exit 1 ;; \
	esac; \
	echo "make image: $(IMAGE) saved to $(IMAGE_TAR) in $$(( $$(date +%s) - start )) s"

image-clean:
	@if [ -x "$(IMAGEKIT)" ] && [ -d "$(IMAGE_WORK)" ]; then $(IMAGEKIT) clean $(IMAGE_WORK); fi
	rm -rf $(IMAGE_WORK) $(IMAGE_TAR)

certs: $(RUNTIME)
	$(BIN)/coschedule certs --dns-name localhost --dns-name 127.0.0.1 --out certs

# The Python package PyPI gets, in $(DIST): one wheel (pure Python: every platform, every
# Python >= 3.11), built in an isolated environment from pyproject.toml. The release checks
# it with `.github/scripts/release_version.py v$(VERSION) --dist $(DIST)` before publishing.
DIST ?= dist
dist:
	@mkdir -p $(DIST)
	rm -f $(DIST)/coschedule-*.whl
	$(PYTHON) -m pip wheel --quiet --no-deps --wheel-dir $(DIST) .

# The release's one-file install, dist/coschedule.yaml: manifests/release (the CRD and the
# self-signed overlay) with IMAGE in every workload, the certs Job included. VERSION must be
# the one pyproject.toml, the chart and the manifests carry (.github/scripts/release_version.py);
# IMAGE defaults to the tag the release pushes, and may be a digest (REPO@sha256:...).
# Standard library and kubectl (or kustomize) only: the release job runs it on a bare runner.
KUSTOMIZE ?= kubectl kustomize
RELEASE_IMAGE_NAME := ghcr.io/coschedule/coschedule
# `make image` has its own IMAGE default (a local name): only an IMAGE given here counts.
# Likewise VERSION: make image reads it from pyproject.toml; a release names it.
RELEASE_VERSION = $(if $(filter command line environment,$(origin VERSION)),$(VERSION))
RELEASE_IMAGE = $(if $(filter command line environment,$(origin IMAGE)),$(IMAGE),$(RELEASE_IMAGE_NAME):$(RELEASE_VERSION))
RELEASE_DIR := build/release
release-manifest:
	@test -n "$(RELEASE_VERSION)" || { echo "usage: make release-manifest VERSION=x.y.z [IMAGE=REPO:TAG|REPO@sha256:...]" >&2; exit 2; }
	@$(PYTHON) .github/scripts/release_version.py "v$(RELEASE_VERSION)" >/dev/null
	@mkdir -p $(RELEASE_DIR) dist
	@image='$(RELEASE_IMAGE)'; last="$${image##*/}"; \
	case "$$image" in \
		*@sha256:*) pin="  newName: \"$${image%%@*}\"\n  digest: \"$${image#*@}\"" ;; \
		*) case "$$last" in \
			*:*) pin="  newName: \"$${image%:*}\"\n  newTag: \"$${last##*:}\"" ;; \
			*) echo "IMAGE=$$image: give REPO:TAG or REPO@sha256:DIGEST" >&2; exit 2 ;; \
		esac ;; \
	esac; \
	printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../../manifests/release\nimages:\n- name: $(RELEASE_IMAGE_NAME)\n%b\n' "$$pin" > $(RELEASE_DIR)/kustomization.yaml
	@{ echo "# coschedule $(RELEASE_VERSION): the ConcurrencyControl CRD and the install with a self-signed certificate."; \
	   echo "#   kubectl apply -f coschedule.yaml"; \
	   $(KUSTOMIZE) $(RELEASE_DIR); } > dist/coschedule.yaml.tmp
	@mv dist/coschedule.yaml.tmp dist/coschedule.yaml
	@echo "dist/coschedule.yaml: $(RELEASE_IMAGE)"

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
