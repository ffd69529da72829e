"""The one module that talks to the Kubernetes API: plain HTTP(S) with httpx, JSON as dicts.

No client model objects: objects are parsed with orjson into dicts, the shape the decision
code reads. Credentials come from a kubeconfig (certificates, tokens, exec plugins such as
EKS's and GKE's) or the in-cluster ServiceAccount, whose projected token is re-read as it
rotates. Key material stays in memory: ssl needs files for a client key, so it is written
to a private folder only for the moment of loading and removed at once.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import ssl
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import yaml

from coschedule.k8s.timefmt import parse_time
from coschedule.kube.http1 import STREAM, LeanTransport
from coschedule.kube.reachability import ApiReachability, is_unreachable
from coschedule.wire.watch_events import EVERY_FIELD, EventShape

JSON_PATCH = "application/json-patch+json"  # the content type of a JSON patch (RFC 6902)
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
# Metadata only (client-go's metadata informer): the API server answers a list or a watch
# with PartialObjectMetadata(List), each object's metadata and nothing else; a server that
# does not convert answers the plain JSON after the comma (the same objects, whole).
_AS_METADATA = "application/json;as=PartialObjectMetadata{};g=meta.k8s.io;v=v1,application/json"
METADATA_LIST_ACCEPT = _AS_METADATA.format("List")
METADATA_ACCEPT = _AS_METADATA.format("")
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
    # PEM from a kubeconfig's ``*-data`` fields (kept in memory, never written to disk).
    ca_data: str | None = None
    cert_data: bytes | None = None
    key_data: bytes | None = None
    exec_plugin: ExecPlugin | None = None  # ``users[].user.exec``: run for a credential


def _pem(data_b64: str, what: str) -> bytes:
    try:
        return base64.b64decode(data_b64, validate=True)
    except ValueError:
        raise KubeConfigError(f"kubeconfig: {what} is not base64") from None


# ---- exec credential plugins (client-go's ExecCredential protocol) -------------------------

EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
EXEC_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class ExecCredential:
    token: str | None
    cert_data: bytes | None
    key_data: bytes | None
    expires_at: float | None  # Unix time; None: until the server answers 401


@dataclass(slots=True)
class ExecPlugin:
    """Runs the plugin, caches its credential until ``expirationTimestamp`` (or a 401)."""

    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    api_version: str = EXEC_API_VERSIONS[0]
    cached: ExecCredential | None = None
    runs: int = 0  # how many times the plugin ran

    def credential(self, *, refresh: bool = False) -> ExecCredential:
        cached = self.cached
        fresh = cached is not None and (
            cached.expires_at is None or cached.expires_at > time.time()
        )
        if cached is not None and fresh and not refresh:
            return cached
        self.cached = self._run()
        return self.cached

    def _run(self) -> ExecCredential:
        import subprocess

        info = {"apiVersion": self.api_version, "kind": "ExecCredential", "spec": {}}
        env = {**os.environ, **self.env, "KUBERNETES_EXEC_INFO": orjson.dumps(info).decode()}
        self.runs += 1
        try:
            done = subprocess.run(
                [self.command, *self.args],
                env=env,
                capture_output=True,
                stdin=subprocess.DEVNULL,
                timeout=EXEC_TIMEOUT_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise KubeConfigError(f"kubeconfig exec plugin {self.command}: {exc}") from None
        if done.returncode != 0:
            err = done.stderr.decode(errors="replace").strip()[:300]
            raise KubeConfigError(
                f"kubeconfig exec plugin {self.command} exited {done.returncode}: {err}"
            )
        return parse_exec_credential(done.stdout, self.command)


def parse_exec_credential(output: bytes, command: str) -> ExecCredential:
    try:
        doc = orjson.loads(output)
    except orjson.JSONDecodeError:
        raise KubeConfigError(f"kubeconfig exec plugin {command}: output is not JSON") from None
    status = doc.get("status") if isinstance(doc, dict) else None
    if not isinstance(status, dict):
        raise KubeConfigError(f"kubeconfig exec plugin {command}: no ExecCredential status")
    token = status.get("token")
    cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
    if not isinstance(token, str) and not (isinstance(cert, str) and isinstance(key, str)):
        raise KubeConfigError(
            f"kubeconfig exec plugin {command}: status has neither a token nor a client "
            "certificate and key"
        )
    expires_at = None
    stamp = status.get("expirationTimestamp")
    if isinstance(stamp, str) and stamp:
        expires_at = parse_time(stamp)
        if expires_at is None:
            raise KubeConfigError(
                f"kubeconfig exec plugin {command}: bad expirationTimestamp {stamp!r}"
            )
    return ExecCredential(
        token if isinstance(token, str) else None,
        cert.encode() if isinstance(cert, str) and isinstance(key, str) else None,
        key.encode() if isinstance(cert, str) and isinstance(key, str) else None,
        expires_at,
    )


def _exec_plugin(spec: Mapping[str, Any], base: Path) -> ExecPlugin:
    command = spec.get("command")
    if not isinstance(command, str) or not command:
        raise KubeConfigError("kubeconfig: exec has no command")
    api_version = str(spec.get("apiVersion") or EXEC_API_VERSIONS[0])
    if api_version not in EXEC_API_VERSIONS:
        raise KubeConfigError(f"kubeconfig: exec apiVersion {api_version!r} is not supported")
    if os.sep in command and not os.path.isabs(command):
        command = str((base / command).resolve())  # relative to the kubeconfig, as kubectl
    env = {
        str(e.get("name")): str(e.get("value", ""))
        for e in spec.get("env") or ()
        if isinstance(e, dict) and e.get("name")
    }
    args = tuple(str(a) for a in spec.get("args") or ())
    return ExecPlugin(command, args, env, api_version)


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
    if "auth-provider" in user:
        raise KubeConfigError(
            "kubeconfig: auth-provider credentials are not supported; use a token, a client "
            "certificate or an exec plugin (in a cluster, the ServiceAccount is used)"
        )
    base = path.parent

    def file_of(file_key: str, source: Mapping[str, Any]) -> str | None:
        if source.get(file_key):
            return str((base / str(source[file_key])).resolve())
        return None

    def data_of(data_key: str, source: Mapping[str, Any]) -> bytes | None:
        return _pem(str(source[data_key]), data_key) if source.get(data_key) else None

    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise KubeConfigError("kubeconfig: the cluster has no server")
    ca_data = data_of("certificate-authority-data", cluster)
    plugin = _exec_plugin(user["exec"], base) if isinstance(user.get("exec"), dict) else None
    return Credentials(
        server=server.rstrip("/"),
        ca_file=None if ca_data else file_of("certificate-authority", cluster),
        ca_data=ca_data.decode() if ca_data else None,
        insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
        token=str(user["token"]) if user.get("token") else None,
        token_file=str(user["tokenFile"]) if user.get("tokenFile") else None,
        cert_file=file_of("client-certificate", user),
        key_file=file_of("client-key", user),
        cert_data=data_of("client-certificate-data", user),
        key_data=data_of("client-key-data", user),
        namespace=str(ctx.get("namespace") or "default"),
        exec_plugin=plugin,
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
    when there is no cluster to talk to (the webhook then runs on cluster config alone).

    A kubeconfig's exec plugin is run once here: one that is missing, fails or prints no
    credential is a KubeConfigError at start (one line), not a watch failing forever."""
    if kubeconfig:
        return _with_credential(from_kubeconfig(Path(kubeconfig)))
    found = in_cluster(environ)
    if found is not None:
        return found
    env_path = environ.get("KUBECONFIG")
    if env_path:
        return _with_credential(from_kubeconfig(Path(env_path.split(os.pathsep)[0])))
    home = Path(environ.get("HOME", "~")).expanduser() / ".kube" / "config"
    if home.exists():
        return _with_credential(from_kubeconfig(home))
    return None


