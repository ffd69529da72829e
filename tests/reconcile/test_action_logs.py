"""Every action the reconciler takes is one INFO line with the admission log's field names
(``run``, ``namespace``, ``placeholder``, ``reason``) and the action it took."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from tests.reconcile.apiserver import MiniApi
from tests.reconcile.conftest import eventually
from tests.reconcile.pods import marked_pod, placeholder_of
from tests.reconcile.test_controller import make as make  # the fixture
from tests.reconcile.test_controller import placeholder_pod

FIELDS = ("action", "namespace", "placeholder", "run", "reason")


def actions(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "coschedule.reconcile" and hasattr(r, "action") and r.levelno == logging.INFO
    ]


def taken(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.action for r in actions(caplog)]  # type: ignore[attr-defined]


async def test_create_event_evict_and_delete_are_logged_with_the_same_fields(
    api: MiniApi, make: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="coschedule.reconcile")
    await make()
    pod = marked_pod("tekton-taskrun", node="worker-1")
    name = placeholder_of(pod)
    api.put("pods", pod)
    await eventually(lambda: "record-event" in taken(caplog))
    assert taken(caplog)[:2] == ["create-statefulset", "record-event"]

    api.put("pods", placeholder_pod(name, "worker-1"))
    await asyncio.sleep(0.1)
    api.edit("nodes", None, "worker-1", {"spec": {"unschedulable": True}})
    await eventually(lambda: "delete-placeholder-pod" in taken(caplog))

    api.edit("pods", "ci", pod["metadata"]["name"], {"status": {"phase": "Succeeded"}})
    api.edit(
        "pipelineruns",
        "ci",
        "pr-7f3k2",
        {"status": {"conditions": [{"type": "Succeeded", "status": "True"}]}},
    )
    await eventually(lambda: "delete-statefulset" in taken(caplog), within=3)

    for record in actions(caplog):
        fields = {field: getattr(record, field) for field in FIELDS}
        assert fields["namespace"] == "ci", record.getMessage()
        assert fields["placeholder"] == name, record.getMessage()
        assert fields["run"] == "pr-7f3k2", record.getMessage()
        assert fields["reason"], record.getMessage()
    events = [r.reason for r in actions(caplog) if r.action == "record-event"]  # type: ignore[attr-defined]
    assert events == ["PlaceholderCreated", "PlaceholderMoved", "PlaceholderDeleted"]
    by_action = {r.action: r for r in actions(caplog)}  # type: ignore[attr-defined]
    evicted = by_action["delete-placeholder-pod"]
    assert (evicted.reason, evicted.node) == ("cordoned", "worker-1")  # type: ignore[attr-defined]
    assert evicted.pod == f"{name}-0"  # type: ignore[attr-defined]
