"""coschedule as deployed, for ``bench.scheduler``: the real ``coschedule serve`` registered
with the benchmark's kube-apiserver through a MutatingWebhookConfiguration (caBundle, the
manifests' webhooks), the real ``coschedule reconcile`` lifting the gates, and
kube-controller-manager's StatefulSet controller rendering the placeholders' pods (only
that controller: no node lifecycle, so the kubelet-less nodes stay Ready; no garbage
collector, so a batch cleans up after itself). The processes run under the shipped RBAC
(``tests/e2e/install.py``, the e2e suite's installer).

A batch is 30 PipelineRuns x 10 Tekton pods with real owners: each PipelineRun and its
TaskRuns are created through the API first (outside the measured window, as Tekton has
them before their pods), each pod owned by its TaskRun's uid, so the reconciler resolves
and owns the placeholder as it does in a cluster.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tests.e2e.cluster import ControlPlane, find_kubectl
from tests.e2e.install import Coschedule
from tests.e2e.world import install_crds, owner_reference

Obj = dict[str, Any]

NAMESPACE: Final = "bench-deployed"
RECONCILER: Final = "bench-reconciler"
CONFIG: Final = {"coschedule": "pipelineruns"}  # placement auto: gate, then the pin
KCM_CONTROLLERS: Final = "statefulset"
TEKTON: Final = "/apis/tekton.dev/v1/namespaces"
PLACEHOLDER_PODS: Final = "app.kubernetes.io/component=affinity-assistant"
# What the reconciler's log says (its message texts, coschedule/reconcile/executor.py).
LOG_COUNTS: Final = {
    "released": "released pod onto its placeholder's node",
    "release_stale": "pod changed since it was seen; looking again",
    "labels_restored": "placeholder lost its labels; restored",
    "created": "created placeholder",
    "api_errors": "retrying",
}


@dataclass
class Deployed:
    product: Coschedule
    log_path: Path
    log_offset: int = 0

    @property
    def webhook_pid(self) -> int:
        assert self.product.webhook is not None
        return self.product.webhook.pid

    @property
    def reconciler_pid(self) -> int:
        return self.product.reconcilers[RECONCILER].pid

    def log_counts(self) -> dict[str, int]:
        """How often each of ``LOG_COUNTS`` was logged since the last call."""
        data = self.log_path.read_bytes()
        text = data[self.log_offset :].decode(errors="replace")
        self.log_offset = len(data)
        return {
            key: len(re.findall(re.escape(message), text)) for key, message in LOG_COUNTS.items()
        }


def deploy(
    plane: ControlPlane,
    binaries: Path,
    workdir: Path,
    log: Callable[[str], None],
    kcm_args: tuple[str, ...] = (),
) -> Deployed:
    """Owner CRDs, the StatefulSet controller (with ``kcm_args``), coschedule's RBAC,
    webhook and reconciler."""
    assert plane.api is not None
    install_crds(plane.api)
    plane.kcm_controllers = KCM_CONTROLLERS
    plane.kcm_args = kcm_args
    plane.start_controller_manager()
    product = Coschedule(plane, workdir)
    product.deploy(find_kubectl(binaries), dict(CONFIG), (RECONCILER,))
    if product.reconciler_missing:
        raise RuntimeError(product.reconciler_missing)
    plane.api.ensure(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": NAMESPACE, "labels": {"coschedule.dev/enabled": "true"}},
        }
    )
    log("coschedule deployed: webhook registered, reconciler leading")
    return Deployed(product, workdir / "logs" / f"{RECONCILER}.log")


def pipeline_run(namespace: str, run: str, batch_label: str, batch: str) -> Obj:
    return {
        "apiVersion": "tekton.dev/v1",
        "kind": "PipelineRun",
        "metadata": {
            "name": run,
            "namespace": namespace,
            "labels": {"tekton.dev/pipeline": "build-and-test", batch_label: batch},
        },
        # The run's workspace, as its pods mount it (``<run>-ws``): what a PipelineRun that
        # shares a claim between its tasks declares, and what its placeholder mounts.
        "spec": {
            "pipelineRef": {"name": "build-and-test"},
            "workspaces": [{"name": "source", "persistentVolumeClaim": {"claimName": f"{run}-ws"}}],
        },
    }


def task_run(namespace: str, pod: Obj, owner: Obj, batch_label: str, batch: str) -> Obj:
    labels = pod["metadata"]["labels"]
    return {
        "apiVersion": "tekton.dev/v1",
        "kind": "TaskRun",
        "metadata": {
            "name": labels["tekton.dev/taskRun"],
            "namespace": namespace,
            "labels": {
                "tekton.dev/pipelineRun": labels["tekton.dev/pipelineRun"],
                "tekton.dev/pipelineRunUID": owner["metadata"]["uid"],
                "tekton.dev/pipelineTask": labels["tekton.dev/pipelineTask"],
                batch_label: batch,
            },
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": {"taskRef": {"name": labels["tekton.dev/pipelineTask"]}},
    }


async def own(
    create: Callable[[str, Obj], Any],
    namespace: str,
    runs: dict[str, list[Obj]],
    batch_label: str,
    batch: str,
) -> None:
    """Create each run's PipelineRun and TaskRuns; point its pods (in place) at them."""

    async def one(run: str, pods: list[Obj]) -> None:
        owner = await create(
            f"{TEKTON}/{namespace}/pipelineruns", pipeline_run(namespace, run, batch_label, batch)
        )
        for pod in pods:
            made = await create(
                f"{TEKTON}/{namespace}/taskruns",
                task_run(namespace, pod, owner, batch_label, batch),
            )
            labels = pod["metadata"]["labels"]
            labels["tekton.dev/pipelineRunUID"] = owner["metadata"]["uid"]
            labels["tekton.dev/taskRunUID"] = made["metadata"]["uid"]
            pod["metadata"]["ownerReferences"] = [owner_reference(made)]

    await asyncio.gather(*(one(run, pods) for run, pods in runs.items()))


async def clean(request: Callable[..., Any], namespace: str, selector: str) -> None:
    """A batch's pods, runs, placeholders and their pods (no garbage collector runs)."""
    zero = {"gracePeriodSeconds": "0"}
    await request(
        "DELETE", f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": selector, **zero}
    )
    await asyncio.sleep(2)  # the reconciler's cache sees them gone: no placeholder made again
    for plural in ("taskruns", "pipelineruns"):
        await request(
            "DELETE", f"{TEKTON}/{namespace}/{plural}", params={"labelSelector": selector}
        )
    # The reconciler deletes a done run's StatefulSet; its runs are gone, so it would, but
    # not before the next batch: the placeholders go now, with their pods.
    await request(
        "DELETE",
        f"/apis/apps/v1/namespaces/{namespace}/statefulsets",
        params={"labelSelector": "app.kubernetes.io/managed-by=coschedule"},
    )
    await request(
        "DELETE",
        f"/api/v1/namespaces/{namespace}/pods",
        params={"labelSelector": PLACEHOLDER_PODS, **zero},
    )
