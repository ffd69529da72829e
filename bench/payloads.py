"""Deterministic AdmissionReview payloads for the benchmarks (no randomness, no network).

Every generator returns a fresh object. Sizes are of compact JSON
(``separators=(",", ":")``); ``python bench/payloads.py`` prints and checks them:

- ``small_pod``: ~2 KB, one container, in a Tekton run, one PVC.
- ``tekton_pod``: ~9.6 KB, ``tests/fixtures/pods/tekton-taskrun.json``.
- ``fat_pod``: ~60 KB, 20 containers with many env vars and mounts, a run label, one PVC.
- ``not_selected_pod``: ~2 KB, in no run (no run labels), so the webhook's fast path.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Final

ROOT: Final[Path] = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fixtures import DEFAULT_TOLERATIONS, admission_review  # noqa: E402

TEKTON_FIXTURE: Final[Path] = ROOT / "tests" / "fixtures" / "pods" / "tekton-taskrun.json"
AFFINE_FIXTURE: Final[Path] = (
    ROOT / "tests" / "fixtures" / "pods" / "tekton-taskrun-user-affinity.json"
)

# A fixed request uid keeps review_bytes() byte-for-byte reproducible.
BENCH_UID: Final[str] = "6f1d2c3b-4a59-4e8d-9c7b-0a1b2c3d4e5f"

# Compact-JSON size bounds (bytes) each payload is meant to fall in.
SIZE_BOUNDS: Final[dict[str, tuple[int, int]]] = {
    "small_pod": (1_500, 2_500),
    "tekton_pod": (8_000, 10_000),
    "fat_pod": (55_000, 65_000),
    "not_selected_pod": (1_500, 2_500),
}

_FAT_CONTAINERS: Final[int] = 20
_FAT_ENV_VARS: Final[int] = 37
_FAT_MOUNTS: Final[int] = 6


def compact(obj: Any) -> bytes:
    """The compact JSON encoding the sizes are measured in."""
    return json.dumps(obj, separators=(",", ":")).encode()


def _sa_volume() -> tuple[dict[str, Any], dict[str, Any]]:
    """The projected token volume (and its mount) the ServiceAccount plugin adds."""
    name = "kube-api-access-b7x4k"
    volume = {
        "name": name,
        "projected": {
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {
                    "configMap": {
                        "name": "kube-root-ca.crt",
                        "items": [{"key": "ca.crt", "path": "ca.crt"}],
                    }
                },
                {
                    "downwardAPI": {
                        "items": [
                            {
                                "path": "namespace",
                                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                            }
                        ]
                    }
                },
            ],
            "defaultMode": 420,
        },
    }
    mount = {
        "name": name,
        "readOnly": True,
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
    }
    return volume, mount


def _defaulted_spec(
    volumes: list[dict[str, Any]], containers: list[dict[str, Any]], service_account: str
) -> dict[str, Any]:
    return {
        "volumes": volumes,
        "containers": containers,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": service_account,
        "serviceAccount": service_account,
        "securityContext": {},
        "schedulerName": "default-scheduler",
        "tolerations": [dict(t) for t in DEFAULT_TOLERATIONS],
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    }


def _single_container_pod(
    name: str, namespace: str, labels: dict[str, str], claim: str
) -> dict[str, Any]:
    sa_volume, sa_mount = _sa_volume()
    container = {
        "name": "step-run",
        "image": "docker.io/library/alpine:3.20",
        "command": ["/bin/sh", "-c"],
        "args": ["make -C /workspace/source test"],
        "env": [{"name": "CI", "value": "true"}],
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}},
        "volumeMounts": [{"name": "ws-1bcf2", "mountPath": "/workspace/source"}, sa_mount],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }
    volumes = [
        {"name": "ws-1bcf2", "persistentVolumeClaim": {"claimName": claim}},
        sa_volume,
    ]
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": _defaulted_spec(volumes, [container], "ci-builder"),
        "status": {},
    }


def small_pod() -> dict[str, Any]:
    """~2 KB: one container, labelled as part of Tekton run ``bench-run``, one PVC."""
    labels = {
        "app.kubernetes.io/managed-by": "tekton-pipelines",
        "tekton.dev/pipeline": "bench",
        "tekton.dev/pipelineRun": "bench-run",
        "tekton.dev/pipelineTask": "unit",
        "tekton.dev/taskRun": "bench-run-unit",
    }
    return _single_container_pod("bench-run-unit-pod", "ci", labels, "pvc-0b3e5c7a91")


def not_selected_pod() -> dict[str, Any]:
    """~2 KB: like ``small_pod`` but in no run (no run or group labels)."""
    labels = {
        "app.kubernetes.io/name": "reports",
        "app.kubernetes.io/part-of": "analytics",
        "app.kubernetes.io/component": "batch",
    }
    return _single_container_pod("reports-adhoc-7k2q9", "analytics", labels, "reports-cache")


def tekton_pod() -> dict[str, Any]:
    """~9.6 KB: the ``tekton-taskrun`` fixture, read from disk on every call."""
    data = json.loads(TEKTON_FIXTURE.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise TypeError(f"{TEKTON_FIXTURE} is not a JSON object")
    return data


def affine_tekton_pod() -> dict[str, Any]:
    """The ``tekton-taskrun-user-affinity`` fixture: a TaskRun pod whose podTemplate gave it
    a nodeSelector, tolerations, a required node affinity and a required anti-affinity (the
    policy rules, ``unsatisfiable-placement`` among them, read them all)."""
    data = json.loads(AFFINE_FIXTURE.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise TypeError(f"{AFFINE_FIXTURE} is not a JSON object")
    return data


def denied_pod() -> dict[str, Any]:
    """The Tekton pod with an invalid mode label: denied (rule invalid-mode), so the webhook
    logs one INFO line for it (the logging-cost step)."""
    pod = tekton_pod()
    pod["metadata"]["labels"]["coschedule.dev/mode"] = "sometimes"
    return pod


def fat_pod() -> dict[str, Any]:
    """~60 KB: 20 containers, each with 37 env vars and 6+1 mounts; a run label; one PVC."""
    sa_volume, sa_mount = _sa_volume()
    volumes: list[dict[str, Any]] = [
        {"name": "shared", "persistentVolumeClaim": {"claimName": "pvc-fa7fa7fa70"}},
    ]
    volumes += [{"name": f"scratch-{m}", "emptyDir": {}} for m in range(1, _FAT_MOUNTS)]
    volumes.append(sa_volume)
    containers: list[dict[str, Any]] = []
    for c in range(_FAT_CONTAINERS):
        env = [
            {"name": f"SETTING_{c:02d}_{e:02d}", "value": f"value-{c:02d}-{e:02d}-{'x' * 12}"}
            for e in range(_FAT_ENV_VARS)
        ]
        mounts = [{"name": "shared", "mountPath": f"/shared/c{c:02d}"}]
        mounts += [
            {"name": f"scratch-{m}", "mountPath": f"/scratch/{m}/c{c:02d}"}
            for m in range(1, _FAT_MOUNTS)
        ]
        mounts.append(sa_mount)
        containers.append(
            {
                "name": f"worker-{c:02d}",
                "image": f"registry.example.com/bench/worker-{c % 4}:1.0.{c}",
                "command": ["/bin/worker"],
                "args": [f"--shard={c}", f"--of={_FAT_CONTAINERS}"],
                "env": env,
                "resources": {
                    "limits": {"memory": "256Mi"},
                    "requests": {"cpu": "50m", "memory": "128Mi"},
                },
                "volumeMounts": mounts,
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }
        )
    labels = {
        "app.kubernetes.io/name": "bench-fat",
        "tekton.dev/pipelineRun": "bench-fat-run",
        "tekton.dev/taskRun": "bench-fat-run-shards",
    }
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": "bench-fat-run-shards-pod", "namespace": "ci", "labels": labels},
        "spec": _defaulted_spec(volumes, containers, "ci-builder"),
        "status": {},
    }


def asgi_post_scope(headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    """The scope uvicorn hands an ASGI app for a POST to ``/mutate`` over TLS."""
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "https",
        "path": "/mutate",
        "raw_path": b"/mutate",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8443),
        "state": {},
    }


def review_bytes(pod: dict[str, Any], *, dry_run: bool = False) -> bytes:
    """The compact AdmissionReview v1 CREATE request for ``pod``, with a fixed uid."""
    return compact(admission_review(pod, dry_run=dry_run, uid=BENCH_UID))


PAYLOADS: Final = {
    "small_pod": small_pod,
    "tekton_pod": tekton_pod,
    "fat_pod": fat_pod,
    "not_selected_pod": not_selected_pod,
}


def main() -> int:
    ok = True
    print(f"{'payload':18} {'pod bytes':>10} {'review bytes':>13}  target")
    for name, make in PAYLOADS.items():
        pod = make()
        size = len(compact(pod))
        low, high = SIZE_BOUNDS[name]
        in_range = low <= size <= high
        ok = ok and in_range
        verdict = "ok" if in_range else "OUT OF RANGE"
        print(f"{name:18} {size:>10} {len(review_bytes(pod)):>13}  {low}-{high} {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
