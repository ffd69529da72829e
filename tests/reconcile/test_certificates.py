"""The certificate keeper's API layer against kmock: what it reads and writes, by name, in
which order, and how it repairs a caBundle."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

from prometheus_client import generate_latest

from coschedule import certs
from coschedule.kube.client import KubeClient
from coschedule.reconcile.cert_plan import RotationPolicy, fingerprint, pem_certificates
from coschedule.reconcile.certificates import CertificateController, CertificateTargets
from coschedule.reconcile.manager import Manager
from coschedule.reconcile.reconciler_metrics import ReconcileMetrics
from tests.reconcile.apiserver import MiniApi
from tests.reconcile.conftest import eventually, start

NS = "coschedule-system"
NAMES = tuple(certs.service_dns_names("coschedule-webhook", NS))
TARGETS = CertificateTargets(NS, "coschedule-webhook-tls", "coschedule-webhook-ca", ("coschedule",))
MIN = dt.timedelta(minutes=1)
POLICY = RotationPolicy(
    names=NAMES,
    validity=4 * MIN,
    renew_before=2 * MIN,
    ca_validity=12 * MIN,
    ca_renew_before=5 * MIN,
    settle=dt.timedelta(seconds=0.3),
)
RULE = {
    "operations": ["CREATE"],
    "apiGroups": [""],
    "apiVersions": ["v1"],
    "resources": ["pods"],
}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def seed(api: MiniApi) -> certs.CertBundle:
    """What the self-signed install leaves before the keeper runs: the Job's Secret and
    caBundle, the empty CA Secret the manifests ship."""
    job = certs.generate(list(NAMES), days=90)
    api.put(
        "secrets",
        {
            "metadata": {"name": "coschedule-webhook-tls", "namespace": NS},
            "type": "kubernetes.io/tls",
            "data": {
                "ca.crt": b64(job.ca_pem),
                "tls.crt": b64(job.cert_pem),
                "tls.key": b64(job.key_pem),
            },
        },
    )
    api.put(
        "secrets",
        {"metadata": {"name": "coschedule-webhook-ca", "namespace": NS}, "type": "Opaque"},
    )
    hooks = [
        {
            "name": name,
            "failurePolicy": "Fail",
            "rules": [RULE],
            "clientConfig": {
                "service": {"name": "coschedule-webhook", "namespace": NS, "path": path},
                "caBundle": job.ca_bundle,
            },
        }
        for name, path in (
            ("pods.coschedule.dev", "/mutate"),
            ("runs.coschedule.dev", "/mutate-runs"),
        )
    ]
    api.put(
        "mutatingwebhookconfigurations", {"metadata": {"name": "coschedule"}, "webhooks": hooks}
    )
    return job


def keeper(client: KubeClient) -> tuple[Manager, CertificateController]:
    manager = Manager(ReconcileMetrics())
    controller = CertificateController(
        client,
        TARGETS,
        POLICY,
        manager.metrics.registry,
        leading=manager.is_leading,
        retry_base=0.05,
    )
    manager.add(controller)
    return manager, controller


def secret_data(api: MiniApi, name: str) -> dict[str, bytes]:
    found = api.get("secrets", NS, name) or {}
    return {k: base64.b64decode(v) for k, v in (found.get("data") or {}).items()}


def bundles(api: MiniApi) -> list[set[str]]:
    config = api.get("mutatingwebhookconfigurations", None, "coschedule") or {}
    return [
        {
            fingerprint(c)
            for c in pem_certificates(base64.b64decode(h["clientConfig"].get("caBundle") or ""))
        }
        for h in config["webhooks"]
    ]


def serving_signed_by_our_ca(api: MiniApi) -> bool:
    serving, ca = (
        secret_data(api, "coschedule-webhook-tls"),
        secret_data(api, "coschedule-webhook-ca"),
    )
    if "tls.crt" not in ca:
        return False
    cert = pem_certificates(serving["tls.crt"])[0]
    try:
        cert.verify_directly_issued_by(pem_certificates(ca["tls.crt"])[0])
    except Exception:
        return False
    return True


async def test_the_jobs_certificate_is_taken_over_without_an_untrusted_moment(
    api: MiniApi, client: KubeClient
) -> None:
    job = seed(api)
    manager, controller = keeper(client)
    try:
        await start(manager)
        await eventually(lambda: serving_signed_by_our_ca(api), within=10)
        ca = secret_data(api, "coschedule-webhook-ca")
        ours = {fingerprint(c) for c in pem_certificates(ca["tls.crt"])}
        theirs = {fingerprint(c) for c in pem_certificates(job.ca_pem)}
        # Both webhooks trust our CA and, while it is valid, the Job's.
        assert bundles(api) == [ours | theirs, ours | theirs]
        assert {fingerprint(c) for c in pem_certificates(ca["ca.crt"])} == ours | theirs
        # The order that keeps every admission trusted: CA, then caBundle, then Secret.
        writes = [
            (verb, plural, name) for verb, plural, _ns, name, _p in api.requests if verb == "PATCH"
        ]
        assert (
            writes.index(("PATCH", "secrets", "coschedule-webhook-ca"))
            < writes.index(("PATCH", "mutatingwebhookconfigurations", "coschedule"))
            < writes.index(("PATCH", "secrets", "coschedule-webhook-tls"))
        )
        # The rest of the configuration is as it was.
        config = api.get("mutatingwebhookconfigurations", None, "coschedule")
        assert config is not None
        assert [h["rules"] for h in config["webhooks"]] == [[RULE], [RULE]]
        assert config["webhooks"][1]["clientConfig"]["service"]["path"] == "/mutate-runs"
        serving = secret_data(api, "coschedule-webhook-tls")
        cert = pem_certificates(serving["tls.crt"])[0]
        assert cert.not_valid_after_utc - dt.datetime.now(dt.UTC) <= POLICY.validity
        # Everything by name: no Secret created, listed or watched.
        assert not [
            r
            for r in api.requests
            if r[1] == "secrets" and (r[0] in ("POST", "WATCH") or r[3] is None)
        ]
        serving_line = 'coschedule_certificate_rotations_total{part="serving"} 1.0'
        await eventually(lambda: serving_line in generate_latest(manager.metrics.registry).decode())
        exposed = generate_latest(manager.metrics.registry).decode()
        assert 'coschedule_certificate_rotations_total{part="ca"} 1.0' in exposed
        assert 'coschedule_certificate_rotations_total{part="serving"} 1.0' in exposed, [
            line for line in exposed.splitlines() if "part=" in line
        ]
        ok, detail = controller.readiness()
        assert ok
        assert detail is not None
        assert "serving certificate valid until" in detail
    finally:
        await manager.stop()


async def test_an_emptied_ca_bundle_is_repaired_at_once(api: MiniApi, client: KubeClient) -> None:
    seed(api)
    manager, _ = keeper(client)
    try:
        await start(manager)
        await eventually(lambda: serving_signed_by_our_ca(api), within=10)
        before = bundles(api)
        config: Any = api.get("mutatingwebhookconfigurations", None, "coschedule")
        for hook in config["webhooks"]:
            hook["clientConfig"].pop("caBundle")
        api.put("mutatingwebhookconfigurations", config)  # as `kubectl replace` would
        took = await eventually(lambda: bundles(api) == before, within=5)
        assert took < 2, "repaired on the watch event, not on the next recheck"
    finally:
        await manager.stop()


async def test_a_stale_write_is_decided_again(api: MiniApi, client: KubeClient) -> None:
    seed(api)
    api.faults[("PATCH", "secrets")] = [409]
    manager, _ = keeper(client)
    try:
        await start(manager)
        await eventually(lambda: serving_signed_by_our_ca(api), within=10)
        exposed = generate_latest(manager.metrics.registry).decode()
        assert (
            'coschedule_reconcile_errors_total{code="409",controller="certificates"} 1.0' in exposed
        )
    finally:
        await manager.stop()


async def test_a_follower_writes_nothing(api: MiniApi, client: KubeClient) -> None:
    seed(api)
    manager, controller = keeper(client)
    try:
        await start(manager, lead=False)
        assert controller.readiness()[0]
        assert not [r for r in api.requests if r[0] == "PATCH"]
    finally:
        await manager.stop()
