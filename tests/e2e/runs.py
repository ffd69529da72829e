"""Waiting on what the reconciler, the StatefulSet controller and the scheduler do."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import httpx

from tests.e2e.kube import Api, Obj, brief, wait_for
from tests.e2e.world import describe_namespace

if TYPE_CHECKING:
    from tests.e2e.conftest import E2E

TIMEOUT = 30.0
# Teardown after completion: the reconciler learns that an owner reports done when it asks
# it again (pod events, then every 30 s while the run is quiet): allow one period and more.
TEARDOWN_TIMEOUT = 50.0
PLACEHOLDER_LABELS = {
    "app.kubernetes.io/component": "affinity-assistant",
    "app.kubernetes.io/managed-by": "coschedule",
}


def placeholder_pod_name(placeholder: str) -> str:
    return f"{placeholder}-0"


def wait_statefulset(api: Api, namespace: str, placeholder: str, timeout: float = TIMEOUT) -> Obj:
    return wait_for(
        f"the reconciler to create StatefulSet {namespace}/{placeholder}",
        lambda: api.get("StatefulSet", placeholder, namespace),
        timeout=timeout,
        describe=lambda: describe_namespace(api, namespace),
    )


def wait_statefulset_gone(
    api: Api, namespace: str, placeholder: str, why: str, timeout: float = TEARDOWN_TIMEOUT
) -> None:
    wait_for(
        f"StatefulSet {namespace}/{placeholder} to be deleted ({why})",
        lambda: api.get("StatefulSet", placeholder, namespace) is None,
        timeout=timeout,
        describe=lambda: describe_namespace(api, namespace),
    )


def wait_bound(
    api: Api,
    namespace: str,
    pod: str,
    *,
    node: str | None = None,
    not_node: str | None = None,
    not_uid: str | None = None,
    timeout: float = TIMEOUT,
    remake: Callable[[], object] | None = None,
) -> Obj:
    """The pod as stored once the scheduler bound it (to ``node`` when given, to another
    node than ``not_node``, as another pod than ``not_uid``). ``remake`` is called while the
    pod is gone: the test plays its engine (``TektonRun.remake``)."""

    def probe() -> Obj | None:
        obj = api.get("Pod", pod, namespace)
        if obj is None and remake is not None:
            remake()
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return None
        if not_uid is not None and obj["metadata"]["uid"] == not_uid:
            return None
        bound = (obj.get("spec") or {}).get("nodeName")
        if not bound or (node is not None and bound != node) or bound == not_node:
            return None
        return obj

    where = f" on {node}" if node else f" off {not_node}" if not_node else ""
    return wait_for(
        f"pod {namespace}/{pod} to be bound{where}",
        probe,
        timeout=timeout,
        describe=lambda: describe_namespace(api, namespace),
    )


def wait_placeholder_bound(
    api: Api,
    namespace: str,
    placeholder: str,
    *,
    not_node: str | None = None,
    not_uid: str | None = None,
    timeout: float = TIMEOUT,
) -> Obj:
    """The placeholder's pod, once the StatefulSet exists and the scheduler bound it."""
    wait_statefulset(api, namespace, placeholder, timeout)
    return wait_bound(
        api,
        namespace,
        placeholder_pod_name(placeholder),
        not_node=not_node,
        not_uid=not_uid,
        timeout=timeout,
    )


def node(obj: Obj) -> str:
    name = (obj.get("spec") or {}).get("nodeName")
    assert isinstance(name, str), f"not bound: {brief(obj)}"
    assert name, f"not bound: {brief(obj)}"
    return name


def claim_names(obj: Obj) -> list[str]:
    """Claims a pod (or a StatefulSet's pod template) mounts."""
    spec = obj.get("spec") or {}
    if "template" in spec:
        spec = spec["template"].get("spec") or {}
    return [
        v["persistentVolumeClaim"]["claimName"]
        for v in spec.get("volumes") or []
        if "persistentVolumeClaim" in v
    ]


def leader_metric(e2e: E2E, name: str, **labels: str) -> float:
    """A sample from the leading reconciler's /metrics (0 when absent)."""
    leader = e2e.product.leader()
    assert leader is not None, "no reconciler holds the Lease"
    port = e2e.product.reconciler_ports[leader]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name) + (r"\{" + re.escape(wanted) + r"\}" if wanted else "") + r" (\S+)"
    match = re.search("^" + pattern + "$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0
