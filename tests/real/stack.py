"""The real stack for tests/real: the e2e tier's control plane (with every controller a cluster
runs, node lifecycle included: real kubelets heartbeat), real nodes and Tekton's controller
from ../shared/realstack, the suite's volume provisioner, and coschedule deployed as the e2e
tier deploys it (tests/e2e/install.py).

Or, with ``COSCHEDULE_REAL_KUBECONFIG=FILE``, a cluster of the user's (kind, a staging
cluster) that already runs Tekton and coschedule: nothing is started or installed, and the
scenarios that need the suite's own stack (its processes, its small nodes) skip saying so."""

from __future__ import annotations

import base64
import contextlib
import importlib
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.cluster import (
    KCM_CONTROLLERS_WITH_KUBELETS,
    ControlPlane,
    find_binaries,
    find_kubectl,
)
from tests.e2e.install import Coschedule
from tests.e2e.kube import Api
from tests.real.volumes import LOCAL_CLASS, NETWORK_CLASS, HostPathProvisioner

ROOT = Path(__file__).resolve().parents[2]
# ../shared/realstack beside the checkout; COSCHEDULE_REALSTACK names another folder.
REALSTACK_ENV = "COSCHEDULE_REALSTACK"
REQUIRED_ENV = "COSCHEDULE_REAL_REQUIRED"
# Another cluster: its kubeconfig, the StorageClasses to use (a node-local one, default: the
# cluster's default class; one whose volumes any node mounts, default: none, and the
# scenarios that need one skip), and the step image (any image with a POSIX shell).
KUBECONFIG_ENV = "COSCHEDULE_REAL_KUBECONFIG"
LOCAL_CLASS_ENV = "COSCHEDULE_REAL_LOCAL_CLASS"
NETWORK_CLASS_ENV = "COSCHEDULE_REAL_NETWORK_CLASS"
IMAGE_ENV = "COSCHEDULE_REAL_IMAGE"
EXTERNAL = bool(os.environ.get(KUBECONFIG_ENV))
STEP_IMAGE = os.environ.get(IMAGE_ENV) or (
    "docker.io/library/busybox:1.36" if EXTERNAL else "localhost/busybox:local"
)
PLACEHOLDER_IMAGE = "localhost/pause:local"
TEKTON_VERSION = "v1.11.1"
STUCK_GRACE = 3
CONFIG = {
    "coschedule": "workspaces",
    "stuck-grace-seconds": str(STUCK_GRACE),
    "placeholder-image": PLACEHOLDER_IMAGE,
}
RECONCILERS = ("reconciler-a",)
# Node lifecycle (kube-controller-manager): a node whose kubelet stopped posting is marked
# Ready Unknown and tainted node.kubernetes.io/unreachable after 30 s (Kubernetes' default:
# 50 s), checked every 2 s (default 5 s). The kubelets renew their Lease every 10 s (their
# default), so a busy machine does not flap. Pods keep the DefaultTolerationSeconds admission
# plugin's 300 s for not-ready/unreachable (the API server's default).
NODE_LIFECYCLE = ("--node-monitor-grace-period=30s", "--node-monitor-period=2s")
# Three general nodes (two-run and relocation scenarios need two, a cordon needs a third to go
# to); two small pool nodes (allocatable 0.5 CPU) for the stuck-run scenarios, tainted so that
# only those scenarios' pods go there. Every node sees the machine's CPUs; what is reserved
# only shrinks what the scheduler packs.
POOL_LABEL = "real.coschedule.dev/pool"
POOL = "stuck"
GENERAL = {"labels": {POOL_LABEL: "general"}}
SMALL = {
    "labels": {POOL_LABEL: POOL},
    "taints": [f"{POOL_LABEL}={POOL}:NoSchedule"],
    "cpu_reserved": "1500m",
}
NODES: dict[str, dict[str, Any]] = {
    "real-1": GENERAL,
    "real-2": GENERAL,
    "real-3": GENERAL,
    "real-s1": SMALL,
    "real-s2": SMALL,
}
GENERAL_NODES = tuple(n for n, o in NODES.items() if o is GENERAL)
POOL_NODES = tuple(n for n, o in NODES.items() if o is SMALL)


def realstack_dir() -> Path:
    return Path(os.environ.get(REALSTACK_ENV) or ROOT.parent / "shared" / "realstack").resolve()


