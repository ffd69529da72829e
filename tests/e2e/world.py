"""The objects of the test cluster: CRDs for owner kinds, fake nodes, a fake kubelet and
provisioner, and Tekton-shaped runs built from the realistic pod fixtures."""

from __future__ import annotations

import contextlib
import copy
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from tests.e2e.kube import TRACE, Api, ApiError, Obj, brief, wait_for
from tests.fixtures import load_pod

ZONE = "topology.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"
ARCH = "kubernetes.io/arch"

# name -> (zone, arch)
NODES: dict[str, tuple[str, str]] = {
    "e2e-node-a1": ("e2e-zone-a", "amd64"),
    "e2e-node-a2": ("e2e-zone-a", "amd64"),
    "e2e-node-b1": ("e2e-zone-b", "amd64"),
    "e2e-node-b2": ("e2e-zone-b", "arm64"),
}
ARM_NODE = "e2e-node-b2"

NOOP_PROVISIONER = "e2e.coschedule.dev/noop"
# The probe label keeps the namespace-sync probe pods recognisable in webhook logs.
PROBE_GROUP = "e2e-namespace-probe"
WFFC_CLASS = "e2e-wait-for-consumer"


# CRDs ---------------------------------------------------------------------------------


def crd(group: str, version: str, kind: str, plural: str, *, status: bool = True) -> Obj:
    served: Obj = {
        "name": version,
        "served": True,
        "storage": True,
        "schema": {
            "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        },
    }
    if status:
        served["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "plural": plural,
                "singular": kind.lower(),
                "listKind": f"{kind}List",
            },
            "versions": [served],
        },
    }


OWNER_CRDS: tuple[Obj, ...] = (
    crd("tekton.dev", "v1", "PipelineRun", "pipelineruns"),
    crd("tekton.dev", "v1", "TaskRun", "taskruns"),
    crd("argoproj.io", "v1alpha1", "Workflow", "workflows"),
    # cert-manager's kinds, so that its overlay can be dry-run applied.
    crd("cert-manager.io", "v1", "Certificate", "certificates"),
    crd("cert-manager.io", "v1", "Issuer", "issuers"),
    # The Prometheus Operator's, so that the monitoring component and the chart's
    # metrics.* objects can be dry-run applied.
    crd("monitoring.coreos.com", "v1", "ServiceMonitor", "servicemonitors"),
    crd("monitoring.coreos.com", "v1", "PrometheusRule", "prometheusrules"),
)


def install_crds(api: Api) -> None:
    for definition in OWNER_CRDS:
        api.ensure(definition)
    for definition in OWNER_CRDS:
        name = definition["metadata"]["name"]

        def established(name: str = name) -> bool:
            obj = api.must_get("CustomResourceDefinition", name)
            return any(
                c.get("type") == "Established" and c.get("status") == "True"
                for c in (obj.get("status") or {}).get("conditions") or []
            )

        wait_for(f"CRD {name} to be established", established)


# Nodes --------------------------------------------------------------------------------


# Two small nodes of their own for the stuck-run scenarios (tests/e2e/test_stuck.py): 2 CPU
# and 6 pods each, tainted so that no other scenario's pod (nor placeholder) lands there.
POOL_LABEL = "e2e.coschedule.dev/pool"
POOL = "stuck"
POOL_NODES: dict[str, tuple[str, str]] = {
    "e2e-node-s1": ("e2e-zone-s", "amd64"),
    "e2e-node-s2": ("e2e-zone-s", "amd64"),
}
POOL_TAINT = {"key": POOL_LABEL, "value": POOL, "effect": "NoSchedule"}
POOL_RESOURCES = {"cpu": "2", "memory": "8Gi", "pods": "6", "ephemeral-storage": "100Gi"}
POOL_TOLERATION = {"key": POOL_LABEL, "operator": "Equal", "value": POOL, "effect": "NoSchedule"}


def in_pool(manifest: Obj, cpu: str = "100m") -> Obj:
    """The pod on the pool nodes, requesting ``cpu`` (its first step; the others none)."""
    spec = manifest["spec"]
    spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), POOL_LABEL: POOL}
    spec["tolerations"] = [*(spec.get("tolerations") or []), POOL_TOLERATION]
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        container["resources"] = {"requests": {"cpu": "0", "memory": "16Mi"}}
    spec["containers"][0]["resources"] = {
        "requests": {"cpu": cpu, "memory": "64Mi"},
        "limits": {"memory": "64Mi"},
    }
    return manifest


