"""Install coschedule into the test control plane the way the manifests do, minus the
Deployment: the RBAC objects from ``manifests/base``, ServiceAccount tokens, and the webhook
and reconciler as real processes on loopback, registered through a real
MutatingWebhookConfiguration."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from coschedule import certs
from tests.e2e.cluster import ControlPlane, Proc, free_port, wait_healthy
from tests.e2e.kube import Api, Obj, path_for, wait_for
from tests.e2e.pki import write_kubeconfig

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
SYSTEM_NAMESPACE = "coschedule-system"
WEBHOOK_SA = "coschedule-webhook"
RECONCILER_SA = "coschedule-reconciler"
# Not the manifests' name ("coschedule"): the manifests' dry-run apply would merge its
# clientConfig.service into this registration's url.
WEBHOOK_CONFIG_NAME = "coschedule-e2e"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
NOT_BUILT = "not built yet"

# Used when manifests/base is absent or has no MutatingWebhookConfiguration: the design's
# registration (DESIGN.md, issue 5).
FALLBACK_WEBHOOK: Obj = {
    "name": "pods.coschedule.dev",
    "admissionReviewVersions": ["v1"],
    "rules": [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ],
    "failurePolicy": "Fail",
    "matchPolicy": "Equivalent",
    "sideEffects": "None",
    "timeoutSeconds": 5,
    "reinvocationPolicy": "IfNeeded",
    "namespaceSelector": {"matchLabels": {"coschedule.dev/enabled": "true"}},
}


def render_kustomization(kubectl: Path | None, folder: Path) -> list[Obj]:
    if kubectl is None:
        raise RuntimeError("no kubectl binary to render manifests with (kubectl kustomize)")
    done = subprocess.run(
        [str(kubectl), "kustomize", str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {folder} failed:\n{done.stderr}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if isinstance(doc, dict)]


def sa_token(api: Api, name: str, namespace: str = SYSTEM_NAMESPACE) -> str:
    """A token for the ServiceAccount from the TokenRequest API (as the kubelet gets one)."""
    review = api.request(
        "POST",
        path_for("ServiceAccount", namespace, name) + "/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600 * 4},
        },
    )
    assert review is not None
    token = (review.get("status") or {}).get("token")
    assert isinstance(token, str), f"TokenRequest for {namespace}/{name}: {review}"
    assert token, f"TokenRequest for {namespace}/{name}: {review}"
    return token


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSCHEDULE_")}
    env["PYTHONPATH"] = str(ROOT)
    env.pop("KUBECONFIG", None)
    return env


@dataclass
class Coschedule:
    """The installed product: its identities, its processes, its registration."""

    plane: ControlPlane
    workdir: Path
    rendered: list[Obj] = field(default_factory=list)
    rbac_source: str = ""
    webhook_kubeconfig: Path | None = None
    reconciler_kubeconfig: Path | None = None
    config_dir: Path | None = None
    cert_dir: Path | None = None
    ca_bundle: str = ""
    webhook: Proc | None = None
    webhook_port: int = 0
    reconcilers: dict[str, Proc] = field(default_factory=dict)
    reconciler_ports: dict[str, int] = field(default_factory=dict)
    reconciler_missing: str | None = None  # why no reconciler runs, when none can
    manifest_webhook: Obj | None = None
    manifest_webhooks: list[Obj] = field(default_factory=list)

    @property
    def api(self) -> Api:
        assert self.plane.api is not None
        return self.plane.api

    def deploy(
        self, kubectl: Path | None, config: dict[str, str], replicas: tuple[str, ...]
    ) -> None:
        """Everything the manifests install, in their order: identities and CRDs, the config
        folder, the webhook (serving, then registered), the reconciler replicas."""
        self.install_rbac(kubectl)
        self.write_config(config)
        self.start_webhook()
        self.register_webhook()
        for name in replicas:
            if self.start_reconciler(name) is None:
                break

    # Identities --------------------------------------------------------------------------

    def install_rbac(self, kubectl: Path | None) -> None:
        api = self.api
        api.ensure(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": SYSTEM_NAMESPACE,
                    "labels": {
                        "coschedule.dev/enabled": "false",
                        "coschedule.dev/mode": "disabled",
                    },
                },
            }
        )
        objects: list[Obj] = []
        if (MANIFESTS / "base" / "kustomization.yaml").is_file():
            self.rendered = render_kustomization(kubectl, MANIFESTS / "base")
            # The CRD is applied on its own (manifests/crds), before the overlay.
            if (MANIFESTS / "crds" / "kustomization.yaml").is_file():
                self.rendered += render_kustomization(kubectl, MANIFESTS / "crds")
            objects = [obj for obj in self.rendered if obj.get("kind") in RBAC_KINDS]
            self.rbac_source = f"{len(objects)} RBAC objects from manifests/base"
            for obj in self.rendered:
                if obj.get("kind") == "MutatingWebhookConfiguration":
                    hooks = obj.get("webhooks") or []
                    if hooks:
                        self.manifest_webhook = hooks[0]
                        self.manifest_webhooks = list(hooks)
        names = {(obj.get("kind"), (obj.get("metadata") or {}).get("name")) for obj in objects}
        missing = [sa for sa in (WEBHOOK_SA, RECONCILER_SA) if ("ServiceAccount", sa) not in names]
        if missing:
            raise RuntimeError(
                "manifests/base does not render the ServiceAccounts "
                f"{', '.join(missing)} (and their RBAC): the e2e suite runs each process "
                "under the shipped identity"
            )
        for obj in objects:
            api.ensure(obj)
        self.install_crds()
        self.webhook_kubeconfig = write_kubeconfig(
            self.workdir / "webhook.kubeconfig",
            self.plane.server,
            self._ca(),
            sa_token(api, WEBHOOK_SA),
            WEBHOOK_SA,
        )
        self.reconciler_kubeconfig = write_kubeconfig(
            self.workdir / "reconciler.kubeconfig",
            self.plane.server,
            self._ca(),
            sa_token(api, RECONCILER_SA),
            RECONCILER_SA,
        )

    def install_crds(self) -> None:
        """The CRDs the manifests ship (ConcurrencyControl), established before the
        processes start watching them."""
        for obj in self.rendered:
            if obj.get("kind") != "CustomResourceDefinition":
                continue
            self.api.ensure(obj)
            name = obj["metadata"]["name"]

            def established(name: str = name) -> bool:
                crd = self.api.must_get("CustomResourceDefinition", name)
                return any(
                    c.get("type") == "Established" and c.get("status") == "True"
                    for c in (crd.get("status") or {}).get("conditions") or []
                )

            wait_for(f"CRD {name} to be established", established)

    def _ca(self) -> Path:
        assert self.plane.pki is not None
        return self.plane.pki.ca_crt

    # Processes ---------------------------------------------------------------------------

    def write_config(self, values: dict[str, str]) -> Path:
        self.config_dir = self.workdir / "config"
        self.config_dir.mkdir(exist_ok=True)
        for key, value in values.items():
            (self.config_dir / key).write_text(value)
        return self.config_dir

    def start_webhook(self) -> None:
        assert self.webhook_kubeconfig is not None
        assert self.config_dir is not None
        self.cert_dir = self.workdir / "webhook-tls"
        bundle = certs.generate(["localhost", "127.0.0.1"])
        certs.write_bundle(bundle, self.cert_dir)
        self.ca_bundle = bundle.ca_bundle
        self.webhook_port = free_port()
        health = free_port()
        self.webhook = Proc(
            "coschedule-serve",
            [
                sys.executable,
                "-m",
                "coschedule.cli.main",
                "serve",
                "--kubeconfig",
                str(self.webhook_kubeconfig),
                "--cert-dir",
                str(self.cert_dir),
                "--config-dir",
                str(self.config_dir),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.webhook_port),
                "--health-port",
                str(health),
            ],
            self.workdir / "logs" / "coschedule-serve.log",
            env=_env(),
            cwd=self.workdir,
        )
        self.plane.procs["coschedule-serve"] = self.webhook.start()
        wait_healthy(f"http://127.0.0.1:{health}/readyz", self.webhook, timeout=30)

    def register_webhook(self) -> Obj:
        """Every webhook of the manifests' configuration, each at its own path."""
        hooks = [copy.deepcopy(h) for h in self.manifest_webhooks or [FALLBACK_WEBHOOK]]
        for hook in hooks:
            path = ((hook.get("clientConfig") or {}).get("service") or {}).get("path", "/mutate")
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{self.webhook_port}{path}",
                "caBundle": self.ca_bundle,
            }
        config: Obj = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": WEBHOOK_CONFIG_NAME, "labels": {"e2e": "true"}},
            "webhooks": hooks,
        }
        return self.api.create(config)

    def start_reconciler(self, name: str) -> Proc | None:
        """Start one replica; None (and ``reconciler_missing`` set) when the command is the
        stub that is not built yet."""
        assert self.reconciler_kubeconfig is not None
        assert self.config_dir is not None
        health = free_port()
        env = _env()
        env["HOSTNAME"] = name  # the Lease holder identity starts with it
        env["POD_NAME"] = name
        env["POD_NAMESPACE"] = SYSTEM_NAMESPACE
        proc = Proc(
            name,
            [
                sys.executable,
                "-m",
                "coschedule.cli.main",
                "reconcile",
                "--kubeconfig",
                str(self.reconciler_kubeconfig),
                "--config-dir",
                str(self.config_dir),
                "--health-port",
                str(health),
                "--namespace",
                SYSTEM_NAMESPACE,
            ],
            self.workdir / "logs" / f"{name}.log",
            env=env,
            cwd=self.workdir,
        ).start()
        self.plane.procs[name] = proc
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            code = proc.returncode()
            if code is not None:
                if NOT_BUILT in proc.log():
                    self.reconciler_missing = (
                        f"`coschedule reconcile` is not built yet (it says: {proc.tail(1)!r})"
                    )
                    return None
                raise RuntimeError(f"{name} exited with {code}:\n{proc.tail(60)}")
            try:
                if httpx.get(f"http://127.0.0.1:{health}/readyz", timeout=2).status_code == 200:
                    self.reconcilers[name] = proc
                    self.reconciler_ports[name] = health
                    return proc
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{name} did not become ready in 45s:\n{proc.tail(60)}")

    def leader(self) -> str | None:
        """The replica name holding the reconciler Lease, if any."""
        for lease in self.api.list("Lease", SYSTEM_NAMESPACE):
            holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
            for name in self.reconcilers:
                if holder == name or holder.startswith(f"{name}_"):
                    return name
        return None

    def leases(self) -> list[Any]:
        return [
            (lease["metadata"]["name"], (lease.get("spec") or {}).get("holderIdentity"))
            for lease in self.api.list("Lease", SYSTEM_NAMESPACE)
        ]