def unavailable() -> str | None:
    """Why the stack cannot start here (None: it can)."""
    if EXTERNAL:
        kubeconfig = Path(os.environ[KUBECONFIG_ENV])
        return None if kubeconfig.is_file() else f"{KUBECONFIG_ENV}: no file {kubeconfig}"
    folder = realstack_dir()
    if not (folder / "realstack.py").is_file():
        return f"no realstack at {folder}"
    if os.geteuid() != 0:
        return "realstack needs root (mounts, cgroups, network namespaces)"
    binaries, source = find_binaries()
    if binaries is None:
        return source
    return None


@dataclass
class RealCluster:
    api: Api
    workdir: Path
    nodes: tuple[str, ...]
    local_class: str  # "" = the cluster's default StorageClass
    network_class: str | None  # None: no class whose volumes any node mounts
    kubeconfig: Path | None = None  # an admin's, for the CLI (`coschedule explain --run`)
    plane: ControlPlane | None = None  # None on a cluster of the user's (and below)
    product: Coschedule | None = None
    provisioner: HostPathProvisioner | None = None
    stack: Any = None  # realstack.RealStack (imported from ../shared/realstack at run time)
    notes: list[str] = field(default_factory=list)

    def require(self, *needs: str) -> None:
        """Skip, saying why, a scenario that needs what only the suite's own stack has."""
        if "own-stack" in needs and self.stack is None:
            pytest.skip(f"real: needs the suite's own stack (not with {KUBECONFIG_ENV})")
        if "network-class" in needs and self.network_class is None:
            pytest.skip(f"real: needs a StorageClass any node mounts ({NETWORK_CLASS_ENV})")
        if "two-nodes" in needs and len(self.nodes) < 2:
            pytest.skip(f"real: needs two schedulable nodes (the cluster has {self.nodes})")

    def logs(self, lines: int = 40) -> str:
        """The tails of coschedule's processes and the control plane's, Tekton's controller
        and the provisioner's errors: what a failure report carries."""
        if self.plane is None:
            return "(a cluster of the user's: see its coschedule and Tekton logs)"
        out = [self.plane.tails(lines)]
        tekton = self.stack.workdir / "tekton" / "logs"
        for log in sorted(tekton.glob("*.log")) if tekton.is_dir() else []:
            text = log.read_text(errors="replace").splitlines()[-12:]
            out.append(f"----- tekton {log.name}, last 12 lines\n" + "\n".join(text))
        if self.provisioner is not None and self.provisioner.errors:
            out.append("----- provisioner errors\n" + "\n".join(self.provisioner.errors[-5:]))
        return "\n".join(out)

    def pod_log(self, namespace: str, pod: str, container: str) -> str:
        """A container's output: from the node's log files on the suite's stack (its kubelets
        serve no logs to the API server), through the API elsewhere."""
        if self.stack is not None:
            text: str = self.stack.pod_log(namespace, pod, container)
            return text
        response = self.api.http.get(
            f"/api/v1/namespaces/{namespace}/pods/{pod}/log", params={"container": container}
        )
        response.raise_for_status()
        return response.text


def connect(workdir: Path, notes: list[str]) -> RealCluster:
    """A cluster of the user's, named by its kubeconfig: Tekton and coschedule must run there."""
    kubeconfig = Path(os.environ[KUBECONFIG_ENV])
    api = api_from_kubeconfig(kubeconfig, workdir)
    if api.get("CustomResourceDefinition", "pipelineruns.tekton.dev") is None:
        raise RuntimeError(f"{kubeconfig}: no Tekton Pipelines (CRD pipelineruns.tekton.dev)")
    hooks = [
        hook.get("name", "")
        for config in api.list("MutatingWebhookConfiguration")
        for hook in config.get("webhooks") or []
    ]
    if not any(name.endswith("coschedule.dev") for name in hooks):
        raise RuntimeError(f"{kubeconfig}: coschedule is not installed (no coschedule webhook)")
    nodes = tuple(
        node["metadata"]["name"]
        for node in api.list("Node")
        if not node["spec"].get("unschedulable")
        and not any(t.get("effect") == "NoSchedule" for t in node["spec"].get("taints") or [])
    )
    notes.append(f"cluster of {kubeconfig}: schedulable nodes {', '.join(nodes)}")
    return RealCluster(
        api,
        workdir,
        nodes,
        local_class=os.environ.get(LOCAL_CLASS_ENV, ""),
        network_class=os.environ.get(NETWORK_CLASS_ENV) or None,
        kubeconfig=kubeconfig,
        notes=notes,
    )


