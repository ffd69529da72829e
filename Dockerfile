# syntax=docker/dockerfile:1
# coschedule: one image, two processes (`coschedule serve`, `coschedule reconcile`).
#
#   docker build -t ghcr.io/coschedule/coschedule:0.1.0 .
#
# Both stages use the same base, pinned by digest (a multi-arch index: linux/amd64 and
# linux/arm64), so the virtualenv built in the first stage runs unchanged in the second.
# Update tag and digest together (`docker buildx imagetools inspect python:3.11-slim`).
ARG PYTHON_IMAGE=python:3.11.14-slim@sha256:c8271b1f627d0068857dce5b53e14a9558603b527e46f1f901722f935b786a39

# ---- builder: build the wheel, install it and its pinned dependencies into /opt/venv ----
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY coschedule ./coschedule

# Every runtime dependency is pinned (==) in pyproject.toml and ships as a binary wheel, so
# no compiler is needed even here. pip compiles the bytecode at install time, so the
# read-only runtime never has to write any.
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
    && python -m venv /opt/venv \
    && /opt/venv/bin/python -m pip install --no-compile /wheels/coschedule-*.whl \
    && /opt/venv/bin/python -m compileall -q /opt/venv/lib \
    && /opt/venv/bin/python -m pip uninstall --yes pip setuptools

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

COPY --from=builder /opt/venv /opt/venv

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
CMD ["serve", "--cert-dir", "/etc/coschedule/tls", "--config-dir", "/etc/coschedule/config"]
