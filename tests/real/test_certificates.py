"""Certificates that renew themselves, on the real stack: the reconciler keeps a serving
certificate made to live 4 minutes (renewed 2 minutes before it expires) from a CA made to
live 10 (renewed 5 before), for 6 minutes while PipelineRuns run and pods are admitted
without pause. Zero refused admissions, the caBundle and the served certificate changed,
every run Succeeded.

The webhook runs as a process reading a cert folder, so the test stands in for the kubelet:
it syncs the Secret into the folder the way the kubelet's atomic writer does (a new
timestamped folder, the ``..data`` link swapped), ``SYNC_LAG`` seconds after each change.
The suite's registration is ``coschedule-e2e``, so the overlay's RBAC for the keeper is
applied with that name in its ``resourceNames``."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import socket
import ssl
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from coschedule import certs
from tests.e2e.cluster import Proc, find_kubectl, wait_healthy
from tests.e2e.install import MANIFESTS, SYSTEM_NAMESPACE, WEBHOOK_CONFIG_NAME, render_kustomization
from tests.e2e.kube import Api, ApiError, Obj
from tests.real.runs import assert_succeeded, claim_template, pipeline_run, task, wait_runs
from tests.real.stack import RealCluster, api_from_kubeconfig

SECRET = "coschedule-webhook-tls"
CA_SECRET = "coschedule-webhook-ca"
STRATEGIC = "application/strategic-merge-patch+json"
SYNC_LAG = 20.0  # the kubelet syncs a changed Secret within about a minute; here 20 s
DURATION = 6 * 60.0
RUN_EVERY = 30.0
KEEPER_FLAGS = [
    f"--cert-secret={SECRET}",
    f"--cert-ca-secret={CA_SECRET}",
    f"--cert-webhook-config={WEBHOOK_CONFIG_NAME}",
    "--cert-dns-name=localhost",
    "--cert-dns-name=127.0.0.1",
    "--cert-validity=4m",
    "--cert-renew-before=2m",
    "--ca-validity=10m",
    "--ca-renew-before=5m",
]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _restart(proc: Proc, argv: list[str]) -> None:
    proc.stop()
    proc.argv = argv
    proc.start()
    port = proc.argv[proc.argv.index("--health-port") + 1]
    wait_healthy(f"http://127.0.0.1:{port}/readyz", proc, timeout=60)


def _fingerprints(bundle_b64: str) -> frozenset[str]:
    from coschedule.reconcile.cert_plan import fingerprint, pem_certificates

    return frozenset(fingerprint(c) for c in pem_certificates(base64.b64decode(bundle_b64)))


def _bundles(api: Api) -> list[frozenset[str]]:
    config = api.must_get("MutatingWebhookConfiguration", WEBHOOK_CONFIG_NAME)
    return [_fingerprints(h["clientConfig"].get("caBundle") or "") for h in config["webhooks"]]


class KubeletSync:
    """The kubelet's part: the Secret's data into the folder, ``lag`` s after it changed,
    with the atomic writer's ``..data`` swap. Records when each version was written."""

    def __init__(self, api: Api, folder: Path, lag: float) -> None:
        self.api, self.folder, self.lag = api, folder, lag
        self.changes: list[tuple[float, str]] = []  # (seen at, resourceVersion)
        self.synced: list[tuple[float, str]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kubelet-sync", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def write(self, data: dict[str, str], version: str) -> None:
        stamp = self.folder / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{version}"
        stamp.mkdir()
        for key, value in data.items():
            (stamp / key).write_bytes(base64.b64decode(value))
        tmp = self.folder / "..data_tmp"
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        tmp.symlink_to(stamp.name)
        os.replace(tmp, self.folder / "..data")
        for key in data:
            link = self.folder / key
            if not link.is_symlink():
                staged = self.folder / f".{key}.link"
                with contextlib.suppress(FileNotFoundError):
                    staged.unlink()
                staged.symlink_to(f"..data/{key}")
                os.replace(staged, link)

    def _loop(self) -> None:
        known = ""
        pending: list[tuple[float, str, dict[str, str]]] = []
        while not self._stop.is_set():
            try:
                secret = self.api.must_get("Secret", SECRET, SYSTEM_NAMESPACE)
                version = secret["metadata"]["resourceVersion"]
                if version != known:
                    known = version
                    self.changes.append((time.monotonic(), version))
                    pending.append((time.monotonic() + self.lag, version, secret["data"]))
                while pending and pending[0][0] <= time.monotonic():
                    _, version, data = pending.pop(0)
                    self.write(data, version)
                    self.synced.append((time.monotonic(), version))
            except Exception as exc:
                self.errors.append(repr(exc))
            self._stop.wait(0.5)


class Served:
    """The certificate the webhook serves, by handshake, once a second: when it changed."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.seen: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="served-cert", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def current(self) -> str:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        with (
            socket.create_connection(("127.0.0.1", self.port), timeout=5) as raw,
            context.wrap_socket(raw) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
        assert der is not None
        return hashlib.sha256(der).hexdigest()

    def _loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                found = self.current()
                if not self.seen or self.seen[-1][1] != found:
                    self.seen.append((time.monotonic(), found))
            self._stop.wait(1.0)


class Admissions:
    """Pods created (server-side dry run: through both the API server's TLS check and the
    webhook, nothing stored) twice a second; every refusal kept."""

    def __init__(self, api: Api, namespace: str) -> None:
        self.api, self.namespace = api, namespace
        self.allowed = 0
        self.refused: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="admissions", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _loop(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            pod: Obj = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"probe-{n}",
                    "namespace": self.namespace,
                    "labels": {"coschedule.dev/group": f"probe-{n % 7}"},
                },
                "spec": {"containers": [{"name": "main", "image": "localhost/pause:local"}]},
            }
            try:
                made = self.api.create(pod, dry_run=True)
                labels = made["metadata"].get("labels") or {}
                if "coschedule.dev/placeholder" not in labels:
                    self.refused.append(f"probe-{n}: admitted without the webhook's mark")
                else:
                    self.allowed += 1
            except ApiError as exc:
                self.refused.append(f"probe-{n}: {exc}")
            self._stop.wait(0.5)


def _keeper_rbac(api: Api, kubectl: Path | None) -> list[Obj]:
    rendered = render_kustomization(kubectl, MANIFESTS / "overlays" / "self-signed")
    made = [
        o for o in rendered if o["metadata"]["name"] in ("coschedule-reconciler-certs", CA_SECRET)
    ]
    for obj in made:
        for rule in obj.get("rules") or []:
            if rule.get("resourceNames") == ["coschedule"]:
                rule["resourceNames"] = [WEBHOOK_CONFIG_NAME]
        api.ensure(obj)
    return made


def _restore_long_lived(api: Api, sync: KubeletSync, served: Served, product: Any) -> None:
    """After the scenario: a certificate for a day again (the other scenarios need one),
    trusted before it is served."""
    fresh = certs.generate(["localhost", "127.0.0.1"], days=1)
    config = api.must_get("MutatingWebhookConfiguration", WEBHOOK_CONFIG_NAME)
    current = base64.b64decode(config["webhooks"][0]["clientConfig"].get("caBundle") or "")
    both = _b64(fresh.ca_pem + current)
    patch = {
        "webhooks": [
            {"name": h["name"], "clientConfig": {"caBundle": both}} for h in config["webhooks"]
        ]
    }
    api.patch("MutatingWebhookConfiguration", WEBHOOK_CONFIG_NAME, patch, patch_type=STRATEGIC)
    time.sleep(2)
    sync.write(
        {
            "ca.crt": _b64(fresh.ca_pem),
            "tls.crt": _b64(fresh.cert_pem),
            "tls.key": _b64(fresh.key_pem),
        },
        "restore",
    )
    want = hashlib.sha256(ssl.PEM_cert_to_DER_cert(fresh.cert_pem.decode())).hexdigest()
    deadline = time.monotonic() + 30
    while served.current() != want and time.monotonic() < deadline:
        time.sleep(0.5)
    only = {
        "webhooks": [
            {"name": h["name"], "clientConfig": {"caBundle": fresh.ca_bundle}}
            for h in config["webhooks"]
        ]
    }
    api.patch("MutatingWebhookConfiguration", WEBHOOK_CONFIG_NAME, only, patch_type=STRATEGIC)
    product.ca_bundle = fresh.ca_bundle


def test_certificates_renew_while_runs_are_admitted(
    real: RealCluster, namespace: Callable[..., str]
) -> None:
    real.require("own-stack")
    product = real.product
    assert product is not None
    assert product.cert_dir is not None
    assert product.webhook is not None
    assert real.plane is not None
    assert real.kubeconfig is not None
    api = real.api
    made = _keeper_rbac(api, find_kubectl(real.plane.binaries))
    # What the certs Job leaves: the serving Secret with the certificate the webhook serves.
    folder = product.cert_dir
    api.ensure(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": SYSTEM_NAMESPACE},
            "type": "kubernetes.io/tls",
            "data": {k: _b64((folder / k).read_bytes()) for k in ("ca.crt", "tls.crt", "tls.key")},
        }
    )
    first_bundles = _bundles(api)
    ns = namespace("pipelineruns", prefix="certs")
    probe_ns = namespace("pipelineruns", prefix="certs-probe")  # every group pod is marked
    sync = KubeletSync(api_from_kubeconfig(real.kubeconfig, real.workdir), folder, SYNC_LAG)
    served = Served(product.webhook_port)
    admissions = Admissions(api_from_kubeconfig(real.kubeconfig, real.workdir), probe_ns)
    (name, reconciler), *_ = product.reconcilers.items()
    plain = list(reconciler.argv)
    runs: list[str] = []
    creation_errors: list[str] = []
    started = time.monotonic()
    try:
        sync.start()
        served.start()
        admissions.start()
        _restart(reconciler, [*plain, *KEEPER_FLAGS])
        kept_at = time.monotonic()
        while time.monotonic() - kept_at < DURATION:
            run = f"certs-{len(runs)}"
            first = task("first", "echo one > $(workspaces.ws.path)/f\n", ["ws"])
            second = task(
                "second", "grep one $(workspaces.ws.path)/f\n", ["ws"], run_after=["first"]
            )
            try:
                workspace = {"ws": {"volumeClaimTemplate": claim_template(real.local_class)}}
                api.create(pipeline_run(ns, run, [first, second], workspace))
                runs.append(run)
            except ApiError as exc:
                creation_errors.append(f"{run}: {exc}")
            time.sleep(RUN_EVERY)
        results = wait_runs(api, ns, runs, timeout=300)
        last_bundles = _bundles(api)
        port = reconciler.argv[reconciler.argv.index("--health-port") + 1]
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        _restart(reconciler, plain)
        admissions.stop()
        with contextlib.suppress(Exception):
            _restore_long_lived(api, sync, served, product)
        sync.stop()
        served.stop()
        for obj in made:
            with contextlib.suppress(ApiError):
                api.delete(obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace"))
        with contextlib.suppress(ApiError):
            api.delete("Secret", SECRET, SYSTEM_NAMESPACE)
    # Figures: how many admissions, how long from the Secret's write to the new certificate
    # in use (the kubelet's lag, here SYNC_LAG, plus the webhook's reload).
    written = [t for t, _ in sync.changes[1:]]
    took = []
    for when in written:
        after = [t for t, _ in served.seen if t >= when]
        if after:
            took.append(after[0] - when)
    print(
        f"\ncertificate rotation on the real stack ({name}, {time.monotonic() - started:.0f}s): "
        f"{admissions.allowed} pod admissions and {len(runs)} PipelineRuns created, "
        f"{len(admissions.refused) + len(creation_errors)} refused; "
        f"{len(written)} Secret writes, {len(served.seen) - 1} served-certificate changes; "
        f"write to served: median {statistics.median(took) if took else float('nan'):.1f}s, "
        f"max {max(took) if took else float('nan'):.1f}s (kubelet lag emulated: {SYNC_LAG:.0f}s)"
    )
    assert not sync.errors[-3:], sync.errors[-3:]
    assert admissions.refused == [], admissions.refused[:5]
    assert creation_errors == [], creation_errors
    assert admissions.allowed > DURATION  # twice a second, most of the time
    assert_succeeded(results, api, ns, *runs)
    assert len(written) >= 3, "the serving certificate was renewed on schedule"
    assert len(served.seen) - 1 >= 3, "the webhook served each renewal, without a restart"
    assert product.webhook.alive()
    assert last_bundles != first_bundles
    rotations = {
        part: float(line.rsplit(" ", 1)[1])
        for part in ("ca", "serving", "ca-bundle")
        for line in metrics.splitlines()
        if line.startswith(f'coschedule_certificate_rotations_total{{part="{part}"}}')
    }
    print(f"keeper's writes: {rotations}")
    assert rotations["ca"] >= 2, "the Job's CA replaced, then the keeper's own CA renewed"
    assert rotations["serving"] >= 3
    assert took
    assert max(took) < SYNC_LAG + 10
