"""A webhook called before it has read its caches (a URL-registered webhook, a readiness race,
a restart behind ``--enable-aggregator-routing``), against the real kube-apiserver.

A second ``coschedule serve`` is started beside the session's, with the session's identity,
certificate and config, and reaches the API server through a link the test controls:
- held for a moment: a review posted before its namespace cache is read waits for it and
  gets the namespace's mode (the cluster's mode would leave the pod alone);
- never there (nothing listens): the call fails with HTTP 503, and kube-apiserver applies the
  webhook's failurePolicy to it exactly as in an outage: Ignore admits the pod unmarked, Fail
  refuses it.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import copy
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest
import yaml

from coschedule import certs
from coschedule.marks import LABEL_PLACEHOLDER, run_placeholder
from tests.e2e.cluster import Proc, free_port
from tests.e2e.conftest import E2E
from tests.e2e.install import FALLBACK_WEBHOOK, _env
from tests.e2e.kube import ApiError, Obj
from tests.e2e.world import bare_pod, make_namespace, unique
from tests.fixtures import admission_review, load_pod

pytestmark = pytest.mark.e2e

POD = "tekton-taskrun-no-workspace"  # run pr-7f3k2, no claim: left alone in workspaces mode
RULE = "caches-not-synced"


class HeldLink:
    """A TCP relay on loopback to the API server that holds every connection until
    ``release()``: the webhook starts, but its first list is not answered before."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.released = threading.Event()
        self.closing = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.closing.set()
        self.released.set()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.sockets.append(conn)
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        self.released.wait()
        if self.closing.is_set():
            return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            conn.close()
            return
        upstream.settimeout(None)
        self.sockets.append(upstream)
        threading.Thread(target=_pump, args=(upstream, conn), daemon=True).start()
        _pump(conn, upstream)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


class ColdWebhook:
    """``coschedule serve`` as the session's, whose kubeconfig names ``server``."""

    def __init__(self, e2e: E2E, server: str, workdir: Path) -> None:
        product = e2e.product
        assert product.webhook_kubeconfig is not None
        assert product.cert_dir is not None
        assert product.config_dir is not None
        doc = yaml.safe_load(product.webhook_kubeconfig.read_text())
        doc["clusters"][0]["cluster"]["server"] = server
        kubeconfig = workdir / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(doc))
        kubeconfig.chmod(0o600)
        self.ca_file = product.cert_dir / certs.CA_FILE
        self.ca_bundle = product.ca_bundle
        self.port, self.health = free_port(), free_port()
        self.proc = Proc(
            "coschedule-serve-cold",
            [
                sys.executable,
                "-m",
                "coschedule.cli.main",
                "serve",
                "--kubeconfig",
                str(kubeconfig),
                "--cert-dir",
                str(product.cert_dir),
                "--config-dir",
                str(product.config_dir),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--health-port",
                str(self.health),
            ],
            workdir / "coschedule-serve-cold.log",
            env=_env(),
            cwd=workdir,
        ).start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            verify=ssl.create_default_context(cafile=str(self.ca_file)),
            timeout=10,
        )

    def wait_listening(self) -> None:
        """Its HTTPS listener answers; its ``/readyz`` still says the caches are not read."""
        deadline = time.monotonic() + 30
        with self.client() as http:
            while True:
                if not self.proc.alive():
                    raise AssertionError(f"serve exited:\n{self.proc.tail(40)}")
                with contextlib.suppress(httpx.TransportError):
                    if http.get("/livez").status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise AssertionError(f"not listening in 30 s:\n{self.proc.tail(40)}")
                time.sleep(0.05)
        readyz = httpx.get(f"http://127.0.0.1:{self.health}/readyz", timeout=5)
        assert readyz.status_code == 503, readyz.text
        assert readyz.json()["checks"]["namespace-cache"]["ok"] is False

    def post(self, review: Obj) -> httpx.Response:
        with self.client() as http:
            return http.post(
                "/mutate",
                content=orjson.dumps(review),
                headers={"Content-Type": "application/json"},
            )


@pytest.fixture
def cold(e2e: E2E, tmp_path: Path) -> Iterator[Callable[[str], ColdWebhook]]:
    started: list[ColdWebhook] = []

    def start(server: str) -> ColdWebhook:
        started.append(ColdWebhook(e2e, server, tmp_path))
        return started[-1]

    yield start
    for webhook in started:
        webhook.proc.stop()


def run_pod_review(namespace: str) -> Obj:
    pod = load_pod(POD)
    pod["metadata"]["namespace"] = namespace
    return admission_review(pod, namespace=namespace)


