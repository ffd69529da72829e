"""Deterministic placeholder names: the webhook, the reconciler and users compute the same."""

from __future__ import annotations

import hashlib

from coschedule.contract import PLACEHOLDER_PREFIX

_HEX_DIGITS = 10


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:_HEX_DIGITS]


def run_placeholder(namespace: str, run: str) -> str:
    """The placeholder of a whole run (``pipelineruns``, ``isolate-pipelinerun``)."""
    return PLACEHOLDER_PREFIX + _digest(f"{namespace}/{run}")


def claim_placeholder(namespace: str, claim: str) -> str:
    """The placeholder of a claim (``workspaces``)."""
    return PLACEHOLDER_PREFIX + _digest(f"{namespace}/pvc/{claim}")