def pool_pods(api: Api) -> list[Obj]:
    found = []
    for name in POOL_NODES:
        found += [
            p
            for p in api.list("Pod", field_selector=f"spec.nodeName={name}")
            if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]
    return found


def make_nodes(api: Api) -> None:
    for name, (zone, arch) in NODES.items():
        make_node(api, name, zone, arch)
        reset_node(api, name)
    for name, (zone, arch) in POOL_NODES.items():
        make_node(api, name, zone, arch, POOL_RESOURCES, {POOL_LABEL: POOL})
        reset_pool_node(api, name)


def make_node(
    api: Api,
    name: str,
    zone: str,
    arch: str,
    resources: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    api.ensure(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    HOSTNAME: name,
                    ARCH: arch,
                    "kubernetes.io/os": "linux",
                    ZONE: zone,
                    "e2e.coschedule.dev/fake": "true",
                    **(labels or {}),
                },
            },
        }
    )
    resources = resources or {
        "cpu": "8",
        "memory": "32Gi",
        "pods": "110",
        "ephemeral-storage": "100Gi",
    }
    api.patch(
        "Node",
        name,
        {
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "fake node of the e2e suite",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
                "nodeInfo": {
                    "architecture": arch,
                    "operatingSystem": "linux",
                    "kubeletVersion": "v1.36.2",
                    "containerRuntimeVersion": "fake://0",
                    "kernelVersion": "6.0.0",
                    "osImage": "e2e",
                    "bootID": name,
                    "machineID": name,
                    "systemUUID": name,
                    "kubeProxyVersion": "",
                },
            }
        },
        subresource="status",
    )


def reset_pool_node(api: Api, name: str) -> None:
    """A pool node schedulable, with only the pool's own taint."""
    api.patch("Node", name, {"spec": {"unschedulable": None, "taints": [POOL_TAINT]}})


def reset_node(api: Api, name: str) -> None:
    """Schedulable and untainted (TaintNodesByCondition gave new nodes a not-ready taint
    that only the node lifecycle controller, which does not run here, would lift)."""
    api.patch("Node", name, {"spec": {"unschedulable": None, "taints": None}})


# Namespaces ---------------------------------------------------------------------------


def make_namespace(
    api: Api,
    name: str,
    mode: str | None,
    *,
    enabled: bool = True,
    extra_labels: dict[str, str] | None = None,
) -> None:
    labels = {
        "coschedule.dev/enabled": "true" if enabled else "false",
        "e2e": "true",
        **(extra_labels or {}),
    }
    if mode is not None:
        labels["coschedule.dev/mode"] = mode
    api.create(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
    )
    # The ServiceAccount the Tekton fixtures run as.
    api.create(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "ci-builder", "namespace": name},
        }
    )


CONTROL_LABEL = "concurrency.coschedule.dev/"


def wait_webhook_sees_control(api: Api, namespace: str, control: str, probe: Obj) -> None:
    """A new ConcurrencyControl reaches the webhook's cache through its watch: dry-run the
    ``probe`` run until it gets the control's label."""
    wait_for(
        f"the webhook to see ConcurrencyControl {namespace}/{control}",
        lambda: (
            CONTROL_LABEL + control in api.create(probe, dry_run=True)["metadata"].get("labels", {})
        ),
        timeout=15,
    )


def run_events(api: Api, namespace: str, name: str) -> list[tuple[str, str]]:
    """(reason, message) of the reconciler's Events on the object ``name``."""
    return [
        (str(e.get("reason")), str(e.get("message")))
        for e in api.list("Event", namespace, field_selector=f"involvedObject.name={name}")
        if e.get("source", {}).get("component") == "coschedule-reconciler"
    ]


