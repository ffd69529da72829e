"""The handler reuses one decision context per namespace, and never a stale one: a settings
reload or a namespace label change is seen by the very next admission."""

from __future__ import annotations

import orjson

from bench.payloads import tekton_pod
from coschedule.config.settings import parse_settings
from coschedule.config.store import SettingsStore
from coschedule.marks import NamespaceInfo
from coschedule.server.pod_endpoint import PodEndpoint
from coschedule.server.webhook_metrics import WebhookMetrics
from tests.fixtures import admission_review


class Namespaces:
    def __init__(self) -> None:
        self.labels = {"coschedule.dev/enabled": "true"}

    def get(self, name: str) -> NamespaceInfo | None:
        return NamespaceInfo(dict(self.labels))  # a new object per change, as the cache


def answer(handler: PodEndpoint) -> dict[str, object]:
    status, body = handler.handle(orjson.dumps(admission_review(tekton_pod())))
    assert status == 200
    response: dict[str, object] = orjson.loads(body)["response"]
    return response


def test_contexts_follow_settings_and_namespace_changes() -> None:
    store = SettingsStore(None, {"COSCHEDULE_COSCHEDULE": "pipelineruns"})
    namespaces = Namespaces()
    handler = PodEndpoint(store, WebhookMetrics(), namespaces)
    assert "patch" in answer(handler)

    namespaces.labels = {"coschedule.dev/enabled": "false"}
    assert "patch" not in answer(handler)  # the namespace is no longer enabled

    namespaces.labels = {"coschedule.dev/enabled": "true"}
    assert "patch" in answer(handler)
    store.current = parse_settings({"coschedule": "disabled"})  # what a reload does
    assert "patch" not in answer(handler)
    assert len(handler._contexts) == 1
