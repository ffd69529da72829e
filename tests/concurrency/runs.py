"""Realistic runs for the concurrency tests: PipelineRuns and Workflows as users and
triggers submit them, and as the API server stores them."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


def pipeline_run(
    name: str,
    *,
    namespace: str = "ci",
    params: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    status: str | None = None,
    created: str = "2026-11-23T02:00:00Z",
    succeeded: str | None = None,
    rv: str = "1",
) -> Obj:
    spec: Obj = {
        "pipelineRef": {"name": "build-and-test"},
        "params": [{"name": k, "value": v} for k, v in (params or {}).items()],
        "taskRunTemplate": {"serviceAccountName": "ci-builder"},
        "workspaces": [
            {
                "name": "source",
                "volumeClaimTemplate": {
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Gi"}},
                    }
                },
            }
        ],
    }
    if status is not None:
        spec["status"] = status
    meta = _metadata(name, namespace, rv, created, labels, annotations)
    meta["labels"] = {"tekton.dev/pipeline": "build-and-test", **meta["labels"]}
    obj: Obj = {
        "apiVersion": "tekton.dev/v1",
        "kind": "PipelineRun",
        "metadata": meta,
        "spec": spec,
    }
    if succeeded is not None:
        obj["status"] = {
            "conditions": [{"type": "Succeeded", "status": succeeded, "reason": "Done"}]
        }
    return obj


def workflow(
    name: str,
    *,
    namespace: str = "ci",
    params: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    suspend: bool | None = None,
    shutdown: str | None = None,
    phase: str | None = None,
    created: str = "2026-11-23T02:00:00Z",
    rv: str = "1",
) -> Obj:
    spec: Obj = {
        "entrypoint": "main",
        "workflowTemplateRef": {"name": "deploy"},
        "arguments": {"parameters": [{"name": k, "value": v} for k, v in (params or {}).items()]},
    }
    if suspend is not None:
        spec["suspend"] = suspend
    if shutdown is not None:
        spec["shutdown"] = shutdown
    meta = _metadata(name, namespace, rv, created, labels, annotations)
    meta["labels"] = {"workflows.argoproj.io/creator": "ci", **meta["labels"]}
    obj: Obj = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": meta,
        "spec": spec,
    }
    if phase is not None:
        obj["status"] = {"phase": phase}
    return obj


def _metadata(
    name: str,
    namespace: str,
    rv: str,
    created: str,
    labels: dict[str, str] | None,
    annotations: dict[str, str] | None,
) -> Obj:
    """A run's metadata as the API returns it (the engine's own labels are added by the
    caller, before the test's)."""
    meta: Obj = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{name}",
        "resourceVersion": rv,
        "creationTimestamp": created,
        "labels": dict(labels or {}),
    }
    if annotations:
        meta["annotations"] = annotations
    return meta


def control(name: str, spec: Obj, *, namespace: str = "ci") -> Obj:
    return {
        "apiVersion": "coschedule.dev/v1alpha1",
        "kind": "ConcurrencyControl",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