def wait_webhook_sees(api: Api, namespace: str, mode: str) -> None:
    """A new namespace reaches the webhook through its watch; until then a pod there gets
    the cluster mode. Probe with dry-run pods (no claims: in per-run modes every pod of a run
    is marked) until the namespace's mode shows."""
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "probe",
            "namespace": namespace,
            "labels": {"coschedule.dev/group": PROBE_GROUP},
        },
        "spec": {
            "serviceAccountName": "ci-builder",
            "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        },
    }
    deadline = time.monotonic() + 15
    seen: Any = None
    while time.monotonic() < deadline:
        stored = api.create(probe, dry_run=True)
        seen = (stored["metadata"].get("annotations") or {}).get("coschedule.dev/mode")
        if seen == mode or (mode == "disabled" and seen is None):
            return
        time.sleep(0.2)
    raise AssertionError(
        f"the webhook did not apply namespace {namespace}'s mode {mode!r} within 15s "
        f"(a dry-run pod got mode {seen!r})"
    )


# Volumes ------------------------------------------------------------------------------


def bound_claim(
    api: Api,
    namespace: str,
    name: str,
    size: str = "1Gi",
    *,
    wait: bool = True,
    pinned: tuple[str, str] | None = None,
) -> None:
    """A user's claim, bound to a hostPath volume (pre-bound, so the persistentvolume-binder
    controller binds it at once; ``wait=False`` where the test only needs it to exist, e.g.
    without kube-controller-manager). Any node can mount it, or with ``pinned`` = (label,
    value) only the nodes with that label (a node-local volume: the hostname label)."""
    pv_name = f"pv-{namespace}-{name}"[:63]
    pv_spec: dict[str, Any] = {
        "capacity": {"storage": size},
        "accessModes": ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": "Delete",
        "storageClassName": "",
        "hostPath": {"path": f"/tmp/e2e/{pv_name}"},
        "claimRef": {"namespace": namespace, "name": name},
    }
    if pinned is not None:
        key, value = pinned
        expression = {"key": key, "operator": "In", "values": [value]}
        pv_spec["nodeAffinity"] = {
            "required": {"nodeSelectorTerms": [{"matchExpressions": [expression]}]}
        }
    api.create(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv_name, "labels": {"e2e": "true"}},
            "spec": pv_spec,
        }
    )
    api.create(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "volumeName": pv_name,
                "resources": {"requests": {"storage": size}},
            },
        }
    )
    if not wait:
        return
    wait_for(
        f"claim {namespace}/{name} to be Bound",
        lambda: (
            (api.must_get("PersistentVolumeClaim", name, namespace).get("status") or {}).get(
                "phase"
            )
            == "Bound"
        ),
        describe=lambda: str(api.get("PersistentVolumeClaim", name, namespace)),
    )


def make_wffc_class(api: Api) -> None:
    api.ensure(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": WFFC_CLASS},
            "provisioner": NOOP_PROVISIONER,
            "volumeBindingMode": "WaitForFirstConsumer",
            "reclaimPolicy": "Delete",
        }
    )


def pinned_to(node: str) -> Obj:
    """A volume's node affinity to one node (a node-local disk)."""
    expression = {"key": HOSTNAME, "operator": "In", "values": [node]}
    return {"required": {"nodeSelectorTerms": [{"matchExpressions": [expression]}]}}


def provisioned_volume(
    claim: Obj,
    name: str,
    host_path: Obj,
    *,
    provisioner: str,
    labels: dict[str, str],
    node: str | None,
) -> Obj:
    """The PersistentVolume a dynamic provisioner makes for ``claim``: its size, access modes
    and class, bound to it by ``claimRef``, reclaim policy Delete, a ``hostPath``; pinned to
    ``node`` by node affinity when given (else any node mounts it)."""
    meta = claim["metadata"]
    spec = claim.get("spec") or {}
    volume_spec: Obj = {
        "capacity": {
            "storage": ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
        },
        "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": "Delete",
        "storageClassName": spec.get("storageClassName"),
        "hostPath": host_path,
        "claimRef": {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "namespace": meta["namespace"],
            "name": meta["name"],
            "uid": meta["uid"],
        },
    }
    if node is not None:
        volume_spec["nodeAffinity"] = pinned_to(node)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {"pv.kubernetes.io/provisioned-by": provisioner},
        },
        "spec": volume_spec,
    }


# Fake kubelet and provisioner ---------------------------------------------------------


