"""The public names of run concurrency control (labels, annotation, API), in one place."""

from __future__ import annotations

GROUP = "coschedule.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ConcurrencyControl"
PLURAL = "concurrencycontrols"

# Per control: concurrency.coschedule.dev/<control>: <key, or its hash>.
LABEL_PREFIX = "concurrency.coschedule.dev/"
# On every run the webhook grouped: lets the reconciler watch only those (a label selector
# cannot match a key prefix).
LABEL_GROUPED = "coschedule.dev/concurrency"
GROUPED_VALUE = "grouped"
# On a run we made pending, until we start or cancel it.
ANNOTATION_PENDING_BY = "coschedule.dev/pending-by"
PENDING_BY_US = "concurrency"

# Longest control name: it becomes the name part of a label key.
MAX_CONTROL_NAME = 63
