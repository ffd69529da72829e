"""Waiting on what the reconciler, the StatefulSet controller and the scheduler do."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING

import httpx

from tests.e2e.kube import Api, Obj, brief, wait_for
from tests.e2e.world import HOSTNAME, bare_pod, describe_namespace

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


def unschedulable(api: Api, namespace: str, name: str, reason: str) -> tuple[float, str]:
    """(since, message) once the scheduler reports the pod Unschedulable for ``reason``."""

    def probe() -> tuple[float, str] | None:
        pod = api.get("Pod", name, namespace) or {}
        for condition in (pod.get("status") or {}).get("conditions") or ():
            if (
                condition.get("type") == "PodScheduled"
                and condition.get("reason") == "Unschedulable"
                and reason in str(condition.get("message"))
            ):
                since = datetime.fromisoformat(
                    str(condition["lastTransitionTime"]).replace("Z", "+00:00")
                ).timestamp()
                return since, str(condition["message"])
        return None

    return wait_for(
        f"pod {namespace}/{name} to be Unschedulable ({reason})",
        probe,
        describe=lambda: describe_namespace(api, namespace),
    )


@contextlib.contextmanager
def topology_key(e2e: E2E, ns: str, key: str) -> Iterator[None]:
    """The cluster's topology-key, hot-reloaded, for the duration (then put back)."""
    config_dir = e2e.product.config_dir
    assert config_dir is not None
    path = config_dir / "topology-key"

    def applied(value: str) -> bool:
        probe = bare_pod(ns, "probe", {"coschedule.dev/group": "probe"})
        stored = api.create(probe, dry_run=True)
        return (stored["metadata"].get("annotations") or {}).get(
            "coschedule.dev/topology-key"
        ) == value

    api = e2e.api
    tmp = path.with_name(".topology-key.tmp")
    tmp.write_text(key)
    tmp.replace(path)
    try:
        wait_for(f"the webhook to reload topology-key {key}", lambda: applied(key), timeout=20)
        yield
    finally:
        path.unlink(missing_ok=True)
        wait_for("the webhook to reload topology-key", lambda: applied(HOSTNAME), timeout=20)
