"""The one module that talks to the Kubernetes API: plain HTTP(S) with httpx, JSON as dicts.

No client model objects: objects are parsed with orjson into dicts, the shape the decision
code reads. Credentials come from a kubeconfig (certificates, tokens) or the in-cluster
ServiceAccount, whose projected token is re-read as it rotates.
"""

from __future__ import annotations

import base64
import contextlib
import os
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import yaml

from coschedule.kube.reachability import ApiReachability, is_unreachable

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_SECONDS = 60.0


class KubeConfigError(ValueError):
    """Credentials that cannot be used; the message says which part."""


class ApiError(Exception):
    """A non-2xx answer; ``status`` is the HTTP code, ``reason`` the Status reason."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def retryable(self) -> bool:
        return self.status in (409, 429) or self.status >= 500


@dataclass(frozen=True, slots=True)
class Credentials:
    server: str
    ca_file: str | None = None
    insecure: bool = False
    token: str | None = None
    token_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    namespace: str = "default"


def _materialize(data_b64: str, suffix: str) -> str:
    """Write a ``*-data`` kubeconfig field to a private file: ssl wants paths."""
    fd, path = tempfile.mkstemp(prefix="coschedule-", suffix=suffix)
    with os.fdopen(fd, "wb") as handle:
        handle.write(base64.b64decode(data_b64))
    return path


def _by_name(items: Any, name: str, what: str) -> Mapping[str, Any]:
    for item in items or ():
        if isinstance(item, dict) and item.get("name") == name:
            value = item.get(what)
            return value if isinstance(value, dict) else {}
    raise KubeConfigError(f"kubeconfig: no {what} named {name!r}")


def from_kubeconfig(path: Path, context: str | None = None) -> Credentials:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise KubeConfigError(f"kubeconfig {path}: {exc}") from None
    if not isinstance(doc, dict):
        raise KubeConfigError(f"kubeconfig {path}: not a mapping")
    context_name = context or doc.get("current-context")
    if not context_name:
        raise KubeConfigError(f"kubeconfig {path}: no current-context")
    ctx = _by_name(doc.get("contexts"), context_name, "context")
    cluster = _by_name(doc.get("clusters"), str(ctx.get("cluster")), "cluster")
    user = _by_name(doc.get("users"), str(ctx.get("user")), "user") if ctx.get("user") else {}
    if "exec" in user or "auth-provider" in user:
        raise KubeConfigError(
            "kubeconfig: exec and auth-provider credentials are not supported; use a token "
            "or client certificate (in a cluster, the ServiceAccount is used)"
        )
    base = path.parent

    def file_or_data(
        file_key: str, data_key: str, source: Mapping[str, Any], suffix: str
    ) -> str | None:
        if source.get(data_key):
            return _materialize(str(source[data_key]), suffix)
        if source.get(file_key):
            return str((base / str(source[file_key])).resolve())
        return None

    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise KubeConfigError("kubeconfig: the cluster has no server")
    return Credentials(
        server=server.rstrip("/"),
        ca_file=file_or_data(
            "certificate-authority", "certificate-authority-data", cluster, ".crt"
        ),
        insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
        token=str(user["token"]) if user.get("token") else None,
        token_file=str(user["tokenFile"]) if user.get("tokenFile") else None,
        cert_file=file_or_data("client-certificate", "client-certificate-data", user, ".crt"),
        key_file=file_or_data("client-key", "client-key-data", user, ".key"),
        namespace=str(ctx.get("namespace") or "default"),
    )


def in_cluster(
    environ: Mapping[str, str], sa_dir: Path = SERVICE_ACCOUNT_DIR
) -> Credentials | None:
    host = environ.get("KUBERNETES_SERVICE_HOST")
    port = environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host or not (sa_dir / "token").exists():
        return None
    if ":" in host:
        host = f"[{host}]"
    namespace_file = sa_dir / "namespace"
    return Credentials(
        server=f"https://{host}:{port}",
        ca_file=str(sa_dir / "ca.crt"),
        token_file=str(sa_dir / "token"),
        namespace=namespace_file.read_text().strip() if namespace_file.exists() else "default",
    )


def discover(kubeconfig: str | None, environ: Mapping[str, str]) -> Credentials | None:
    """Explicit kubeconfig, then in-cluster, then ``$KUBECONFIG``/``~/.kube/config``; None
    when there is no cluster to talk to (the webhook then runs on cluster config alone)."""
    if kubeconfig:
        return from_kubeconfig(Path(kubeconfig))
    found = in_cluster(environ)
    if found is not None:
        return found
    env_path = environ.get("KUBECONFIG")
    if env_path:
        return from_kubeconfig(Path(env_path.split(os.pathsep)[0]))
    home = Path(environ.get("HOME", "~")).expanduser() / ".kube" / "config"
    if home.exists():
        return from_kubeconfig(home)
    return None


def require(kubeconfig: str | None, environ: Mapping[str, str], needed_for: str) -> Credentials:
    """``discover`` for commands that cannot work without a cluster."""
    creds = discover(kubeconfig, environ)
    if creds is None:
        raise KubeConfigError(
            f"{needed_for} needs a cluster: give --kubeconfig, or run in a pod with a "
            "ServiceAccount"
        )
    return creds


class _BearerAuth(httpx.Auth):
    def __init__(self, creds: Credentials) -> None:
        self.creds = creds
        self._token = creds.token
        self._read_at = 0.0

    def _current(self) -> str | None:
        if self.creds.token_file and time.monotonic() - self._read_at > TOKEN_REREAD_SECONDS:
            self._token = Path(self.creds.token_file).read_text().strip()
            self._read_at = time.monotonic()
        return self._token

    def auth_flow(self, request: httpx.Request) -> Any:
        token = self._current()
        if token:
            request.headers["Authorization"] = f"Bearer {token}"
        yield request


def _ssl_context(creds: Credentials) -> ssl.SSLContext | bool:
    if creds.insecure:
        return False
    ctx = ssl.create_default_context(cafile=creds.ca_file)
    if creds.cert_file and creds.key_file:
        ctx.load_cert_chain(creds.cert_file, creds.key_file)
    return ctx


def _error(response: httpx.Response) -> ApiError:
    reason, message = response.reason_phrase, response.text[:500]
    try:
        status = orjson.loads(response.content)
        if isinstance(status, dict):
            reason = str(status.get("reason") or reason)
            message = str(status.get("message") or message)
    except orjson.JSONDecodeError:
        pass
    return ApiError(response.status_code, reason, message)


def object_path(
    api_version: str, plural: str, namespace: str | None = None, name: str | None = None
) -> str:
    """``/api/v1/namespaces/ns/pods/name`` or ``/apis/apps/v1/...`` from the parts."""
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = root + (f"/namespaces/{quote(namespace, safe='')}" if namespace else "") + f"/{plural}"
    return path + (f"/{quote(name, safe='')}" if name else "")


class KubeClient:
    def __init__(
        self, creds: Credentials, *, timeout: float = 30.0, user_agent: str = "coschedule"
    ) -> None:
        self.creds = creds
        self.reachability = ApiReachability(creds.server)
        self._http = httpx.AsyncClient(
            base_url=creds.server,
            verify=_ssl_context(creds),
            auth=_BearerAuth(creds),
            timeout=httpx.Timeout(timeout, connect=5.0),
            headers={"User-Agent": user_agent, "Accept": "application/json"},
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        content = orjson.dumps(body) if body is not None else None
        headers = {"Content-Type": content_type} if content is not None else None
        try:
            response = await self._http.request(
                method, path, params=params, content=content, headers=headers
            )
        except httpx.TransportError as exc:
            if is_unreachable(exc):
                self.reachability.failed(exc)
            raise
        self.reachability.answered()
        if response.status_code >= 300:
            raise _error(response)
        doc = orjson.loads(response.content) if response.content else {}
        return doc if isinstance(doc, dict) else {}

    async def get(self, path: str) -> dict[str, Any] | None:
        try:
            return await self._request("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(self, path: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return await self._request("GET", path, params=params)

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self._request("POST", path, body=body)

    async def replace(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """PUT the whole object; with ``metadata.resourceVersion`` set, a stale write is 409."""
        return await self._request("PUT", path, body=body)

    async def patch(
        self,
        path: str,
        body: Any,
        *,
        content_type: str = "application/merge-patch+json",
        params: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        return await self._request(
            "PATCH", path, body=body, content_type=content_type, params=params
        )

    async def delete(
        self,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        """Delete; None when it was already gone (deletes are idempotent for us)."""
        try:
            return await self._request("DELETE", path, body=body)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def watch(self, path: str, params: Mapping[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Stream watch events (``{"type": ..., "object": {...}}``) until the server ends it."""
        query = {**params, "watch": "true"}
        timeout = httpx.Timeout(None, connect=5.0)  # a watch is long by design
        async with self._stream(path, query, timeout) as response:
            if response.status_code >= 300:
                await response.aread()
                raise _error(response)
            async for line in response.aiter_lines():
                if not line:
                    continue
                event = orjson.loads(line)
                if isinstance(event, dict):
                    yield event

    @contextlib.asynccontextmanager
    async def _stream(
        self, path: str, query: Mapping[str, Any], limits: httpx.Timeout
    ) -> AsyncIterator[httpx.Response]:
        try:
            async with self._http.stream("GET", path, params=query, timeout=limits) as response:
                self.reachability.answered()
                yield response
        except httpx.TransportError as exc:
            if is_unreachable(exc):
                self.reachability.failed(exc)
            raise
