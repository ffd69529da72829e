"""Metadata-only caches on the real kube-apiserver: the webhook's marked-pod and namespace
caches list and watch PartialObjectMetadata (no spec, no status: a fraction of a Tekton
pod to read and decode), with the webhook's own ServiceAccount (no new RBAC), and still
answer: the first pod's claim decision, a namespace's labels. A patch asking for metadata
(the reconciler's release) is answered with it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from coschedule.kube.claim_cache import ClaimCache
from coschedule.kube.client import (
    JSON_PATCH,
    METADATA_ACCEPT,
    KubeClient,
    from_kubeconfig,
    object_path,
)
from coschedule.kube.informer import Informer, Obj
from coschedule.kube.namespace_cache import NamespaceCache
from coschedule.marks import (
    ANNOTATION_CLAIM_TEMPLATES,
    LABEL_PLACEHOLDER,
    ClaimTemplate,
    encode_claim_templates,
)
from tests.e2e.conftest import E2E
from tests.reconcile.conftest import eventually

pytestmark = pytest.mark.e2e

TEMPLATE = ClaimTemplate("source", "source-pvc", {"accessModes": ["ReadWriteOnce"]})
PLACEHOLDER = "aa-metadata"
LABEL = "e2e.coschedule.dev/metadata"


def marked_pod(ns: str, name: str) -> Obj:
    """A marked pod as the webhook leaves it (the namespace is disabled, so the marks are
    the test's), held by a scheduling gate of its own: it stays pending."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {LABEL_PLACEHOLDER: PLACEHOLDER},
            "annotations": {ANNOTATION_CLAIM_TEMPLATES: encode_claim_templates([TEMPLATE])},
        },
        "spec": {
            # The namespace's own ServiceAccount (make_namespace): "default" is made by
            # kube-controller-manager a moment after the namespace, and a pod made before
            # it is refused.
            "serviceAccountName": "ci-builder",
            "automountServiceAccountToken": False,
            "schedulingGates": [{"name": "e2e.coschedule.dev/hold"}],
            "containers": [{"name": "step", "image": "busybox", "command": ["true"]}],
        },
    }


def test_marked_pods_and_namespaces_are_watched_as_metadata_and_answer(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    api = e2e.api
    ns = namespace(mode="disabled", labels={LABEL: "before"})
    api.create(marked_pod(ns, "first"))
    assert e2e.product.webhook_kubeconfig is not None
    creds = from_kubeconfig(e2e.product.webhook_kubeconfig)
    assert e2e.product.reconciler_kubeconfig is not None
    reconciler = from_kubeconfig(e2e.product.reconciler_kubeconfig)
    seen: list[Obj] = []

    def raw(obj: Obj) -> Obj:
        seen.append(obj)
        return obj

    async def watch() -> None:
        client = KubeClient(creds, user_agent="coschedule-webhook")
        releaser = KubeClient(reconciler, user_agent="coschedule-reconciler")
        claims = ClaimCache(client)
        namespaces = NamespaceCache(Informer(client, "/api/v1/namespaces", name="namespaces"))
        # What the API server sends the marked-pod cache, before its transform.
        pods = Informer(
            client,
            f"/api/v1/namespaces/{ns}/pods",
            name="raw",
            label_selector=LABEL_PLACEHOLDER,
            transform=raw,
            metadata_only=True,
        )
        tasks = [asyncio.create_task(i.run()) for i in (claims.pods, namespaces.informer, pods)]
        try:
            await asyncio.wait_for(
                asyncio.gather(
                    claims.pods.synced.wait(), namespaces.informer.synced.wait(), pods.synced.wait()
                ),
                20,
            )
            assert claims.pod_decision(ns, PLACEHOLDER) == (TEMPLATE,)
            info = namespaces.get(ns)
            assert info is not None
            assert info.labels.get(LABEL) == "before"

            # Through the watch: a new pod, a change of the first's status, a label.
            api.create(marked_pod(ns, "second"))
            api.patch(
                "Pod",
                "first",
                {"status": {"conditions": [{"type": "e2e.coschedule.dev/seen", "status": "True"}]}},
                ns,
                subresource="status",
            )
            api.patch("Namespace", ns, {"metadata": {"labels": {LABEL: "after"}}})
            await eventually(lambda: f"{ns}/second" in claims.pods)
            await eventually(lambda: (namespaces.get(ns) or info).labels.get(LABEL) == "after")
            # The list's first pod, the watch's second, then the first's status change.
            await eventually(lambda: len(seen) >= 3)
            # A patch (the reconciler's release) answered with the pod's metadata alone.
            answer = await releaser.patch(
                object_path("v1", "pods", ns, "second"),
                [
                    {
                        "op": "add",
                        "path": "/metadata/labels/e2e.coschedule.dev~1patched",
                        "value": "y",
                    }
                ],
                content_type=JSON_PATCH,
                accept=METADATA_ACCEPT,
            )
            assert answer["kind"] == "PartialObjectMetadata", answer
            assert "spec" not in answer
            assert answer["metadata"]["labels"]["e2e.coschedule.dev/patched"] == "y"
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await client.aclose()
            await releaser.aclose()

    asyncio.run(watch())
    assert {o["metadata"]["name"] for o in seen} == {"first", "second"}
    for obj in seen:
        assert obj["apiVersion"] == "meta.k8s.io/v1", obj
        assert obj["kind"] == "PartialObjectMetadata", obj
        assert "spec" not in obj, obj
        assert "status" not in obj, obj
        assert obj["metadata"]["labels"][LABEL_PLACEHOLDER] == PLACEHOLDER
        assert ANNOTATION_CLAIM_TEMPLATES in obj["metadata"]["annotations"]