def api_from_kubeconfig(kubeconfig: Path, workdir: Path) -> Api:
    """Its current context: a bearer token or a client certificate (exec plugins are not
    supported: give the suite a kubeconfig with a token, e.g. from `kubectl create token`)."""
    doc = yaml.safe_load(kubeconfig.read_text())
    context = next(c["context"] for c in doc["contexts"] if c["name"] == doc.get("current-context"))
    cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in doc["users"] if u["name"] == context["user"])

    def material(key: str, name: str, holder: dict[str, Any]) -> Path | None:
        if holder.get(f"{key}-data"):
            path = workdir / name
            path.write_bytes(base64.b64decode(holder[f"{key}-data"]))
            path.chmod(0o600)
            return path
        return Path(holder[key]) if holder.get(key) else None

    ca = material("certificate-authority", "ca.crt", cluster)
    cert = material("client-certificate", "client.crt", user)
    key = material("client-key", "client.key", user)
    token = user.get("token")
    if not token and user.get("tokenFile"):
        token = Path(user["tokenFile"]).read_text().strip()
    if not token and not (cert and key):
        raise RuntimeError(
            f"{kubeconfig}: the current user has no token or client certificate "
            "(exec plugins are not supported)"
        )
    return Api(cluster["server"], ca, token, client_cert=(cert, key) if cert and key else None)


def start(tmp: Path, notes: list[str]) -> RealCluster:
    """Start everything; on failure stop what was started and raise with the reason."""
    if EXTERNAL:
        return connect(tmp, notes)
    sys.path.insert(0, str(realstack_dir()))
    real_stack: Any = importlib.import_module("realstack").RealStack

    binaries, _source = find_binaries()
    assert binaries is not None
    # unix sockets live in the stack's work dir: keep its path short
    workdir = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))
    plane = ControlPlane(
        binaries, tmp, kcm_controllers=KCM_CONTROLLERS_WITH_KUBELETS, kcm_args=NODE_LIFECYCLE
    )
    stack = None
    provisioner: HostPathProvisioner | None = None
    try:
        api = plane.start_apiserver()
        plane.start_controllers()
        assert plane.admin_kubeconfig is not None
        stack = real_stack(workdir, plane.admin_kubeconfig)
        stack.images()
        for name, options in NODES.items():
            stack.add_node(name, **options)
        stack.start_tekton()
        provisioner = HostPathProvisioner(api, workdir / "pv")
        provisioner.install()
        provisioner.start()
        product = Coschedule(plane, tmp)
        product.deploy(find_kubectl(binaries), CONFIG, RECONCILERS)
        notes.append(
            f"real stack in {workdir}: nodes {', '.join(NODES)}, Tekton {TEKTON_VERSION}; "
            f"logs in {tmp / 'logs'}"
        )
        return RealCluster(
            api,
            workdir,
            GENERAL_NODES,
            LOCAL_CLASS,
            NETWORK_CLASS,
            kubeconfig=plane.admin_kubeconfig,
            plane=plane,
            product=product,
            provisioner=provisioner,
            stack=stack,
            notes=notes,
        )
    except BaseException:
        print(f"\nreal stack setup failed; component logs:\n{plane.tails(60)}")
        if provisioner is not None:
            provisioner.stop()
        stop_stack(stack, workdir)
        plane.stop()
        raise


def stop_stack(stack: Any, workdir: Path, *, keep: bool = False) -> None:
    if stack is not None:
        with contextlib.suppress(Exception):
            stack.stop(purge=not keep)
    if not keep:
        shutil.rmtree(workdir, ignore_errors=True)


def stop(cluster: RealCluster) -> None:
    """Tekton, the nodes (their containers, mounts, cgroups, bridges), the provisioner, our
    processes and the control plane: the machine as it was."""
    if cluster.plane is None:
        cluster.api.close()
        return
    keep = bool(os.environ.get("REAL_KEEP"))
    if cluster.provisioner is not None:
        cluster.provisioner.stop()
    stop_stack(cluster.stack, cluster.workdir, keep=keep)
    cluster.plane.stop()
