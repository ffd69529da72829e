"""The webhook's self-signed certificate, kept by the reconciler's leader (``reconcile
--cert-secret``; the self-signed install turns it on).

One key, looked at when a webhook configuration changes (a watch on each, by name: a
``kubectl apply`` that empties a caBundle is repaired within a second), after each step, and
when the next renewal is due. Each look reads the two Secrets and the configurations,
asks ``cert_plan.decide`` for one step, carries it out and looks again until the plan
waits. Every write carries the resourceVersion it was decided on (a stale one is 409 and
is decided again). The webhook reloads its files when the kubelet syncs the Secret.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from coschedule.certs import CA_FILE, CERT_FILE, KEY_FILE, KeyPair, generate_ca, issue_serving
from coschedule.kube.client import ApiError, KubeClient, object_path
from coschedule.kube.informer import Informer, Obj, caches_readiness
from coschedule.kube.webhook_config import WEBHOOK_API, patch_ca_bundle
from coschedule.reconcile.cert_plan import (
    CertObserved,
    RotationPolicy,
    Step,
    StepKind,
    decide,
    describe,
    fingerprint,
    pem_certificates,
)
from coschedule.reconcile.executor import NotLeader
from coschedule.reconcile.model import Plan, Requeue
from coschedule.reconcile.workqueue import WorkQueue

log = logging.getLogger("coschedule.certificates")

KEY = "certificates"
MAX_STEPS = 8  # a rotation is at most new CA, store, publish, issue: more means a fight


@dataclass(frozen=True, slots=True)
class CertificateTargets:
    """Which objects hold the certificate (all by name, in ``namespace``)."""

    namespace: str
    secret: str  # the serving Secret the webhook mounts (kubernetes.io/tls)
    ca_secret: str  # the CA's Secret (its key never reaches the webhook)
    webhook_configs: tuple[str, ...]  # MutatingWebhookConfigurations whose caBundle to keep


class CertificateMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.rotations = Counter(
            "coschedule_certificate_rotations_total",
            "Writes of the self-signed certificate by the reconciler's leader, by what was "
            "written: ca (a new CA), serving (a new serving certificate), ca-bundle (a "
            "webhook configuration's caBundle set to the trust bundle, or repaired).",
            ["part"],
            registry=registry,
        )
        self.managed_expiry = Gauge(
            "coschedule_managed_certificate_expiry_timestamp_seconds",
            "notAfter of the certificates the reconciler keeps (the serving certificate in "
            "its Secret, the CA), as a Unix time.",
            ["part"],
            registry=registry,
        )
        for part in ("ca", "serving", "ca-bundle"):
            self.rotations.labels(part)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _data(secret: Mapping[str, Any] | None, key: str) -> bytes:
    data = (secret or {}).get("data") or {}
    value = data.get(key) if isinstance(data, dict) else None
    if not isinstance(value, str):
        return b""
    try:
        return base64.b64decode(value)
    except ValueError:
        return b""


def _pair(secret: Mapping[str, Any] | None) -> KeyPair | None:
    cert, key = _data(secret, CERT_FILE), _data(secret, KEY_FILE)
    return KeyPair(cert, key) if cert and key else None


def _version(obj: Mapping[str, Any] | None) -> str | None:
    meta = (obj or {}).get("metadata") or {}
    version = meta.get("resourceVersion")
    return str(version) if version else None


class CertificateController:
    """Keeps the serving certificate and the caBundles (one key, the leader only)."""

    name = "certificates"
    probe = "certificates"
    log = log
    workers = 1

    def __init__(
        self,
        client: KubeClient,
        targets: CertificateTargets,
        policy: RotationPolicy,
        registry: CollectorRegistry,
        *,
        leading: Callable[[], bool],
        now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        retry_base: float | None = None,
    ) -> None:
        self.client = client
        self.targets = targets
        self.policy = policy
        self.leading = leading
        self.now = now
        self.metrics = CertificateMetrics(registry)
        self.queue = WorkQueue() if retry_base is None else WorkQueue(retry_base=retry_base)
        self.configs = [
            Informer(
                client,
                object_path(WEBHOOK_API, "mutatingwebhookconfigurations"),
                name=f"mutatingwebhookconfiguration/{name}",
                field_selector=f"metadata.name={name}",
            )
            for name in targets.webhook_configs
        ]
        for informer in self.configs:
            informer.add_handler(lambda _event, _obj, _old: self.queue.add(KEY))
        self._published: tuple[frozenset[str], ...] | None = None
        self._published_since: dt.datetime | None = None
        self._detail: str | None = None

    # ---- the manager's protocol ---------------------------------------------------------

    def informer_runs(self) -> list[Coroutine[Any, Any, None]]:
        return [informer.run() for informer in self.configs]

    async def wait_synced(self) -> None:
        for informer in self.configs:
            await informer.synced.wait()

    def take_over(self) -> None:
        # What we saw published before leading tells nothing of how long it has been trusted.
        self._published = None
        self.queue.add(KEY)

    def leader_runs(self) -> list[Coroutine[Any, Any, None]]:
        return []

    def readiness(self) -> tuple[bool, str | None]:
        ready, waiting = caches_readiness(self.configs, self.client)
        if not ready:
            return ready, waiting
        return True, self._detail

    def settings_changed(self) -> None:
        """Nothing here reads the settings (the flags say what to keep)."""

    def log_fields(self, key: str) -> dict[str, str]:
        return {"secret": f"{self.targets.namespace}/{self.targets.secret}"}

    async def reconcile(self, key: str) -> Plan:
        step = Step(StepKind.WAIT, "not looked yet")
        for _ in range(MAX_STEPS):
            observed, objects = await self.observe()
            now = self.now()
            step = decide(observed, self.policy, now)
            self._detail = describe(observed, self.policy, now)
            self._gauge(observed)
            if step.kind is StepKind.WAIT:
                return Plan(requeue=Requeue(step.after, step.why))
            if not self.leading():
                raise NotLeader
            await self.execute(step, observed, objects)
        return Plan(
            requeue=Requeue(self.policy.settle.total_seconds(), f"still changing: {step.why}"),
            warning=f"certificate not steady after {MAX_STEPS} steps; last: {step.why}",
        )

    # ---- observe ------------------------------------------------------------------------

    def _secret_path(self, name: str) -> str:
        return object_path("v1", "secrets", self.targets.namespace, name)

    async def observe(self) -> tuple[CertObserved, dict[str, Obj | None]]:
        """Fresh reads (our own last write included): both Secrets and every config."""
        ca_secret = await self.client.get(self._secret_path(self.targets.ca_secret))
        serving = await self.client.get(self._secret_path(self.targets.secret))
        objects: dict[str, Obj | None] = {"ca": ca_secret, "serving": serving}
        published: list[bytes] = []
        for name in self.targets.webhook_configs:
            path = object_path(WEBHOOK_API, "mutatingwebhookconfigurations", name=name)
            config = await self.client.get(path)
            objects[f"config/{name}"] = config
            for hook in (config or {}).get("webhooks") or []:
                encoded = ((hook or {}).get("clientConfig") or {}).get("caBundle") or ""
                try:
                    published.append(base64.b64decode(encoded))
                except ValueError:
                    published.append(b"")
        seen = tuple(frozenset(fingerprint(c) for c in pem_certificates(b)) for b in published)
        if seen != self._published:
            self._published = seen
            self._published_since = self.now()
        return (
            CertObserved(
                ca=_pair(ca_secret),
                stored_trust=_data(ca_secret, CA_FILE),
                serving_exists=serving is not None,
                serving=_pair(serving),
                serving_trust=_data(serving, CA_FILE),
                published=tuple(published),
                published_since=self._published_since,
            ),
            objects,
        )

    def _gauge(self, observed: CertObserved) -> None:
        for part, pair in (("ca", observed.ca), ("serving", observed.serving)):
            certs = pem_certificates(pair.cert_pem) if pair is not None else []
            if certs:
                self.metrics.managed_expiry.labels(part).set(
                    certs[0].not_valid_after_utc.timestamp()
                )

    # ---- act ----------------------------------------------------------------------------

    async def execute(
        self, step: Step, observed: CertObserved, objects: Mapping[str, Obj | None]
    ) -> None:
        targets = self.targets
        fields = {"why": step.why}
        if step.kind is StepKind.NEW_CA:
            ca = generate_ca(self.policy.ca_validity, now=self.now())
            trust = b"".join((ca.cert_pem, *step.trust))
            data = {CERT_FILE: ca.cert_pem, KEY_FILE: ca.key_pem, CA_FILE: trust}
            await self._write_secret(targets.ca_secret, objects["ca"], data)
            self.metrics.rotations.labels("ca").inc()
            log.info("new CA", extra={**fields, "kept": len(step.trust)})
        elif step.kind is StepKind.STORE_TRUST:
            await self._write_secret(
                targets.ca_secret, objects["ca"], {CA_FILE: b"".join(step.trust)}
            )
            log.info("trust bundle stored", extra={**fields, "cas": len(step.trust)})
        elif step.kind is StepKind.PUBLISH:
            bundle = _b64(b"".join(step.trust))
            for name in targets.webhook_configs:
                config = objects.get(f"config/{name}")
                if config is not None:
                    await patch_ca_bundle(self.client, config, bundle, precondition=True)
            self.metrics.rotations.labels("ca-bundle").inc()
            log.info("caBundle set", extra={**fields, "cas": len(step.trust)})
        elif step.kind is StepKind.ISSUE:
            assert observed.ca is not None
            serving = issue_serving(
                observed.ca, list(self.policy.names), self.policy.validity, now=self.now()
            )
            data = {
                CERT_FILE: serving.cert_pem,
                KEY_FILE: serving.key_pem,
                CA_FILE: b"".join(step.trust),
            }
            await self._write_secret(targets.secret, objects["serving"], data)
            self.metrics.rotations.labels("serving").inc()
            not_after = pem_certificates(serving.cert_pem)[0].not_valid_after_utc
            log.info(
                "serving certificate renewed",
                extra={**fields, "not_after": not_after.isoformat()},
            )

    async def _write_secret(
        self, name: str, current: Obj | None, data: Mapping[str, bytes]
    ) -> None:
        encoded = {k: _b64(v) for k, v in data.items()}
        path = self._secret_path(name)
        if current is None:
            # The install ships both Secrets; the reconciler may not create Secrets.
            raise ApiError(
                404,
                "NotFound",
                f"Secret {self.targets.namespace}/{name} does not exist: the install creates "
                "it (the self-signed overlay or the chart); re-apply it",
            )
        body = {"metadata": {"resourceVersion": _version(current)}, "data": encoded}
        await self.client.patch(path, body)
