"""``coschedule certs --apply-to-secret/--patch-webhook`` against a fake API server."""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Mapping
from typing import Any

import pytest

from coschedule import certs
from coschedule.cli.certs_apply import (
    ApplyError,
    apply_in_cluster,
    parse_secret_ref,
)
from coschedule.kube.client import STRATEGIC_MERGE, ApiError

SECRET = "/api/v1/namespaces/coschedule-system/secrets/coschedule-webhook-tls"
SECRETS = "/api/v1/namespaces/coschedule-system/secrets"
MWC = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/coschedule"
NAMES = certs.service_dns_names("coschedule-webhook", "coschedule-system")


class FakeApi:
    def __init__(self, objects: dict[str, dict[str, Any]], deny: set[str] | None = None) -> None:
        self.objects = objects
        self.deny = deny or set()
        self.calls: list[tuple[str, str, Any]] = []

    async def get(self, path: str) -> dict[str, Any] | None:
        self.calls.append(("GET", path, None))
        return self.objects.get(path)

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(("POST", path, body))
        if "POST" in self.deny:
            raise ApiError(403, "Forbidden", "no")
        self.objects[f"{path}/{body['metadata']['name']}"] = dict(body)
        return dict(body)

    async def patch(
        self,
        path: str,
        body: Any,
        *,
        content_type: str = "application/merge-patch+json",
        params: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        self.calls.append(("PATCH", path, (content_type, body)))
        obj = self.objects[path]
        if path == MWC:
            assert content_type == STRATEGIC_MERGE
            by_name = {h["name"]: h for h in body["webhooks"]}
            for hook in obj["webhooks"]:
                hook["clientConfig"].update(by_name[hook["name"]]["clientConfig"])
        else:
            obj["data"] = body["data"]
        return obj


def mwc() -> dict[str, Any]:
    return {
        "metadata": {"name": "coschedule"},
        "webhooks": [{"name": "pods.coschedule.dev", "clientConfig": {"service": {}}}],
    }


def ca_bundle(api: FakeApi) -> bytes:
    return base64.b64decode(api.objects[MWC]["webhooks"][0]["clientConfig"]["caBundle"])


async def no_sleep(_: float) -> None:
    return None


async def run(api: FakeApi, **kw: Any) -> tuple[certs.CertBundle, bool]:
    return await apply_in_cluster(
        api,
        NAMES,
        secret=("coschedule-system", "coschedule-webhook-tls"),
        webhook_config="coschedule",
        generate=lambda n: certs.generate(n),
        sleep=no_sleep,
        **kw,
    )


async def test_first_run_creates_the_secret_and_sets_the_ca_bundle() -> None:
    api = FakeApi({MWC: mwc()})
    bundle, fresh = await run(api)
    assert fresh
    secret = api.objects[SECRET]
    assert secret["type"] == "kubernetes.io/tls"
    assert base64.b64decode(secret["data"]["tls.crt"]) == bundle.cert_pem
    assert ca_bundle(api) == bundle.ca_pem
    # The caBundle is set before the Secret the webhook would serve appears.
    order = [(m, p) for m, p, _ in api.calls if m != "GET"]
    assert order == [("PATCH", MWC), ("POST", SECRETS)]


async def test_second_run_keeps_a_valid_certificate() -> None:
    api = FakeApi({MWC: mwc()})
    first, _ = await run(api)
    before = len(api.calls)
    again, fresh = await run(api)
    assert not fresh
    assert again == first
    assert ca_bundle(api) == first.ca_pem
    assert [m for m, path, _ in api.calls[before:] if path == SECRET or m == "POST"] == ["GET"]


async def test_renewal_trusts_both_cas_then_replaces_the_secret() -> None:
    api = FakeApi({MWC: mwc()})
    old, _ = await run(api)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=340)
    new, fresh = await run(api, now=later)
    assert fresh
    assert new.ca_pem != old.ca_pem
    assert ca_bundle(api) == new.ca_pem + old.ca_pem
    assert base64.b64decode(api.objects[SECRET]["data"]["tls.key"]) == new.key_pem


async def test_other_names_mean_a_new_certificate() -> None:
    api = FakeApi({MWC: mwc()})
    await apply_in_cluster(
        api,
        ["other"],
        secret=("coschedule-system", "coschedule-webhook-tls"),
        webhook_config="coschedule",
        generate=lambda n: certs.generate(n),
        sleep=no_sleep,
    )
    _, fresh = await run(api)
    assert fresh


async def test_missing_configuration_is_waited_for_then_reported() -> None:
    api = FakeApi({})
    with pytest.raises(ApplyError, match="not found after 4s"):
        await run(api, wait=4.0)
    assert SECRET not in api.objects, "no Secret without a configuration to trust it"


async def test_forbidden_names_the_rbac() -> None:
    api = FakeApi({MWC: mwc()}, deny={"POST"})
    with pytest.raises(ApplyError, match="RBAC"):
        await run(api)


@pytest.mark.parametrize("text", ["name", "/name", "ns/", "a/b/c"])
def test_secret_ref_needs_namespace_and_name(text: str) -> None:
    with pytest.raises(ValueError, match="NAMESPACE/NAME"):
        parse_secret_ref(text)


def test_cli_refuses_without_a_cluster(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from coschedule.cli.main import EXIT_USAGE, main

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    code = main(["certs", "--service", "s", "--out", str(tmp_path / "c"), "--patch-webhook", "x"])
    assert code == EXIT_USAGE
