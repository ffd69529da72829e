"""The self-signed install's certificate keeper against a real API server, under the RBAC
the overlay ships: the certs Job's real command bootstraps, then the reconciler's keeper
(as the reconciler's ServiceAccount) makes its CA, publishes the trust bundle in the
caBundles, renews the serving Secret, and repairs a caBundle emptied by a replace."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coschedule import certs
from coschedule.kube.client import KubeClient, from_kubeconfig
from coschedule.reconcile.cert_plan import RotationPolicy, fingerprint, pem_certificates
from coschedule.reconcile.certificates import CertificateController, CertificateTargets
from coschedule.reconcile.manager import Manager
from coschedule.reconcile.reconciler_metrics import ReconcileMetrics
from tests.e2e.conftest import E2E
from tests.e2e.install import MANIFESTS, RECONCILER_SA, ROOT, SYSTEM_NAMESPACE, render_kustomization
from tests.e2e.kube import Obj
from tests.e2e.test_rbac import allowed

pytestmark = pytest.mark.e2e

SECRET = "coschedule-webhook-tls"
CA_SECRET = "coschedule-webhook-ca"
CONFIG = "coschedule"  # the name the overlay's RBAC allows
NAMES = tuple(certs.service_dns_names("coschedule-webhook", SYSTEM_NAMESPACE))
MIN = dt.timedelta(minutes=1)
POLICY = RotationPolicy(
    names=NAMES,
    validity=4 * MIN,
    renew_before=2 * MIN,
    ca_validity=12 * MIN,
    ca_renew_before=5 * MIN,
    settle=dt.timedelta(seconds=1),
)
# A registration that matches no namespace and fails open: only its caBundle matters here.
INERT_CONFIG: Obj = {
    "apiVersion": "admissionregistration.k8s.io/v1",
    "kind": "MutatingWebhookConfiguration",
    "metadata": {"name": CONFIG},
    "webhooks": [
        {
            "name": name,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Ignore",
            "timeoutSeconds": 1,
            "namespaceSelector": {"matchLabels": {"e2e.coschedule.dev/never": "true"}},
            "rules": [
                {
                    "operations": ["CREATE"],
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "resources": ["pods"],
                }
            ],
            "clientConfig": {"url": "https://127.0.0.1:1/mutate"},
        }
        for name in ("pods.coschedule.dev", "runs.coschedule.dev")
    ],
}


@pytest.fixture
def self_signed(e2e: E2E) -> Iterator[list[Obj]]:
    """The overlay's certificate objects (the keeper's RBAC, the empty CA Secret), an inert
    configuration named as the overlay's; all removed afterwards."""
    e2e.require("kubectl")
    rendered = render_kustomization(e2e.kubectl, MANIFESTS / "overlays" / "self-signed")
    made = [
        obj
        for obj in rendered
        if obj["metadata"]["name"] in ("coschedule-reconciler-certs", CA_SECRET)
    ]
    assert {o["kind"] for o in made} == {
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
        "Secret",
    }
    for obj in made:
        e2e.api.ensure(obj)
    e2e.api.create(INERT_CONFIG)
    yield made
    e2e.api.delete("MutatingWebhookConfiguration", CONFIG)
    for obj in made:
        e2e.api.delete(obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace"))
    e2e.api.delete("Secret", SECRET, SYSTEM_NAMESPACE)


def data(e2e: E2E, name: str) -> dict[str, bytes]:
    secret = e2e.api.must_get("Secret", name, SYSTEM_NAMESPACE)
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def bundles(e2e: E2E) -> list[set[str]]:
    config = e2e.api.must_get("MutatingWebhookConfiguration", CONFIG)
    return [
        {
            fingerprint(c)
            for c in pem_certificates(base64.b64decode(h["clientConfig"].get("caBundle") or ""))
        }
        for h in config["webhooks"]
    ]


def signed_by_keeper(e2e: E2E) -> bool:
    ca = data(e2e, CA_SECRET)
    if "tls.crt" not in ca:
        return False
    cert = pem_certificates(data(e2e, SECRET)["tls.crt"])[0]
    try:
        cert.verify_directly_issued_by(pem_certificates(ca["tls.crt"])[0])
    except Exception:
        return False
    return True


def run_certs_job(e2e: E2E, out: Path) -> None:
    """The overlay Job's command, as it runs in the image (admin credentials stand in for
    the Job's ServiceAccount)."""
    assert e2e.plane.admin_kubeconfig is not None
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "coschedule.cli.main",
            "certs",
            "--service=coschedule-webhook",
            f"--namespace={SYSTEM_NAMESPACE}",
            f"--out={out}",
            f"--apply-to-secret={SYSTEM_NAMESPACE}/{SECRET}",
            f"--patch-webhook={CONFIG}",
            "--days=90",
            "--renew-before-days=0",
            f"--kubeconfig={e2e.plane.admin_kubeconfig}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr


async def until(check: Callable[[], bool], what: str, within: float = 30.0) -> float:
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not check():
        if loop.time() - start > within:
            raise AssertionError(f"{what}: not within {within}s")
        await asyncio.sleep(0.1)
    return loop.time() - start


def test_the_keeper_takes_over_the_jobs_certificate_and_repairs_the_ca_bundle(
    e2e: E2E, self_signed: list[Obj], tmp_path: Path
) -> None:
    # By name only: the keeper reads and patches its two Secrets, creates none, reads no other.
    def may(verb: str, resource: str, name: str = "", namespace: str = SYSTEM_NAMESPACE) -> bool:
        check = (verb, "", resource, namespace)
        if not name:
            return allowed(e2e, RECONCILER_SA, check)
        review = e2e.api.request(
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": f"system:serviceaccount:{SYSTEM_NAMESPACE}:{RECONCILER_SA}",
                    "resourceAttributes": {
                        "verb": verb,
                        "resource": resource,
                        "namespace": namespace,
                        "name": name,
                    },
                },
            },
        )
        assert review is not None
        return bool((review.get("status") or {}).get("allowed"))

    assert may("patch", "secrets", SECRET)
    assert may("get", "secrets", CA_SECRET)
    assert not may("get", "secrets", "someone-elses")
    assert not may("create", "secrets")
    assert not may("list", "secrets")

    run_certs_job(e2e, tmp_path / "out")
    job_ca = data(e2e, SECRET)["ca.crt"]
    theirs = {fingerprint(c) for c in pem_certificates(job_ca)}
    assert bundles(e2e) == [theirs, theirs]
    assert e2e.product.reconciler_kubeconfig is not None
    creds = from_kubeconfig(e2e.product.reconciler_kubeconfig)

    async def keep() -> None:
        client = KubeClient(creds, user_agent="coschedule-reconciler")
        manager = Manager(ReconcileMetrics())
        controller = CertificateController(
            client,
            CertificateTargets(SYSTEM_NAMESPACE, SECRET, CA_SECRET, (CONFIG,)),
            POLICY,
            manager.metrics.registry,
            leading=manager.is_leading,
        )
        manager.add(controller)
        try:
            manager.start_informers()
            # The watch by name is allowed by resourceNames (a metadata.name field selector).
            await asyncio.wait_for(manager.wait_synced(), 20)
            manager.start_leading()
            await until(lambda: signed_by_keeper(e2e), "serving certificate from the keeper's CA")
            ours = {fingerprint(c) for c in pem_certificates(data(e2e, CA_SECRET)["tls.crt"])}
            assert bundles(e2e) == [ours | theirs, ours | theirs]
            serving = data(e2e, SECRET)
            assert set(serving) == {"ca.crt", "tls.crt", "tls.key"}
            cert = pem_certificates(serving["tls.crt"])[0]
            assert cert.not_valid_after_utc - dt.datetime.now(dt.UTC) <= POLICY.validity
            assert e2e.api.must_get("Secret", SECRET, SYSTEM_NAMESPACE)["type"] == (
                "kubernetes.io/tls"
            )
            # A replace that drops the caBundles (kubectl replace, helm upgrade --force).
            config = e2e.api.must_get("MutatingWebhookConfiguration", CONFIG)
            for hook in config["webhooks"]:
                hook["clientConfig"].pop("caBundle", None)
            e2e.api.request(
                "PUT",
                f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{CONFIG}",
                config,
            )
            took = await until(lambda: bundles(e2e) == [ours | theirs] * 2, "caBundle repaired")
            assert took < 5
            ready, detail = controller.readiness()
            assert ready
            assert detail is not None
            assert "serving certificate valid until" in detail
        finally:
            await manager.stop()
            await client.aclose()

    asyncio.run(keep())
