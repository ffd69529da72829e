# syntax=docker/dockerfile:1
# coschedule: one image, two processes (`coschedule serve`, `coschedule reconcile`).
#
#   make image                      # docker, or podman (../shared/image where no registry)
#   docker build -t ghcr.io/coschedule/coschedule:0.1.0 .
#
# Every stage uses the same base, pinned by digest (a multi-arch index: linux/amd64 and
# linux/arm64), so the virtualenv built in the first stages runs unchanged in the last.
# Update tag and digest together (`docker buildx imagetools inspect python:3.11-slim`).
ARG PYTHON_IMAGE=python:3.11.14-slim@sha256:c8271b1f627d0068857dce5b53e14a9558603b527e46f1f901722f935b786a39

# ---- deps: the locked dependencies, before any code, so a code change reuses this layer ----
FROM ${PYTHON_IMAGE} AS deps

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
# The locks pin every package, transitive ones included, by version and hash (`make lock`
# writes them from pyproject.toml); pip refuses anything else. All ship as binary wheels, so
# no compiler is needed. /opt/build holds the build backend (setuptools, wheel), /opt/venv
# what runs; pip compiles the bytecode now, so the read-only runtime never writes any.
COPY requirements/build.lock requirements/runtime.lock ./requirements/
RUN python -m venv /opt/build \
    && /opt/build/bin/python -m pip install --require-hashes --no-deps --only-binary=:all: \
       -r requirements/build.lock \
    && python -m venv /opt/venv \
    && /opt/venv/bin/python -m pip install --require-hashes --no-deps --only-binary=:all: \
       --no-compile -r requirements/runtime.lock \
    && /opt/venv/bin/python -m compileall -q /opt/venv/lib

# ---- venv: the dependencies as they run, without an installer ----
FROM deps AS venv
RUN /opt/venv/bin/python -m pip uninstall --yes pip setuptools

# ---- app: the package's wheel, its files staged under /staging/opt/venv ----
FROM deps AS app
COPY pyproject.toml README.md ./
COPY coschedule ./coschedule
RUN /opt/build/bin/python -m pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
    && /opt/venv/bin/python -m pip install --no-deps --no-compile --no-warn-script-location \
       --root /staging /wheels/coschedule-*.whl \
    && /opt/venv/bin/python -m compileall -q -s /staging -p / /staging/opt/venv/lib

# ---- runtime: the interpreter and /opt/venv, nothing else ----
FROM ${PYTHON_IMAGE} AS runtime

LABEL org.opencontainers.image.title="coschedule" \
      org.opencontainers.image.description="Keeps the pods of one workflow run on one node: admission webhook and reconciler" \
      org.opencontainers.image.licenses="Apache-2.0"

# No package manager run, no compiler: drop the base image's pip too, and add the
# unprivileged user the manifests run as (UID/GID 65532, no home, no shell).
RUN python -m pip uninstall --yes pip setuptools wheel \
    && groupadd --system --gid 65532 coschedule \
    && useradd --system --uid 65532 --gid 65532 --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin coschedule

# The dependencies (changed only by the locks), then the package (changed by every commit).
COPY --from=venv /opt/venv /opt/venv
COPY --from=app /staging/opt/venv /opt/venv

# Read-only root filesystem: no bytecode writes, HOME and temp files under /tmp (an
# emptyDir in the manifests).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TMPDIR=/tmp

USER 65532:65532
WORKDIR /tmp

# 8443 HTTPS (admission), 8080 webhook probes and metrics, 8081 reconciler probes.
EXPOSE 8443 8080 8081
ENTRYPOINT ["coschedule"]
# With no arguments: the webhook with a self-signed certificate made under /tmp/certs and the
# built-in settings (`docker run -p 8443:8443 IMAGE`); the manifests give their own args.
CMD ["serve"]

# Last, so that a new version rebuilds one metadata layer only (`make image VERSION=...`).
ARG VERSION=dev
LABEL org.opencontainers.image.version="${VERSION}"
