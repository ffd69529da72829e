"""The real stack for tests/real: the e2e tier's control plane (with every controller a cluster
runs, node lifecycle included: real kubelets heartbeat), real nodes and Tekton's controller
from ../shared/realstack, the suite's volume provisioner, and coschedule deployed as the e2e
tier deploys it (tests/e2e/install.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e.cluster import (
    KCM_CONTROLLERS_WITH_KUBELETS,
    ControlPlane,
    find_binaries,
    find_kubectl,
)
from tests.e2e.install import Coschedule
from tests.e2e.kube import Api
from tests.real.volumes import HostPathProvisioner

ROOT = Path(__file__).resolve().parents[2]
# ../shared/realstack beside the checkout; COSCHEDULE_REALSTACK names another folder.
REALSTACK_ENV = "COSCHEDULE_REALSTACK"
REQUIRED_ENV = "COSCHEDULE_REAL_REQUIRED"
STEP_IMAGE = "localhost/busybox:local"
PLACEHOLDER_IMAGE = "localhost/pause:local"
TEKTON_VERSION = "v1.11.1"
STUCK_GRACE = 3
CONFIG = {
    "coschedule": "workspaces",
    "stuck-grace-seconds": str(STUCK_GRACE),
    "placeholder-image": PLACEHOLDER_IMAGE,
}
RECONCILERS = ("reconciler-a",)
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
    plane: ControlPlane
    product: Coschedule
    provisioner: HostPathProvisioner
    stack: Any  # realstack.RealStack (imported from ../shared/realstack at run time)
    workdir: Path
    nodes: tuple[str, ...] = GENERAL_NODES
    notes: list[str] = field(default_factory=list)

    def logs(self, lines: int = 40) -> str:
        """The tails of coschedule's processes and the control plane's, Tekton's controller
        and the provisioner's errors: what a failure report carries."""
        out = [self.plane.tails(lines)]
        tekton = self.stack.workdir / "tekton" / "logs"
        for log in sorted(tekton.glob("*.log")) if tekton.is_dir() else []:
            text = log.read_text(errors="replace").splitlines()[-12:]
            out.append(f"----- tekton {log.name}, last 12 lines\n" + "\n".join(text))
        if self.provisioner.errors:
            out.append("----- provisioner errors\n" + "\n".join(self.provisioner.errors[-5:]))
        return "\n".join(out)

    def pod_log(self, namespace: str, pod: str, container: str) -> str:
        text: str = self.stack.pod_log(namespace, pod, container)
        return text


def start(tmp: Path, notes: list[str]) -> RealCluster:
    """Start everything; on failure stop what was started and raise with the reason."""
    sys.path.insert(0, str(realstack_dir()))
    from realstack import RealStack

    binaries, _source = find_binaries()
    assert binaries is not None
    # unix sockets live in the stack's work dir: keep its path short
    workdir = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))
    plane = ControlPlane(binaries, tmp, kcm_controllers=KCM_CONTROLLERS_WITH_KUBELETS)
    stack = None
    provisioner: HostPathProvisioner | None = None
    try:
        api = plane.start_apiserver()
        plane.start_controllers()
        assert plane.admin_kubeconfig is not None
        stack = RealStack(workdir, plane.admin_kubeconfig)
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
        return RealCluster(api, plane, product, provisioner, stack, workdir, notes=notes)
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
    keep = bool(os.environ.get("REAL_KEEP"))
    cluster.provisioner.stop()
    stop_stack(cluster.stack, cluster.workdir, keep=keep)
    cluster.plane.stop()