@dataclass(kw_only=True)
class Ticker:
    """A daemon thread calling ``step()`` every ``interval`` seconds from ``start()`` to
    ``stop()``. What a step raises is kept (the last ``keep_errors``, for a failure's report)
    and the loop goes on: a test's helper thread must not die on one bad answer."""

    interval: float = 0.25
    errors: list[str] = field(default_factory=list)
    keep_errors: ClassVar[int] = 20
    thread_name: ClassVar[str] = "ticker"
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def step(self) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def note(self, exc: Exception) -> None:
        self.errors.append(repr(exc))
        del self.errors[: -self.keep_errors]

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as exc:  # keep going; reported with a failure
                self.note(exc)
            self._stop.wait(self.interval)


@dataclass
class FakeNodeAgents(Ticker):
    """What the missing kubelets and CSI provisioner would do, reduced to the API calls
    this suite needs: finish graceful deletion of pods on fake nodes (a kubelet confirms it
    with a zero-grace delete), and provision WaitForFirstConsumer claims of the no-op class
    on the node the scheduler selected (an external-provisioner creates a PV with a claimRef
    and node affinity; the binder controller binds them)."""

    thread_name: ClassVar[str] = "fake-kubelet"
    api: Api
    provisioned: dict[str, str] = field(default_factory=dict)  # ns/claim -> node
    # Nodes whose kubelet is dead: nothing there confirms a graceful delete.
    dead: set[str] = field(default_factory=set)

    def step(self) -> None:
        for pod in self.api.list("Pod"):
            meta = pod["metadata"]
            node = (pod.get("spec") or {}).get("nodeName")
            if meta.get("deletionTimestamp") and node and node not in self.dead:
                with contextlib.suppress(ApiError):
                    self.api.delete("Pod", meta["name"], meta["namespace"], grace_period=0)
        for claim in self.api.list("PersistentVolumeClaim"):
            self._provision(claim)

    def _provision(self, claim: Obj) -> None:
        meta = claim["metadata"]
        spec = claim.get("spec") or {}
        node = (meta.get("annotations") or {}).get("volume.kubernetes.io/selected-node")
        if spec.get("storageClassName") != WFFC_CLASS or not node or spec.get("volumeName"):
            return
        key = f"{meta['namespace']}/{meta['name']}"
        if key in self.provisioned:
            return
        pv_name = f"pvc-{meta['uid']}"
        volume = provisioned_volume(
            claim,
            pv_name,
            {"path": f"/tmp/e2e/{pv_name}"},
            provisioner=NOOP_PROVISIONER,
            labels={"e2e": "true"},
            node=node,
        )
        try:
            self.api.create(volume)
        except ApiError as exc:
            if exc.status != 409:
                raise
        self.provisioned[key] = node


# Pods ---------------------------------------------------------------------------------


def pod_phase(api: Api, pod: Obj, phase: str) -> None:
    """What a kubelet reports when the pod's containers end."""
    meta = pod["metadata"]
    api.patch(
        "Pod", meta["name"], {"status": {"phase": phase}}, meta["namespace"], subresource="status"
    )


def node_of(api: Api, namespace: str, name: str) -> str | None:
    pod = api.get("Pod", name, namespace)
    if pod is None:
        return None
    node = (pod.get("spec") or {}).get("nodeName")
    return node if isinstance(node, str) and node else None


def describe_namespace(api: Api, namespace: str) -> str:
    lines = [f"pods in {namespace}:"]
    # List items carry no kind; brief() needs it to show node and phase.
    lines += ["  " + brief({"kind": "Pod", **p}) for p in api.list("Pod", namespace)]
    lines.append("statefulsets:")
    for sts in api.list("StatefulSet", namespace):
        status = sts.get("status") or {}
        owners = [
            f"{o.get('kind')}/{o.get('name')}" for o in sts["metadata"].get("ownerReferences") or []
        ]
        lines.append(
            f"  {sts['metadata']['name']} replicas={status.get('replicas')} owners={owners}"
        )
    lines.append("claims:")
    for pvc in api.list("PersistentVolumeClaim", namespace):
        lines.append(
            f"  {pvc['metadata']['name']} phase={(pvc.get('status') or {}).get('phase')} "
            f"volume={(pvc.get('spec') or {}).get('volumeName')}"
        )
    nodes = []
    for node in api.list("Node"):
        spec = node.get("spec") or {}
        nodes.append(
            f"  {node['metadata']['name']} unschedulable={spec.get('unschedulable', False)} "
            f"taints={[t.get('key') for t in spec.get('taints') or []]}"
        )
    return "\n".join([*lines, "nodes:", *nodes])


