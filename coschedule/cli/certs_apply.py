"""``coschedule certs --apply-to-secret NS/NAME --patch-webhook NAME``: install a certificate
in a cluster without kubectl (the self-signed overlay's Job runs this in the image).

It writes the ``kubernetes.io/tls`` Secret the webhook mounts and sets the ``caBundle`` of
every webhook of one MutatingWebhookConfiguration, by name, and touches nothing else. Run
again, it keeps a certificate that still covers the names and is valid for more than
``renew_before`` (so re-applying the overlay is harmless). When it does replace one, the
caBundle first trusts both the new and the old CA, then the Secret changes: the API server
never sees a certificate it does not trust while the webhook reloads its files.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import httpx
from cryptography import x509

from coschedule.certs import CA_FILE, CERT_FILE, KEY_FILE, CertBundle
from coschedule.kube.client import ApiError, object_path
from coschedule.kube.webhook_config import WEBHOOK_API, NoWebhooks, Patcher, patch_ca_bundle

SECRET_TYPE = "kubernetes.io/tls"
MERGE = "application/merge-patch+json"


class ApplyError(RuntimeError):
    """Why the certificate could not be installed; says which object and what to check."""


class Api(Patcher, Protocol):
    async def get(self, path: str) -> dict[str, Any] | None: ...

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...


def parse_secret_ref(text: str) -> tuple[str, str]:
    """``NS/NAME`` -> (ns, name); ValueError with a usable message otherwise."""
    namespace, sep, name = text.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(f"--apply-to-secret wants NAMESPACE/NAME, not {text!r}")
    return namespace, name


def bundle_from_secret(secret: Mapping[str, Any] | None) -> CertBundle | None:
    data = secret.get("data") if secret else None
    if not isinstance(data, dict) or not all(
        isinstance(data.get(k), str) and data[k] for k in (CA_FILE, CERT_FILE, KEY_FILE)
    ):
        return None
    try:
        return CertBundle(
            ca_pem=base64.b64decode(data[CA_FILE]),
            cert_pem=base64.b64decode(data[CERT_FILE]),
            key_pem=base64.b64decode(data[KEY_FILE]),
        )
    except ValueError:
        return None


def still_good(
    bundle: CertBundle, names: list[str], *, now: dt.datetime, renew_before: dt.timedelta
) -> bool:
    """The certificate covers ``names`` and stays valid past ``now + renew_before``."""
    try:
        cert = x509.load_pem_x509_certificate(bundle.cert_pem)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return False
    covered = {str(n) for n in san.get_values_for_type(x509.DNSName)}
    covered |= {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    return set(names) <= covered and cert.not_valid_after_utc - now > renew_before


def _ca_still_valid(ca_pem: bytes, now: dt.datetime) -> bool:
    try:
        return x509.load_pem_x509_certificate(ca_pem).not_valid_after_utc > now
    except ValueError:
        return False


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


async def _get_webhook_config(
    api: Api, name: str, *, wait: float, sleep: Callable[[float], Any]
) -> dict[str, Any]:
    """The configuration, waiting for it a while: ``kubectl apply -k`` creates it last."""
    path = object_path(WEBHOOK_API, "mutatingwebhookconfigurations", name=name)
    waited = 0.0
    while True:
        found = await api.get(path)
        if found is not None:
            return found
        if waited >= wait:
            raise ApplyError(f"MutatingWebhookConfiguration {name} not found after {wait:.0f}s")
        await sleep(2.0)
        waited += 2.0


async def _write_secret(
    api: Api, namespace: str, name: str, bundle: CertBundle, existing: bool
) -> None:
    data = {
        CA_FILE: _b64(bundle.ca_pem),
        CERT_FILE: _b64(bundle.cert_pem),
        KEY_FILE: _b64(bundle.key_pem),
    }
    path = object_path("v1", "secrets", namespace, name)
    if existing:
        await api.patch(path, {"data": data}, content_type=MERGE)
        return
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "coschedule"},
        },
        "type": SECRET_TYPE,
        "data": data,
    }
    try:
        await api.create(object_path("v1", "secrets", namespace), body)
    except ApiError as exc:
        if exc.status != 409:
            raise
        await api.patch(path, {"data": data}, content_type=MERGE)


async def apply_in_cluster(
    api: Api,
    names: list[str],
    *,
    secret: tuple[str, str] | None,
    webhook_config: str | None,
    generate: Callable[[list[str]], CertBundle],
    renew_before: dt.timedelta = dt.timedelta(days=30),
    wait: float = 120.0,
    now: dt.datetime | None = None,
    sleep: Callable[[float], Any] = asyncio.sleep,
) -> tuple[CertBundle, bool]:
    """Install the certificate; returns (the bundle in use, whether it is new)."""
    now = now or dt.datetime.now(dt.UTC)
    current: CertBundle | None = None
    secret_obj: dict[str, Any] | None = None
    try:
        if secret is not None:
            secret_obj = await api.get(object_path("v1", "secrets", secret[0], secret[1]))
            current = bundle_from_secret(secret_obj)
        if current is not None and still_good(current, names, now=now, renew_before=renew_before):
            bundle, fresh = current, False
        else:
            bundle, fresh = generate(names), True
        if webhook_config is not None:
            config = await _get_webhook_config(api, webhook_config, wait=wait, sleep=sleep)
            trusted = bundle.ca_pem
            rotating = fresh and current is not None and current.ca_pem != bundle.ca_pem
            if rotating and current is not None and _ca_still_valid(current.ca_pem, now):
                trusted = bundle.ca_pem + current.ca_pem  # until the webhook reloads
            try:
                await patch_ca_bundle(api, config, _b64(trusted))
            except NoWebhooks as exc:
                raise ApplyError(str(exc)) from None
        if secret is not None and fresh:
            await _write_secret(api, secret[0], secret[1], bundle, secret_obj is not None)
    except ApiError as exc:
        hint = " (check the RBAC of the Job's ServiceAccount)" if exc.status == 403 else ""
        raise ApplyError(f"{exc}{hint}") from None
    except httpx.HTTPError as exc:
        raise ApplyError(f"cannot reach the API server: {exc!r}") from None
    return bundle, fresh
