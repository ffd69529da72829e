"""The ConcurrencyControl API's names. The marks it puts on runs (labels, annotation) are
part of the webhook<->reconciler protocol and live in ``coschedule.marks``."""

from __future__ import annotations

GROUP = "coschedule.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ConcurrencyControl"
PLURAL = "concurrencycontrols"

# Longest control name: it becomes the name part of a label key.
MAX_CONTROL_NAME = 63