def _with_credential(creds: Credentials) -> Credentials:
    if creds.exec_plugin is not None:
        creds.exec_plugin.credential()  # cached for the first request
    return creds


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


class _ExecAuth(httpx.Auth):
    """The exec plugin's token (lightkube's ``ExecAuth``): cached until it expires; on a
    401 the plugin runs again and the request is sent once more."""

    def __init__(self, plugin: ExecPlugin) -> None:
        self.plugin = plugin
        self._lock = asyncio.Lock()

    async def _token(self, refresh: bool) -> str | None:
        async with self._lock:  # one plugin run at a time, however many requests wait
            found = await asyncio.to_thread(self.plugin.credential, refresh=refresh)
        return found.token

    async def async_auth_flow(self, request: httpx.Request) -> Any:
        token = await self._token(refresh=False)
        if token:
            request.headers["Authorization"] = f"Bearer {token}"
        response = yield request
        if response.status_code == 401:
            token = await self._token(refresh=True)
            if token:
                request.headers["Authorization"] = f"Bearer {token}"
            yield request


def _proxied(server: str) -> bool:
    """Whether httpx would send to ``server`` through a proxy the environment names
    (``HTTPS_PROXY`` and the like, unless ``NO_PROXY`` names the server)."""
    url = httpx.URL(server)
    proxies = urllib.request.getproxies()
    return bool(proxies.get(url.scheme) or proxies.get("all")) and not (
        urllib.request.proxy_bypass(url.host)
    )


def _ssl_context(creds: Credentials) -> ssl.SSLContext | bool:
    if creds.insecure:
        return False
    ctx = ssl.create_default_context(cafile=creds.ca_file, cadata=creds.ca_data)
    cert_data, key_data = creds.cert_data, creds.key_data
    if creds.exec_plugin is not None and not (cert_data or creds.cert_file):
        found = creds.exec_plugin.credential()
        cert_data, key_data = found.cert_data, found.key_data
    if cert_data is not None or key_data is not None:
        _load_cert_chain(
            ctx, cert_data or _read(creds.cert_file), key_data or _read(creds.key_file)
        )
    elif creds.cert_file and creds.key_file:
        ctx.load_cert_chain(creds.cert_file, creds.key_file)
    return ctx