def test_a_review_before_the_namespace_cache_is_read_gets_the_namespaces_mode(
    e2e: E2E, namespace: Callable[..., str], cold: Callable[[str], ColdWebhook]
) -> None:
    ns = namespace(mode="pipelineruns")  # the cluster's mode is workspaces
    api = urlsplit(e2e.api.server)
    link = HeldLink((api.hostname or "127.0.0.1", api.port or 443))
    try:
        webhook = cold(f"https://127.0.0.1:{link.port}")
        webhook.wait_listening()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            answer = pool.submit(webhook.post, review := run_pod_review(ns))
            time.sleep(0.3)
            assert not answer.done()  # it waits for the namespaces; it does not guess
            link.release()
            response = answer.result(timeout=10)
    finally:
        link.close()
    assert response.status_code == 200, response.text
    decided: Obj = response.json()["response"]
    assert decided["uid"] == review["request"]["uid"]
    assert decided["allowed"] is True
    assert "patch" in decided, f"decided with the cluster's mode: {decided}"
    ops = orjson.loads(base64.b64decode(decided["patch"]))
    label = LABEL_PLACEHOLDER.replace("~", "~0").replace("/", "~1")
    placeholder = [op["value"] for op in ops if op["path"] == f"/metadata/labels/{label}"]
    assert placeholder == [run_placeholder(ns, "pr-7f3k2")], ops
    assert RULE not in webhook.proc.log()


def cold_registration(webhook: ColdWebhook, name: str, selector: str, policy: str) -> Obj:
    hook: dict[str, Any] = copy.deepcopy(FALLBACK_WEBHOOK)
    hook.update(
        name="pods.cold.coschedule.dev",
        failurePolicy=policy,
        namespaceSelector={"matchLabels": {selector: "true"}},
        clientConfig={"url": f"{webhook.url}/mutate", "caBundle": webhook.ca_bundle},
    )
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"e2e": "true"}},
        "webhooks": [hook],
    }


def test_a_webhook_that_cannot_reach_the_api_server_answers_503_and_the_policy_applies(
    e2e: E2E, cold: Callable[[str], ColdWebhook]
) -> None:
    webhook = cold(f"https://127.0.0.1:{free_port()}")  # nothing listens there
    webhook.wait_listening()
    response = webhook.post(run_pod_review("ci"))
    # An HTTP error with a JSON body, not a review: the API server's failurePolicy decides.
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert f"rule {RULE}" in body["error"]
    assert (body["kind"], body["status"], body["code"]) == ("Status", "Failure", 503)
    assert body["message"] == body["error"]
    assert f"admission refused: {RULE}" in webhook.proc.log()

    # Through kube-apiserver, in a namespace only this registration selects (not enabled for
    # the session's webhook): Ignore admits the pod as it is, Fail refuses it.
    selector = "e2e.coschedule.dev/cold"
    ns = unique("e2e-cold")
    make_namespace(e2e.api, ns, None, enabled=False, extra_labels={selector: "true"})
    name = unique("coschedule-e2e-cold")
    e2e.api.create(cold_registration(webhook, name, selector, "Ignore"))
    try:
        run = {"tekton.dev/pipelineRun": "pr-cold"}
        created = _create_when_registered(e2e, bare_pod(ns, "admitted", run), webhook)
        labels = created["metadata"].get("labels") or {}
        assert LABEL_PLACEHOLDER not in labels
        assert labels == run

        e2e.api.patch(
            "MutatingWebhookConfiguration",
            name,
            [{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Fail"}],
            patch_type="application/json-patch+json",
        )
        refusal = _refused(e2e, bare_pod(ns, "refused", run))
        assert "pods.cold.coschedule.dev" in refusal
        assert f"rule {RULE}" in refusal, refusal  # the webhook's message reaches the user
    finally:
        with contextlib.suppress(ApiError):
            e2e.api.delete("MutatingWebhookConfiguration", name)
        with contextlib.suppress(ApiError):
            e2e.api.delete("Namespace", ns)


def _calls(webhook: ColdWebhook) -> int:
    return webhook.proc.log().count(f"admission refused: {RULE}")


def _create_when_registered(e2e: E2E, pod: Obj, webhook: ColdWebhook) -> Obj:
    """Create the pod once the API server calls the new registration (its webhook list is
    watch-fed: a moment after the create): a pod created before would not prove anything."""
    deadline = time.monotonic() + 30
    before = _calls(webhook)
    index = 0
    while True:
        manifest = copy.deepcopy(pod)
        manifest["metadata"]["name"] = f"{pod['metadata']['name']}-{index}"
        created = e2e.api.create(manifest)
        if _calls(webhook) > before:
            return created
        assert time.monotonic() < deadline, "the API server never called the registration"
        index += 1
        time.sleep(0.2)


def _refused(e2e: E2E, pod: Obj) -> str:
    """Create the pod until the API server refuses it (the patched failurePolicy reaches it
    through its watch); the refusal's message. No pod of that name is left."""
    deadline = time.monotonic() + 30
    index = 0
    while True:
        manifest = copy.deepcopy(pod)
        manifest["metadata"]["name"] = name = f"{pod['metadata']['name']}-{index}"
        refusal: ApiError | None = None
        try:
            e2e.api.create(manifest)
        except ApiError as exc:
            refusal = exc
        if refusal is not None:
            assert refusal.status == 500, refusal.body  # the webhook call failed
            assert e2e.api.get("Pod", name, pod["metadata"]["namespace"]) is None
            return refusal.body
        assert time.monotonic() < deadline, "the API server kept applying failurePolicy Ignore"
        index += 1
        time.sleep(0.2)
