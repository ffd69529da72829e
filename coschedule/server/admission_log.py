"""One log line per admission decision: INFO when denied, warned or refused (at the door,
as a bad request, or not decidable yet; on both endpoints), DEBUG when allowed. Nothing is
built for an allowed pod unless DEBUG is on.

The fields (``extra``, so the JSON formatter makes them keys): ``uid``, ``namespace``,
``pod`` (its name, or its generateName while it has none), ``run``, ``mode``,
``placeholder``, ``rule`` and ``latency_ms`` (body read to answer encoded), plus
``warnings`` and ``ops`` where there are any, and ``bind_wait_ms`` and ``pinned`` after a
wait for the placeholder's binding; a refused request has ``endpoint``, ``status``,
``error`` and ``client`` and no decision fields. The formatters (``coschedule.logs``) cap
every field, so a request's oversized name cannot make an oversized line. The reconciler's
action lines use the same names for ``run``, ``namespace`` and ``placeholder``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from coschedule.config.settings import Settings
from coschedule.marks import run_identity
from coschedule.mutate.decision import Decision
from coschedule.wire.review import Review

log = logging.getLogger("coschedule.admission")


def _pod_name(pod: Any) -> str | None:
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    if not isinstance(meta, Mapping):
        return None
    name = meta.get("name") or meta.get("generateName")
    return name if isinstance(name, str) else None


def _run(pod: Any, settings: Settings) -> str | None:
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    if not isinstance(labels, Mapping):
        return None
    identity = run_identity(labels, settings.group_labels)
    return identity[1] if identity is not None else None


def _latency_ms(start: float) -> float:
    return round((time.perf_counter() - start) * 1000, 3)


def decided(
    review: Review,
    pod: Any,
    decision: Decision,
    settings: Settings,
    start: float,
    bind_wait: float | None = None,
) -> None:
    """A decided pod: INFO when denied or warned, DEBUG when allowed as it is. After a wait
    for the placeholder's binding (``bind_wait`` seconds), ``bind_wait_ms`` and ``pinned``
    (bound in time: pinned at admission) say so."""
    if not decision.allowed:
        level, message = logging.INFO, "admission denied"
    elif decision.warnings:
        level, message = logging.INFO, "admission allowed with warnings"
    else:
        level, message = logging.DEBUG, "admission allowed"
    if not log.isEnabledFor(level):
        return
    extra: dict[str, object] = {
        "uid": review.uid,
        "namespace": review.namespace,
        "pod": _pod_name(pod),
        "run": _run(pod, settings),
        "mode": decision.mode_label,
        "placeholder": decision.placeholder,
        "rule": decision.rule,
        "latency_ms": _latency_ms(start),
        "ops": len(decision.ops),
    }
    if bind_wait is not None:
        extra["bind_wait_ms"] = round(bind_wait * 1000, 3)
        extra["pinned"] = decision.allowed and decision.by_node_name and not decision.unbound
    if review.dry_run:
        extra["dry_run"] = True
    if decision.warnings:
        extra["warnings"] = decision.warnings
    log.log(level, message, extra=extra)


def refused(
    endpoint: str,
    status: int,
    rule: str,
    error: str,
    *,
    review: Review | None = None,
    object_field: str = "pod",
    start: float | None = None,
    client: object = None,
) -> None:
    """A request refused before any decision: at the door (405 method, 400 Content-Type,
    413 body size: no review was read), as a bad request (400: not a usable review, or a
    malformed object), or not decidable yet (503). ``object_field`` names the object: ``pod``
    on ``/mutate``, ``run`` on ``/mutate-runs``; ``client`` is the peer's address."""
    extra: dict[str, object] = {
        "endpoint": endpoint,
        "status": status,
        "uid": review.uid if review is not None else None,
        "namespace": review.namespace if review is not None else None,
        object_field: _pod_name(review.object) if review is not None else None,
        "rule": rule,
        "error": error,
    }
    if start is not None:
        extra["latency_ms"] = _latency_ms(start)
    if isinstance(client, list | tuple) and len(client) == 2:
        extra["client"] = f"{client[0]}:{client[1]}"
    log.info("admission refused: %s", rule, extra=extra)