def _read(path: str | None) -> bytes:
    if not path:
        raise KubeConfigError(
            "kubeconfig: a client certificate needs its key, and a key its certificate"
        )
    return Path(path).read_bytes()


def _load_cert_chain(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl loads a client key only from a file: write both to a private folder for the
    moment of loading; the folder is gone when this returns."""
    with tempfile.TemporaryDirectory(prefix="coschedule-") as folder:
        cert_path, key_path = Path(folder, "tls.crt"), Path(folder, "tls.key")
        for target, data in ((cert_path, cert), (key_path, key)):
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
        ctx.load_cert_chain(str(cert_path), str(key_path))


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
        self,
        creds: Credentials,
        *,
        timeout: float = 30.0,
        user_agent: str = "coschedule",
        reachability: ApiReachability | None = None,
    ) -> None:
        self.creds = creds
        # Shared by a process's clients of one API server: one "waiting for" line, not one each.
        self.reachability = reachability or ApiReachability(creds.server)
        verify = _ssl_context(creds)
        auth = _ExecAuth(creds.exec_plugin) if creds.exec_plugin else _BearerAuth(creds)
        options: dict[str, Any] = {
            "base_url": creds.server,
            "auth": auth,
            "timeout": httpx.Timeout(timeout, connect=5.0),
            "headers": {"User-Agent": user_agent, "Accept": "application/json"},
        }
        # Our transport (``http1``), watches included, unless a proxy from the environment
        # is to be used, which only httpx's own honours.
        self._http = (
            httpx.AsyncClient(verify=verify, **options)
            if _proxied(creds.server)
            else httpx.AsyncClient(transport=LeanTransport(creds.server, verify), **options)
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
        accept: str | None = None,
        decode: Callable[[bytes], Any] = orjson.loads,
    ) -> dict[str, Any]:
        content = orjson.dumps(body) if body is not None else None
        headers = {"Content-Type": content_type} if content is not None else {}
        if accept is not None:
            headers["Accept"] = accept
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
        doc = decode(response.content) if response.content else {}
        return doc if isinstance(doc, dict) else {}

    async def get(self, path: str) -> dict[str, Any] | None:
        try:
            return await self._request("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(
        self,
        path: str,
        params: Mapping[str, Any] | None = None,
        *,
        accept: str | None = None,
        shape: EventShape = EVERY_FIELD,
    ) -> dict[str, Any]:
        """One page of a list, its items without managedFields (and with ``shape``, only
        the fields it declares); ``accept``: another representation
        (``METADATA_LIST_ACCEPT``)."""
        return await self._request("GET", path, params=params, accept=accept, decode=shape.page)

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
        accept: str | None = None,
    ) -> dict[str, Any]:
        """``accept``: the answer's representation (``METADATA_ACCEPT``: the patched
        object's metadata alone, for a caller that does not read the rest)."""
        return await self._request(
            "PATCH", path, body=body, content_type=content_type, params=params, accept=accept
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

    async def watch(
        self,
        path: str,
        params: Mapping[str, Any],
        *,
        opened: Callable[[], None] | None = None,
        accept: str | None = None,
        read_timeout: float | None = None,
        shape: EventShape = EVERY_FIELD,
    ) -> AsyncIterator[dict[str, Any]]:
        """Stream watch events (``{"type": ..., "object": {...}}``) until the server ends it;
        ``opened()`` once the server accepted the watch (before any event); ``accept``: the
        objects' representation (``METADATA_ACCEPT``); ``read_timeout``: the longest silence
        before ``httpx.ReadTimeout`` (None: wait for ever); ``shape``: the fields decoded."""
        decode_event = shape.event
        query = {**params, "watch": "true"}
        timeout = httpx.Timeout(None, connect=5.0, read=read_timeout)  # long by design
        async with self._stream(path, query, timeout, accept) as response:
            if response.status_code >= 300:
                await response.aread()
                raise _error(response)
            if opened is not None:
                opened()
            # One event per line; lines split as bytes (decoded from bytes: no text decoding)
            # and joined only when an event spans reads; managedFields never built.
            partial: list[bytes] = []
            async for data in response.aiter_bytes():
                *lines, rest = data.split(b"\n")
                if lines and partial:
                    lines[0] = b"".join((*partial, lines[0]))
                    partial.clear()
                if rest:
                    partial.append(rest)
                for line in lines:
                    if line.strip():
                        event = decode_event(line)
                        if isinstance(event, dict):
                            yield event
            last = b"".join(partial)  # a last line the server did not end
            if last.strip():
                event = decode_event(last)
                if isinstance(event, dict):
                    yield event

    @contextlib.asynccontextmanager
    async def _stream(
        self, path: str, query: Mapping[str, Any], limits: httpx.Timeout, accept: str | None
    ) -> AsyncIterator[httpx.Response]:
        headers = {"Accept": accept} if accept is not None else None
        try:
            async with self._http.stream(
                "GET",
                path,
                params=query,
                timeout=limits,
                headers=headers,
                extensions={STREAM: True},
            ) as response:
                self.reachability.answered()
                yield response
        except httpx.TransportError as exc:
            if is_unreachable(exc):
                self.reachability.failed(exc)
            raise