# Tekton-shaped runs -------------------------------------------------------------------


def owner_reference(obj: Obj) -> Obj:
    """The controller ownerReference to a stored object, as Tekton's controller sets it."""
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


@dataclass
class TektonRun:
    """A PipelineRun, its TaskRuns and their pods, created through the API as Tekton's
    controller would (owner references to the real objects' uids)."""

    api: Api
    namespace: str
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    pipeline_run: Obj = field(default_factory=dict)
    task_runs: dict[str, Obj] = field(default_factory=dict)
    pods: dict[str, Obj] = field(default_factory=dict)  # task -> stored pod
    manifests: dict[str, Obj] = field(default_factory=dict)  # task -> what its pod was made from
    # Started: the reconciler makes the run's placeholder as soon as it sees the run, from
    # what ``spec`` says of its pods (``run_seed``). Not started (the default): the run
    # is stored pending, so its placeholder is made from its first pod, as these scenarios
    # (whose pods carry constraints their run does not declare) test.
    started: bool = False
    spec: Obj = field(default_factory=dict)

    def create(self) -> TektonRun:
        spec: Obj = {"pipelineRef": {"name": "build-and-test"}, **self.spec}
        if not self.started:
            spec["status"] = "PipelineRunPending"
        self.pipeline_run = self.api.create(
            {
                "apiVersion": "tekton.dev/v1",
                "kind": "PipelineRun",
                "metadata": {
                    "name": self.name,
                    "namespace": self.namespace,
                    "labels": {"tekton.dev/pipeline": "build-and-test", **self.labels},
                },
                "spec": spec,
            }
        )
        self.api.patch(
            "PipelineRun",
            self.name,
            {"status": {"conditions": [_condition("Unknown", "Running")]}},
            self.namespace,
            subresource="status",
        )
        return self

    @property
    def uid(self) -> str:
        return str(self.pipeline_run["metadata"]["uid"])

    def task_run(self, task: str) -> Obj:
        if task not in self.task_runs:
            self.task_runs[task] = self.api.create(
                {
                    "apiVersion": "tekton.dev/v1",
                    "kind": "TaskRun",
                    "metadata": {
                        "name": f"{self.name}-{task}",
                        "namespace": self.namespace,
                        "labels": {
                            "tekton.dev/pipelineRun": self.name,
                            "tekton.dev/pipelineRunUID": self.uid,
                            "tekton.dev/pipelineTask": task,
                            **self.labels,
                        },
                        "ownerReferences": [self._owner(self.pipeline_run)],
                    },
                    "spec": {"taskRef": {"name": task}},
                }
            )
        return self.task_runs[task]

    @staticmethod
    def _owner(obj: Obj) -> Obj:
        return owner_reference(obj)

    def pod_manifest(
        self,
        task: str,
        *,
        fixture: str = "tekton-taskrun",
        claims: dict[str, str] | None = None,
        extra_labels: dict[str, str] | None = None,
    ) -> Obj:
        """The pod Tekton would create for ``task``: the fixture, renamed and re-owned;
        ``claims`` maps the fixture's claim names to this run's claims (a claim mapped to
        "" is dropped with its volume and mounts)."""
        task_run = self.task_run(task)
        pod = load_pod(fixture)
        meta = pod["metadata"]
        meta["name"] = f"{self.name}-{task}-pod"
        meta["namespace"] = self.namespace
        meta.pop("generateName", None)
        labels = meta.setdefault("labels", {})
        labels.update(
            {
                "tekton.dev/pipelineRun": self.name,
                "tekton.dev/pipelineRunUID": self.uid,
                "tekton.dev/pipelineTask": task,
                "tekton.dev/taskRun": task_run["metadata"]["name"],
                "tekton.dev/taskRunUID": task_run["metadata"]["uid"],
                **self.labels,
                **(extra_labels or {}),
            }
        )
        meta["ownerReferences"] = [self._owner(task_run)]
        spec = pod["spec"]
        spec.pop("nodeName", None)
        strip_service_account_volume(spec)
        original = {
            v["persistentVolumeClaim"]["claimName"]
            for v in spec.get("volumes") or []
            if "persistentVolumeClaim" in v
        }
        unknown = set(claims or {}) - original
        assert not unknown, f"fixture {fixture} has no claim(s) {sorted(unknown)}"
        dropped: set[str] = set()
        volumes = []
        for volume in spec.get("volumes") or []:
            source = volume.get("persistentVolumeClaim")
            if source is not None and claims is not None and source["claimName"] in claims:
                target = claims[source["claimName"]]
                if not target:
                    dropped.add(volume["name"])
                    continue
                source["claimName"] = target
            volumes.append(volume)
        spec["volumes"] = volumes
        if dropped:
            for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
                container["volumeMounts"] = [
                    m for m in container.get("volumeMounts") or [] if m["name"] not in dropped
                ]
        return pod

    def create_pod(self, task: str, **kwargs: Any) -> Obj:
        return self.submit(task, self.pod_manifest(task, **kwargs))

    def submit(self, task: str, manifest: Obj) -> Obj:
        """Create the task's pod from ``manifest``, kept to make the pod again (``remake``)."""
        self.manifests[task] = copy.deepcopy(manifest)
        stored = create_pod(self.api, manifest)
        self.pods[task] = stored
        return stored

    def remake(self, task: str) -> Obj | None:
        """What Tekton's TaskRun reconciler does when the pod of an unfinished TaskRun is
        gone: create it again (through the webhook). With placement by node name the
        reconciler deletes a pending pod pinned to a node its run left, for this. None while
        the pod is there."""
        if self.api.get("Pod", self.pod_name(task), self.namespace) is not None:
            return None
        return self.submit(task, copy.deepcopy(self.manifests[task]))

    def pod_name(self, task: str) -> str:
        return f"{self.name}-{task}-pod"

    def finish(self, status: str = "True") -> None:
        """Mark every pod Succeeded and the PipelineRun done (Succeeded=True/False)."""
        for task in self.pods:
            current = self.api.get("Pod", self.pod_name(task), self.namespace)
            if current is not None and (current.get("status") or {}).get("phase") not in (
                "Succeeded",
                "Failed",
            ):
                pod_phase(self.api, current, "Succeeded")
        reason = "Succeeded" if status == "True" else "Failed"
        self.api.patch(
            "PipelineRun",
            self.name,
            {"status": {"conditions": [_condition(status, reason)]}},
            self.namespace,
            subresource="status",
        )


