"""A small synchronous Kubernetes API client for the tests (httpx, JSON dicts) and waiting."""

from __future__ import annotations

import json
import os
import ssl
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

Obj = dict[str, Any]
T = TypeVar("T")
TRACE = bool(os.environ.get("E2E_TRACE"))  # print how long each wait took (with -s)

# kind -> (apiVersion, plural, namespaced) for what the suite creates from manifests.
KINDS: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("v1", "namespaces", False),
    "ServiceAccount": ("v1", "serviceaccounts", True),
    "ConfigMap": ("v1", "configmaps", True),
    "Secret": ("v1", "secrets", True),
    "Node": ("v1", "nodes", False),
    "Pod": ("v1", "pods", True),
    "PersistentVolume": ("v1", "persistentvolumes", False),
    "PersistentVolumeClaim": ("v1", "persistentvolumeclaims", True),
    "StatefulSet": ("apps/v1", "statefulsets", True),
    "Deployment": ("apps/v1", "deployments", True),
    "Job": ("batch/v1", "jobs", True),
    "ClusterRole": ("rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("rbac.authorization.k8s.io/v1", "rolebindings", True),
    "CustomResourceDefinition": (
        "apiextensions.k8s.io/v1",
        "customresourcedefinitions",
        False,
    ),
    "MutatingWebhookConfiguration": (
        "admissionregistration.k8s.io/v1",
        "mutatingwebhookconfigurations",
        False,
    ),
    "MutatingAdmissionPolicy": (
        "admissionregistration.k8s.io/v1",
        "mutatingadmissionpolicies",
        False,
    ),
    "MutatingAdmissionPolicyBinding": (
        "admissionregistration.k8s.io/v1",
        "mutatingadmissionpolicybindings",
        False,
    ),
    "StorageClass": ("storage.k8s.io/v1", "storageclasses", False),
    "Lease": ("coordination.k8s.io/v1", "leases", True),
    "Event": ("v1", "events", True),
    "Pipeline": ("tekton.dev/v1", "pipelines", True),
    "PipelineRun": ("tekton.dev/v1", "pipelineruns", True),
    "TaskRun": ("tekton.dev/v1", "taskruns", True),
    "Workflow": ("argoproj.io/v1alpha1", "workflows", True),
    "ConcurrencyControl": ("coschedule.dev/v1alpha1", "concurrencycontrols", True),
}


class ApiError(AssertionError):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:2000]}")
        self.status = status
        self.body = body


def path_for(kind: str, namespace: str | None = None, name: str | None = None) -> str:
    api_version, plural, namespaced = KINDS[kind]
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    if namespaced and namespace:
        root += f"/namespaces/{quote(namespace, safe='')}"
    root += f"/{plural}"
    return root + (f"/{quote(name, safe='')}" if name else "")


class Api:
    """Admin access to the test apiserver."""

    def __init__(
        self,
        server: str,
        ca_file: Path | None,
        token: str | None,
        *,
        client_cert: tuple[Path, Path] | None = None,
    ) -> None:
        """Bearer ``token``, or a client certificate (cert file, key file); ``ca_file`` None
        trusts the system's CAs."""
        self.server = server
        verify = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
        if client_cert is not None:
            verify.load_cert_chain(str(client_cert[0]), str(client_cert[1]))
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.http = httpx.Client(base_url=server, verify=verify, headers=headers, timeout=30)

    def close(self) -> None:
        self.http.close()

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        ok_missing: bool = False,
    ) -> Obj | None:
        content = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": content_type} if content is not None else {}
        response = self.http.request(method, path, content=content, headers=headers, params=params)
        if ok_missing and response.status_code == 404:
            return None
        if response.status_code >= 300:
            raise ApiError(method, path, response.status_code, response.text)
        if not response.content:
            return {}
        doc = response.json()
        return doc if isinstance(doc, dict) else {}

    # Typed conveniences -----------------------------------------------------------------

    def get(self, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        return self.request("GET", path_for(kind, namespace, name), ok_missing=True)

    def must_get(self, kind: str, name: str, namespace: str | None = None) -> Obj:
        obj = self.get(kind, name, namespace)
        assert obj is not None, f"{kind} {namespace or ''}/{name} does not exist"
        return obj

    def list(
        self,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Obj]:
        params: dict[str, str] = {}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        doc = self.request("GET", path_for(kind, namespace), params=params) or {}
        items = doc.get("items") or []
        return [item for item in items if isinstance(item, dict)]

    def create(self, obj: Obj, *, namespace: str | None = None, dry_run: bool = False) -> Obj:
        kind = str(obj["kind"])
        ns = namespace or (obj.get("metadata") or {}).get("namespace")
        params = {"dryRun": "All"} if dry_run else None
        created = self.request("POST", path_for(kind, ns), obj, params=params)
        assert created is not None
        return created

    def ensure(self, obj: Obj) -> None:
        """Create, tolerating AlreadyExists."""
        try:
            self.create(obj)
        except ApiError as exc:
            if exc.status != 409:
                raise

    def patch(
        self,
        kind: str,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        patch_type: str = "application/merge-patch+json",
    ) -> Obj:
        path = path_for(kind, namespace, name) + (f"/{subresource}" if subresource else "")
        patched = self.request("PATCH", path, patch, content_type=patch_type)
        assert patched is not None
        return patched

    def delete(
        self,
        kind: str,
        name: str,
        namespace: str | None = None,
        *,
        grace_period: int | None = None,
        propagation: str | None = None,
    ) -> None:
        body: Obj = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_period is not None:
            body["gracePeriodSeconds"] = grace_period
        if propagation is not None:
            body["propagationPolicy"] = propagation
        self.request("DELETE", path_for(kind, namespace, name), body, ok_missing=True)


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    *,
    timeout: float = 30.0,
    interval: float = 0.2,
    describe: Callable[[], str] | None = None,
) -> T:
    """Poll ``probe`` until it returns something other than None/False; on timeout fail with
    ``what`` and ``describe()`` (the objects that matter, as they are now)."""
    started = time.monotonic()
    deadline = started + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = probe()
            if value is not None and value is not False:
                if TRACE:
                    print(f"[e2e] {time.monotonic() - started:6.2f}s waiting for {what}")
                return value
        except (ApiError, httpx.TransportError) as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            details = ""
            if describe is not None:
                try:
                    details = describe()
                except Exception as exc:  # a description must never hide the timeout
                    details = f"(could not describe: {exc})"
            error = f"\nlast error: {last_error}" if last_error else ""
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {what}{error}\n{details}"
            )
        time.sleep(interval)


def brief(obj: Obj | None) -> str:
    """One line per object: what a failure message needs (name, node, phase, deletion)."""
    if obj is None:
        return "<absent>"
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    parts = [f"{obj.get('kind', '?')} {meta.get('namespace', '')}/{meta.get('name')}"]
    if "uid" in meta:
        parts.append(f"uid={str(meta['uid'])[:8]}")
    if obj.get("kind") == "Pod":
        parts.append(f"node={spec.get('nodeName')}")
        parts.append(f"phase={status.get('phase')}")
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") != "True":
                parts.append(f"unschedulable: {cond.get('message')}")
    if meta.get("deletionTimestamp"):
        parts.append(f"deleting since {meta['deletionTimestamp']}")
    return " ".join(parts)


def dump(obj: Obj | None) -> str:
    return json.dumps(obj, indent=1, sort_keys=True) if obj is not None else "<absent>"
