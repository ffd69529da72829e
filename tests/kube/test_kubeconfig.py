"""Kubeconfig credentials: exec plugins (EKS, GKE) and key material that never stays on disk."""

from __future__ import annotations

import base64
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from coschedule import certs
from coschedule.kube.client import KubeClient, KubeConfigError, from_kubeconfig
from tests.reconcile.apiserver import MiniApi

# A tiny exec credential plugin, as aws-iam-authenticator or gke-gcloud-auth-plugin behave:
# it prints an ExecCredential; each run mints the next token ("token-1", "token-2", ...).
PLUGIN = """
import json, os, sys, datetime
counter, expires_in = sys.argv[1], float(sys.argv[2])
runs = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
open(counter, "w").write(str(runs))
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
assert info["kind"] == "ExecCredential", info
expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=expires_in)
print(json.dumps({
    "apiVersion": info["apiVersion"],
    "kind": "ExecCredential",
    "status": {
        "token": os.environ["TOKEN_PREFIX"] + str(runs),
        "expirationTimestamp": expiry.strftime("%Y-%m-%dT%H:%M:%SZ"),
    },
}))
"""


def kubeconfig(tmp_path: Path, server: str, user: dict[str, Any]) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "test",
        "contexts": [{"name": "test", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": user}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def exec_user(tmp_path: Path, expires_in: float) -> dict[str, Any]:
    script = tmp_path / "plugin.py"
    script.write_text(PLUGIN)
    return {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(script), str(tmp_path / "runs"), str(expires_in)],
            "env": [{"name": "TOKEN_PREFIX", "value": "token-"}],
            "interactiveMode": "Never",
        }
    }


def runs(tmp_path: Path) -> int:
    return int((tmp_path / "runs").read_text())


async def test_exec_plugin_token_is_cached_and_renewed_on_401(api: MiniApi, tmp_path: Path) -> None:
    api.tokens = {"token-1"}
    creds = from_kubeconfig(kubeconfig(tmp_path, api.url, exec_user(tmp_path, 3600)))
    client = KubeClient(creds, timeout=5.0)
    try:
        await client.list("/api/v1/nodes")
        await client.list("/api/v1/nodes")
        assert runs(tmp_path) == 1  # cached until its expirationTimestamp
        # The server stops accepting the token (revoked, rotated): the plugin runs again
        # and the request is retried once with the new token.
        api.tokens = {"token-2"}
        await client.list("/api/v1/nodes")
        assert runs(tmp_path) == 2
        assert api.count("GET", "nodes") == 4  # three lists, one of them sent twice
    finally:
        await client.aclose()


async def test_exec_plugin_runs_again_once_the_token_expired(api: MiniApi, tmp_path: Path) -> None:
    api.tokens = {"token-1", "token-2", "token-3"}
    creds = from_kubeconfig(kubeconfig(tmp_path, api.url, exec_user(tmp_path, -60)))
    client = KubeClient(creds, timeout=5.0)  # runs it once: does it give a client cert?
    try:
        assert runs(tmp_path) == 1
        await client.list("/api/v1/nodes")
        await client.list("/api/v1/nodes")
        assert runs(tmp_path) == 3  # every request found the credential expired
        assert api.count("GET", "nodes") == 2  # and none was refused
    finally:
        await client.aclose()


def test_a_failing_exec_plugin_is_a_kubeconfig_error(tmp_path: Path) -> None:
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/false"}}
    creds = from_kubeconfig(kubeconfig(tmp_path, "https://127.0.0.1:1", user))
    assert creds.exec_plugin is not None
    with pytest.raises(KubeConfigError, match="exited 1"):
        creds.exec_plugin.credential()


def test_client_key_data_leaves_no_file_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    bundle = certs.generate(["localhost"])
    user = {
        "client-certificate-data": base64.b64encode(bundle.cert_pem).decode(),
        "client-key-data": base64.b64encode(bundle.key_pem).decode(),
    }
    path = kubeconfig(tmp_path, "https://127.0.0.1:1", user)
    doc = yaml.safe_load(path.read_text())
    doc["clusters"][0]["cluster"]["certificate-authority-data"] = base64.b64encode(
        bundle.ca_pem
    ).decode()
    path.write_text(yaml.safe_dump(doc))
    creds = from_kubeconfig(path)
    assert creds.cert_file is None
    assert creds.key_file is None
    assert creds.ca_file is None
    KubeClient(creds)  # loads the key into its TLS context
    assert list(scratch.iterdir()) == []
