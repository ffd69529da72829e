"""The caBundle of a MutatingWebhookConfiguration: one write, shared by ``coschedule certs``
and the reconciler's certificate keeper."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from coschedule.kube.client import STRATEGIC_MERGE, object_path

WEBHOOK_API = "admissionregistration.k8s.io/v1"


class Patcher(Protocol):
    async def patch(
        self,
        path: str,
        body: Any,
        *,
        content_type: str = ...,
        params: Mapping[str, Any] | None = ...,
    ) -> dict[str, Any]: ...


class NoWebhooks(ValueError):
    """The configuration has no webhook whose caBundle could be set."""


async def patch_ca_bundle(
    api: Patcher, config: Mapping[str, Any], ca_bundle: str, *, precondition: bool = False
) -> None:
    """Set the caBundle of every webhook of ``config`` (base64 of PEM). With
    ``precondition``, only if the configuration is still the version read (else 409)."""
    meta = config.get("metadata") or {}
    name = meta["name"]
    hooks = [h["name"] for h in config.get("webhooks") or [] if isinstance(h, dict)]
    if not hooks:
        raise NoWebhooks(f"MutatingWebhookConfiguration {name} has no webhooks to patch")
    # Strategic merge on the list's merge key (name): other fields and webhooks stay as
    # they are, and so does ownership of fields applied by kubectl.
    body: dict[str, Any] = {
        "webhooks": [{"name": h, "clientConfig": {"caBundle": ca_bundle}} for h in hooks]
    }
    if precondition and meta.get("resourceVersion"):
        body["metadata"] = {"resourceVersion": meta["resourceVersion"]}
    path = object_path(WEBHOOK_API, "mutatingwebhookconfigurations", name=name)
    await api.patch(path, body, content_type=STRATEGIC_MERGE)
