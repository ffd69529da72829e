"""The artifact tier's stack (tests/real/test_artifact.py): the image `make image` builds,
imported into realstack nodes of a control plane of its own, and installed as users install
it, with the realstack adaptation of tests/real/artifact/ and nothing else.

Its own control plane: the tier's shared stack runs coschedule as host processes under the
same webhook names, and here kube-apiserver must call the webhook through its Service
(``--enable-aggregator-routing=true``: the Service's ready endpoints, the pods' IPs)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import ipaddress
import json
import os
import re
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from tests.e2e.cluster import (
    KCM_CONTROLLERS_WITH_KUBELETS,
    ControlPlane,
    find_binaries,
    find_kubectl,
)
from tests.e2e.kube import Api, Obj, wait_for
from tests.real.stack import ROOT, realstack_dir
from tests.real.volumes import HostPathProvisioner

IMAGE_REPO = "localhost/coschedule"
NAMESPACE = "coschedule-system"
DEPLOYMENTS = ("coschedule-webhook", "coschedule-reconciler")
OVERLAY = ROOT / "tests" / "real" / "artifact"
SERVICE_DNS = f"coschedule-webhook.{NAMESPACE}.svc"
# Two: a cordon moves a run from one to the other, two isolated runs take one each. (Each
# kubelet takes inotify instances, which the machine's other stacks share.)
NODES = ("art-1", "art-2")
API_NODE = NODES[0]  # the node whose bridge carries the API relay (tests/real/artifact)
IMAGEKIT_ENV = "COSCHEDULE_IMAGEKIT"
# Set by `make e2e-real` where ../shared/image is beside the checkout: fail, not skip.
REQUIRED_ENV = "COSCHEDULE_ARTIFACT_REQUIRED"


def imagekit() -> Path:
    return Path(os.environ.get(IMAGEKIT_ENV) or ROOT.parent / "shared" / "image" / "imagekit")


def image_work() -> str:
    """The imagekit work dir `make image` uses (podman's store, the base), shared with it."""
    return os.environ.get("IMAGE_WORK", "/tmp/coschedule-image")


def unavailable() -> str | None:
    kit = imagekit()
    return None if kit.is_file() else f"no imagekit at {kit} (../shared/image)"


# Set by `make e2e-artifact ARTIFACT_REUSE=1` (.ci/run, right after `make image`): the image
# and archive `make image` made, installed as they are instead of built again.
REUSE_IMAGE_ENV = "COSCHEDULE_ARTIFACT_IMAGE"
REUSE_ARCHIVE_ENV = "COSCHEDULE_ARTIFACT_ARCHIVE"
VERSION_LABEL = "org.opencontainers.image.version"


@dataclass
class Build:
    image: str
    archive: Path
    seconds: float
    image_id: str = ""  # sha256:<config digest>: the imageID a node's containerd reports
    version: str = ""  # the image's version label

    def __post_init__(self) -> None:
        self.image_id, self.version = archive_identity(self.archive)

    @property
    def name(self) -> str:
        return self.image.rsplit(":", 1)[0]

    @property
    def tag(self) -> str:
        return self.image.rsplit(":", 1)[1]


def archive_identity(archive: Path) -> tuple[str, str]:
    """A docker-archive's image ID (the digest of its config, as containerd names the image it
    imports) and its version label, read from the archive itself."""
    with tarfile.open(archive) as tar:
        manifest = json.load(_member(tar, "manifest.json"))
        assert len(manifest) == 1, f"{archive}: {len(manifest)} images"
        config_bytes = _member(tar, manifest[0]["Config"]).read()
    labels = json.loads(config_bytes).get("config", {}).get("Labels") or {}
    return f"sha256:{hashlib.sha256(config_bytes).hexdigest()}", labels.get(VERSION_LABEL, "")


def _member(tar: tarfile.TarFile, name: str) -> IO[bytes]:
    member = tar.extractfile(name)
    assert member is not None, f"no {name} in the archive"
    return member


def reused_build() -> Build | None:
    """The image `make image` made just before (`make e2e-artifact ARTIFACT_REUSE=1`)."""
    image, archive = os.environ.get(REUSE_IMAGE_ENV), os.environ.get(REUSE_ARCHIVE_ENV)
    if not image:
        return None
    assert archive, f"{REUSE_IMAGE_ENV} without {REUSE_ARCHIVE_ENV}"
    path = Path(archive) if Path(archive).is_absolute() else ROOT / archive
    assert path.is_file(), f"no archive {path}: run `make image` first"
    assert ":" in image.rsplit("/", 1)[-1], f"{image}: the tier needs a tag"
    return Build(image, path, 0.0)


def make_image(tag: str, version: str, out: Path) -> Build:
    """`make image`, as a user runs it, for ``localhost/coschedule:<tag>`` labelled ``version``."""
    image = f"{IMAGE_REPO}:{tag}"
    archive = out / f"{tag}.tar"
    started = time.monotonic()
    done = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "image",
            f"IMAGE={image}",
            f"IMAGE_TAR={archive}",
            f"VERSION={version}",
            "IMAGE_TOOL=imagekit",
            f"IMAGEKIT={imagekit()}",
            f"IMAGE_WORK={image_work()}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, f"make image failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    build = Build(image, archive, time.monotonic() - started)
    assert build.version == version, f"{image} is labelled {build.version!r}, not {version!r}"
    return build


def run_imagekit(*args: object) -> str:
    done = subprocess.run(
        [str(imagekit()), *map(str, args)], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"imagekit {args[0]} failed:\n{done.stderr[-3000:]}"
    return done.stdout


class Relay:
    """kube-apiserver's port relayed from one node's bridge address (a TCP relay, TLS passes
    through): realstack's pods reach only their own node's bridge, the API server listens on
    127.0.0.1 (see tests/real/artifact/kustomization.yaml)."""

    def __init__(self, listen: str, port: int, target_port: int) -> None:
        self.server = socket.create_server((listen, port))
        self.target = ("127.0.0.1", target_port)
        self.closed = False
        threading.Thread(target=self._accept, name="api-relay", daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.closed = True
        self.server.close()


@dataclass
class ArtifactStack:
    api: Api
    plane: ControlPlane
    stack: Any  # realstack.RealStack
    workdir: Path
    kubectl_path: Path
    api_port: int
    api_address: str
    relay: Relay
    provisioner: HostPathProvisioner
    builds: dict[str, Build] = field(default_factory=dict)
    figures: dict[str, float] = field(default_factory=dict)

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        assert self.plane.admin_kubeconfig is not None
        done = subprocess.run(
            [str(self.kubectl_path), "--kubeconfig", str(self.plane.admin_kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if check:
            assert done.returncode == 0, f"kubectl {' '.join(args)}:\n{done.stderr[-3000:]}"
        return done.stdout + done.stderr

    def fill(self, text: str, build: Build) -> str:
        """The overlay's @...@ words: the image and where the pods reach the API server."""
        words = {
            "@IMAGE_NAME@": build.name,
            "@IMAGE_TAG@": build.tag,
            "@API_NODE@": API_NODE,
            "@API_ADDRESS@": self.api_address,
            "@API_PORT@": str(self.api_port),
        }
        for word, value in words.items():
            text = text.replace(word, value)
        left = re.findall(r"@[A-Z_]+@", text)
        assert not left, f"the overlay has words the test does not fill: {left}"
        return text

    def render_overlay(self, build: Build) -> str:
        return self.fill(self.kubectl("kustomize", str(OVERLAY)), build)

    def render_chart(self, rendered_chart: str, build: Build) -> str:
        """The chart's output with the overlay's workload patches (its images and config come
        from values-realstack.yaml): `helm template | kustomize`, as GitOps tools apply it."""
        overlay = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())
        folder = Path(tempfile.mkdtemp(prefix="chart-", dir=self.workdir))
        (folder / "chart.yaml").write_text(rendered_chart)
        patches = [p for p in overlay["patches"] if p["target"]["kind"] in ("Deployment", "Job")]
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": ["chart.yaml"],
            "patches": patches,
        }
        (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        return self.fill(self.kubectl("kustomize", str(folder)), build)

    def deployment_ready(self, name: str, image: str | None = None) -> bool:
        dep = self.api.get("Deployment", name, NAMESPACE)
        if dep is None:
            return False
        status = dep.get("status") or {}
        want = dep["spec"].get("replicas", 1)
        template_image = dep["spec"]["template"]["spec"]["containers"][0]["image"]
        return (
            status.get("observedGeneration") == dep["metadata"]["generation"]
            and status.get("updatedReplicas") == want
            and status.get("readyReplicas") == want
            and status.get("replicas") == want
            and (image is None or template_image == image)
        )

    def wait_ready(self, image: str | None = None, timeout: float = 300) -> float:
        started = time.monotonic()
        for name in DEPLOYMENTS:
            wait_for(
                f"Deployment {name} Ready",
                lambda name=name: self.deployment_ready(name, image),  # type: ignore[misc]
                timeout=timeout,
                interval=0.5,
                describe=lambda: self.describe(),
            )
        return time.monotonic() - started

    def pods(self, component: str) -> list[Obj]:
        return self.api.list(
            "Pod",
            NAMESPACE,
            label_selector=f"app.kubernetes.io/component={component}",
        )

    def pod_log(self, pod: Obj, container: str) -> str:
        try:
            text: str = self.stack.pod_log(NAMESPACE, pod["metadata"]["name"], container)
        except Exception as exc:  # a pod whose log the node no longer has
            return f"(no log: {exc!r})"
        return text

    def describe(self) -> str:
        lines = [f"=== {NAMESPACE}"]
        for pod in self.api.list("Pod", NAMESPACE):
            status = pod.get("status") or {}
            states = [
                f"{c['name']} ready={c.get('ready')} restarts={c.get('restartCount')} "
                f"{list((c.get('state') or {}).items())[:1]}"
                for c in status.get("containerStatuses") or []
            ]
            lines.append(
                f"Pod {pod['metadata']['name']} node={pod['spec'].get('nodeName')} "
                f"ip={status.get('podIP')} phase={status.get('phase')} {states}"
            )
            container = pod["spec"]["containers"][0]["name"]
            tail = self.pod_log(pod, container).splitlines()[-6:]
            lines.extend(f"    {line[:300]}" for line in tail)
        for event in self.api.list("Event", NAMESPACE)[-15:]:
            obj = event.get("involvedObject") or {}
            lines.append(
                f"Event {event.get('reason')} {obj.get('kind')}/{obj.get('name')}: "
                f"{str(event.get('message'))[:200]}"
            )
        return "\n".join(lines)

    def logs(self) -> str:
        return self.describe() + "\n" + self.plane.tails(20)


def start(workdir: Path) -> ArtifactStack:
    """A control plane that calls webhooks through their Services, two nodes, Tekton, the
    suite's provisioner, and the API relay on the first node's bridge."""
    sys.path.insert(0, str(realstack_dir()))
    real_stack: Any = importlib.import_module("realstack").RealStack
    binaries, source = find_binaries()
    assert binaries is not None, source
    kubectl_path = find_kubectl(binaries)
    assert kubectl_path is not None, "no kubectl beside the control-plane binaries"
    plane = ControlPlane(
        binaries,
        workdir,
        kcm_controllers=KCM_CONTROLLERS_WITH_KUBELETS,
        apiserver_args=("--enable-aggregator-routing=true",),
    )
    rs_dir = Path(tempfile.mkdtemp(prefix="rsa-", dir="/tmp"))  # short: sockets live there
    stack = None
    provisioner: HostPathProvisioner | None = None
    relay: Relay | None = None
    try:
        api = plane.start_apiserver()
        plane.start_controllers()
        assert plane.admin_kubeconfig is not None
        stack = real_stack(rs_dir, plane.admin_kubeconfig)
        stack.images()
        for name in NODES:
            stack.add_node(name)
        stack.start_tekton()
        provisioner = HostPathProvisioner(api, rs_dir / "pv")
        provisioner.install()
        provisioner.start()
        api_port = int(plane.server.rsplit(":", 1)[1])
        subnet = ipaddress.ip_network(stack.node(API_NODE).subnet)
        address = str(subnet.network_address + 1)  # the bridge's own address
        relay = Relay(address, api_port, api_port)
        return ArtifactStack(
            api, plane, stack, rs_dir, kubectl_path, api_port, address, relay, provisioner
        )
    except BaseException:
        print(f"\nartifact stack setup failed:\n{plane.tails(60)}")
        stop_parts(plane, stack, provisioner, relay)
        raise


def stop_parts(
    plane: ControlPlane, stack: Any, provisioner: HostPathProvisioner | None, relay: Relay | None
) -> None:
    if provisioner is not None:
        provisioner.stop()
    if relay is not None:
        relay.close()
    if stack is not None:
        with contextlib.suppress(Exception):
            stack.stop(purge=not os.environ.get("REAL_KEEP"))
    plane.stop()


def stop(art: ArtifactStack) -> None:
    stop_parts(art.plane, art.stack, art.provisioner, art.relay)


def import_images(art: ArtifactStack, *builds: Build) -> float:
    """Each archive into the containerd of the node that runs coschedule's pods (no registry
    to pull from; the overlay keeps them on API_NODE)."""
    started = time.monotonic()
    for build in builds:
        run_imagekit("import", image_work(), build.archive, art.stack.workdir, API_NODE)
    return time.monotonic() - started