def _condition(status: str, reason: str) -> Obj:
    return {
        "type": "Succeeded",
        "status": status,
        "reason": reason,
        "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def strip_service_account_volume(spec: Obj) -> None:
    """The fixture is the pod as the webhook sees it, after the ServiceAccount admission
    plugin; a controller submits it without the token volume, which the plugin adds again."""
    names = {
        v["name"]
        for v in spec.get("volumes") or []
        if str(v.get("name", "")).startswith("kube-api-access-")
    }
    spec["volumes"] = [v for v in spec.get("volumes") or [] if v["name"] not in names]
    for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        container["volumeMounts"] = [
            m for m in container.get("volumeMounts") or [] if m["name"] not in names
        ]


# The webhook's retryable denials: it has not seen a claim (or any claim) yet. A controller
# such as Tekton's requeues and creates the pod again; so do the tests.
RETRYABLE_RULES = ("rule claim-unknown", "rule claim-cache-not-synced")


def create_pod(api: Api, manifest: Obj, *, timeout: float = 15.0) -> Obj:
    """Create a pod as a controller does: retry the webhook's retryable denials."""
    started = time.monotonic()
    denials = 0
    while True:
        try:
            created = api.create(manifest)
            if TRACE and denials:
                print(
                    f"[e2e] {time.monotonic() - started:6.2f}s and {denials} retryable "
                    f"denial(s) creating pod {manifest['metadata'].get('name')}"
                )
            return created
        except ApiError as exc:
            retryable = exc.status == 403 and any(rule in exc.body for rule in RETRYABLE_RULES)
            if not retryable or time.monotonic() - started > timeout:
                raise
            denials += 1
            time.sleep(0.3)


def bare_pod(namespace: str, name: str, labels: dict[str, str] | None = None) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {
            "serviceAccountName": "ci-builder",
            "automountServiceAccountToken": False,
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
        },
    }


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"
