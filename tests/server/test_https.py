"""The real server process over real HTTPS: reviews, probes, metrics, reloads, bad input."""

from __future__ import annotations

import base64
import datetime as dt
import socket
import ssl
from pathlib import Path
from typing import Any

import httpx
import jsonpatch as reference_jsonpatch
import orjson
import pytest

from coschedule import certs
from coschedule.marks import claim_placeholder, run_placeholder
from tests.conftest import RunningServer, start_server, stop_server, trust, wait_until
from tests.fixtures import admission_review, load_pod

JSON = {"Content-Type": "application/json"}


def post(client: httpx.Client, review: dict[str, Any] | bytes) -> httpx.Response:
    body = review if isinstance(review, bytes) else orjson.dumps(review)
    return client.post("/mutate", content=body, headers=JSON)


def patched_pod(review: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    ops = orjson.loads(base64.b64decode(response["patch"]))
    result: dict[str, Any] = reference_jsonpatch.apply_patch(review["request"]["object"], ops)
    return result


def test_tekton_review_over_https(server: RunningServer) -> None:
    review = admission_review(
        load_pod("tekton-taskrun"), uid="e911857d-c318-11e8-bbad-025000000001"
    )
    with server.client() as client:
        answer = post(client, review)
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    doc = answer.json()
    assert doc["apiVersion"] == "admission.k8s.io/v1"
    assert doc["kind"] == "AdmissionReview"
    response = doc["response"]
    assert response["uid"] == "e911857d-c318-11e8-bbad-025000000001"
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    pod = patched_pod(review, response)
    assert pod["metadata"]["labels"]["coschedule.dev/placeholder"] == claim_placeholder(
        "ci", "pvc-1f1344866c"
    )


def test_dry_run_gets_the_same_answer(server: RunningServer) -> None:
    pod = load_pod("argo-workflow-pod")
    with server.client() as client:
        real = post(client, admission_review(pod, uid="a")).json()["response"]
        dry = post(client, admission_review(pod, uid="a", dry_run=True)).json()["response"]
    assert real == dry


def test_denial_names_rule_and_fix(server: RunningServer) -> None:
    review = admission_review(load_pod("tekton-taskrun-two-workspaces"))
    with server.client() as client:
        response = post(client, review).json()["response"]
    assert response["uid"] == review["request"]["uid"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert "workspaces-single-claim" in response["status"]["message"]
    assert "pipelineruns" in response["status"]["message"]
    assert "patch" not in response


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE"])
def test_other_operations_are_allowed_untouched(server: RunningServer, operation: str) -> None:
    review = admission_review(load_pod("tekton-taskrun"), operation=operation)
    with server.client() as client:
        response = post(client, review).json()["response"]
    assert response == {"uid": review["request"]["uid"], "allowed": True}


@pytest.mark.parametrize(
    ("body", "headers", "status", "fragment"),
    [
        (b"", JSON, 400, "empty body"),
        (b"{", JSON, 400, "not valid JSON"),
        (b"[1,2]", JSON, 400, "JSON object"),
        (
            b'{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview"}',
            JSON,
            400,
            "apiVersion",
        ),
        (
            b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{}}',
            JSON,
            400,
            "uid",
        ),
        (b"{}", {"Content-Type": "text/plain"}, 400, "Content-Type"),
        (b"{}", {}, 400, "Content-Type"),
    ],
)
def test_malformed_requests_get_400_with_json(
    server: RunningServer, body: bytes, headers: dict[str, str], status: int, fragment: str
) -> None:
    with server.client() as client:
        answer = client.post("/mutate", content=body, headers=headers)
    assert answer.status_code == status
    assert fragment in answer.json()["error"]


def test_body_over_7_mib_gets_413(server: RunningServer) -> None:
    big = b'{"pad":"' + b"x" * (7 * 1024 * 1024) + b'"}'
    with server.client() as client:
        answer = client.post("/mutate", content=big, headers=JSON)
        assert answer.status_code == 413
        assert "7 MiB" in answer.json()["error"]

        def chunks() -> Any:
            for _ in range(8):
                yield b"x" * (1024 * 1024)

        # No Content-Length: a chunked body is cut off by counting.
        chunked = client.post("/mutate", content=chunks(), headers=JSON)
        assert chunked.status_code == 413
        # The server is still fine.
        assert client.get("/readyz").status_code == 200


def test_pod_that_is_not_an_object_is_400(server: RunningServer) -> None:
    review = admission_review(load_pod("tekton-taskrun"))
    review["request"]["object"] = "pod"
    with server.client() as client:
        assert post(client, review).status_code == 400
        review["request"]["object"] = {"metadata": {"labels": ["x"]}}
        answer = post(client, review)
    assert answer.status_code == 400
    assert "labels" in answer.json()["error"]


def test_get_on_mutate_is_405(server: RunningServer) -> None:
    with server.client() as client:
        answer = client.get("/mutate")
    assert answer.status_code == 405
    assert answer.headers["allow"] == "POST"


def test_probes_on_both_ports_and_metrics(server: RunningServer) -> None:
    with server.client() as client:
        for path in ("/livez", "/healthz", "/readyz"):
            assert client.get(path).status_code == 200
        post(client, admission_review(load_pod("tekton-taskrun")))
        post(client, admission_review(load_pod("tekton-taskrun-two-workspaces")))
        client.post("/mutate", content=b"{", headers=JSON)
    for path in ("/livez", "/healthz", "/readyz"):
        assert httpx.get(server.health_url + path).status_code == 200
    ready = httpx.get(server.health_url + "/readyz").json()
    assert ready["checks"]["certificate"]["ok"] is True
    assert ready["checks"]["config"]["ok"] is True
    metrics = httpx.get(server.health_url + "/metrics").text
    assert (
        'coschedule_admission_requests_total{allowed="true",code="200",mode="workspaces"} 1.0'
        in metrics
    )
    assert (
        'coschedule_admission_requests_total{allowed="false",code="403",mode="workspaces"} 1.0'
        in metrics
    )
    assert (
        'coschedule_admission_requests_total{allowed="false",code="400",mode="none"} 1.0' in metrics
    )
    assert "coschedule_admission_duration_seconds_count 2.0" in metrics
    assert "coschedule_admission_patch_ops_count 1.0" in metrics
    assert "coschedule_config_reload_errors_total 0.0" in metrics
    assert "coschedule_config_last_reload_successful 1.0" in metrics
    # /metrics is on the plain port only.
    with server.client() as client:
        assert client.get("/metrics").status_code == 404


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated")
def test_tls_below_1_2_is_refused(server: RunningServer) -> None:
    context = ssl.create_default_context(cafile=server.ca)
    context.maximum_version = ssl.TLSVersion.TLSv1_1
    context.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw,
        pytest.raises(ssl.SSLError),
    ):
        context.wrap_socket(raw, server_hostname="localhost").close()


def test_certificate_rotation_without_restart_or_failed_request(server: RunningServer) -> None:
    old_ca = server.ca
    with server.client() as kept_alive:
        assert kept_alive.get("/livez").status_code == 200
        rotated = certs.generate(["localhost", "127.0.0.1"])
        new_ca = server.cert_dir / "new-ca.crt"
        new_ca.write_bytes(rotated.ca_pem)
        (server.cert_dir / "tls.key").write_bytes(rotated.key_pem)  # a moment of mismatch
        (server.cert_dir / "tls.crt").write_bytes(rotated.cert_pem)

        def new_cert_served() -> bool:
            try:
                with httpx.Client(verify=trust(new_ca)) as fresh:
                    return fresh.get(server.url + "/livez").status_code == 200
            except httpx.ConnectError:
                return False

        wait_until(new_cert_served, "the rotated certificate served")
        # The connection opened before the rotation still works.
        assert kept_alive.get("/livez").status_code == 200
        assert post(kept_alive, admission_review(load_pod("job-pod"))).status_code == 200
    with pytest.raises(httpx.ConnectError), httpx.Client(verify=trust(old_ca)) as stale:
        stale.get(server.url + "/livez")
    assert server.process.poll() is None
    metrics = httpx.get(server.health_url + "/metrics").text
    assert 'coschedule_certificate_reloads_total{result="success"} 1.0' in metrics


def test_config_hot_reload_and_refused_reload(server: RunningServer) -> None:
    review = admission_review(load_pod("tekton-taskrun"))
    (server.config_dir / "coschedule").write_text("pipelineruns")

    def placeholder() -> str:
        with server.client() as client:
            response = post(client, review).json()["response"]
        pod = patched_pod(review, response)
        label: str = pod["metadata"]["labels"]["coschedule.dev/placeholder"]
        return label

    run = run_placeholder("ci", "pr-7f3k2")
    wait_until(lambda: placeholder() == run, "mode pipelineruns reloaded")

    # An invalid combination: the last good config stays, and the error is reported.
    (server.config_dir / "disable-affinity-assistant").write_text("false")
    wait_until(
        lambda: (
            "coschedule_config_reload_errors_total 1.0"
            in httpx.get(server.health_url + "/metrics").text
        ),
        "the refused reload counted",
    )
    assert placeholder() == run
    assert "coschedule_config_last_reload_successful 0.0" in metrics_text(server)
    ready = httpx.get(server.health_url + "/readyz")
    assert ready.status_code == 200  # the last good config still serves
    detail = ready.json()["checks"]["config"]["detail"]
    assert "disable-affinity-assistant" in detail
    assert "coschedule" in detail
    assert "refused" in server.log()


def test_invalid_config_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="disable-affinity-assistant"):
        start_server(
            tmp_path, config={"coschedule": "pipelineruns", "disable-affinity-assistant": "false"}
        )


def test_environment_configures_the_server(tmp_path: Path) -> None:
    running = start_server(
        tmp_path,
        env={
            "COSCHEDULE_COSCHEDULE": "isolate-pipelinerun",
            "COSCHEDULE_TOPOLOGY_KEY": "topology.kubernetes.io/zone",
        },
    )
    try:
        review = admission_review(load_pod("tekton-taskrun-no-workspace"))
        with running.client() as client:
            response = post(client, review).json()["response"]
        pod = patched_pod(review, response)
        term = pod["spec"]["affinity"]["podAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ][0]
        assert term["topologyKey"] == "topology.kubernetes.io/zone"
        assert pod["metadata"]["annotations"]["coschedule.dev/mode"] == "isolate-pipelinerun"
    finally:
        stop_server(running)


# ---- scheduling defaults and hardening policy (issue 7) -------------------------------------

ARM64_DEFAULTS = """
- namespaces: [ci]
  nodeSelector: {kubernetes.io/arch: arm64}
  tolerations: [{key: kubernetes.io/arch, value: arm64, effect: NoSchedule}]
"""


def test_policy_warnings_and_denials_over_https(tmp_path: Path) -> None:
    running = start_server(
        tmp_path,
        config={"scheduling-defaults": ARM64_DEFAULTS, "policy-control-plane": "deny"},
    )
    try:
        with running.client() as client:
            # A plain Tekton pod: the arm64 default is merged, no policy warning at all.
            plain = admission_review(load_pod("tekton-taskrun"))
            response = post(client, plain).json()["response"]
            assert response["allowed"] is True
            assert "warnings" not in response
            pod = patched_pod(plain, response)
            assert pod["spec"]["nodeSelector"] == {"kubernetes.io/arch": "arm64"}
            assert pod["spec"]["tolerations"][-1]["key"] == "kubernetes.io/arch"

            # warn (the default): admitted, with kubectl's warning.
            tolerant = load_pod("tekton-taskrun")
            tolerant["spec"]["tolerations"].append(
                {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}
            )
            review = admission_review(tolerant)
            response = post(client, review).json()["response"]
            assert response["allowed"] is True
            assert response["warnings"] == [
                "coschedule: policy reserved-tolerations: spec.tolerations[2] tolerates "
                "node.kubernetes.io/unschedulable: remove it"
            ]
            assert patched_pod(review, response)["metadata"]["labels"]["coschedule.dev/placeholder"]

            # deny (configured): refused with the rule, the field and the fix.
            control = load_pod("argo-workflow-pod")
            control["spec"]["nodeSelector"] = {"node-role.kubernetes.io/control-plane": ""}
            review = admission_review(control)
            response = post(client, review).json()["response"]
            assert response["uid"] == review["request"]["uid"]
            assert response["allowed"] is False
            assert response["status"]["code"] == 403
            message = response["status"]["message"]
            assert "policy-control-plane" in message
            assert "spec.nodeSelector[node-role.kubernetes.io/control-plane]" in message
            assert "Fix:" in message
            assert "patch" not in response

            # deny by default: the zone-wide hard anti-affinity.
            zone = load_pod("deployment-pod")
            zone["spec"]["affinity"] = {
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "labelSelector": {"matchLabels": {"app": "inventory"}},
                            "namespaceSelector": {},
                            "topologyKey": "topology.kubernetes.io/zone",
                        }
                    ]
                }
            }
            response = post(client, admission_review(zone)).json()["response"]
            assert response["allowed"] is False
            assert "policy-hard-anti-affinity-topology" in response["status"]["message"]

            # deny by default: a Tekton pod whose podTemplate's nodeSelector and required
            # node affinity leave no node (the fixture asks kubernetes.io/arch In [amd64]).
            nowhere = load_pod("tekton-taskrun-user-affinity")
            nowhere["spec"]["nodeSelector"]["kubernetes.io/arch"] = "arm64"
            response = post(client, admission_review(nowhere)).json()["response"]
            assert response["allowed"] is False
            message = response["status"]["message"]
            assert "rule policy-unsatisfiable-placement" in message
            assert (
                "term 0 asks kubernetes.io/arch In [amd64] and "
                "nodeSelector kubernetes.io/arch=arm64"
            ) in message
        metrics = httpx.get(running.health_url + "/metrics").text
        assert 'allowed="false",code="403"' in metrics
    finally:
        stop_server(running)


def test_policy_from_the_environment_and_bad_defaults_refuse_start(tmp_path: Path) -> None:
    running = start_server(tmp_path / "env", env={"COSCHEDULE_POLICY_RESERVED_TOLERATIONS": "deny"})
    try:
        pod = load_pod("job-pod")
        pod["spec"]["tolerations"].append({"operator": "Exists"})
        with running.client() as client:
            response = post(client, admission_review(pod)).json()["response"]
        assert response["allowed"] is False
        assert "policy-reserved-tolerations" in response["status"]["message"]
        assert "spec.tolerations[2]" in response["status"]["message"]
    finally:
        stop_server(running)
    (tmp_path / "bad").mkdir()
    with pytest.raises(RuntimeError, match="scheduling-defaults"):
        start_server(
            tmp_path / "bad",
            config={"scheduling-defaults": "- tolerations: [{key: a, effect: Sometimes}]"},
        )


def metrics_text(server: RunningServer) -> str:
    return httpx.get(server.health_url + "/metrics").text


def test_unknown_paths_and_methods_answer_the_error_shape(server: RunningServer) -> None:
    with server.client() as client:
        answers = [client.get("/nope"), client.post("/readyz"), client.get("/metrics")]
    answers += [httpx.get(server.health_url + "/nope"), httpx.post(server.health_url + "/livez")]
    answers.append(httpx.delete(server.health_url + "/metrics"))
    assert [a.status_code for a in answers] == [404, 405, 404, 404, 405, 405]
    for answer in answers:
        assert answer.headers["content-type"] == "application/json"
        body = answer.json()
        assert set(body) == {"error"}, body
    assert answers[0].json()["error"] == "/nope: not found"
    assert answers[1].json()["error"] == "/readyz: method POST not allowed"
    assert answers[4].headers["allow"] == "GET"


@pytest.mark.skipif(
    Path("/etc/coschedule/config").is_dir(), reason="this machine has the default config folder"
)
def test_missing_default_config_dir_is_said_in_the_log_and_readyz(tmp_path: Path) -> None:
    running = start_server(tmp_path, config_dir_flag=False)
    try:
        ready = httpx.get(running.health_url + "/readyz")
        assert ready.status_code == 200  # defaults are a working config: make run must work
        detail = ready.json()["checks"]["config"]["detail"]
        assert "/etc/coschedule/config not found" in detail
        assert "built-in defaults" in detail
        assert "/etc/coschedule/config not found" in running.log()
    finally:
        stop_server(running)


def test_a_certificate_near_expiry_is_said_in_readyz_and_the_log(server: RunningServer) -> None:
    """A renewal that did not happen is seen before the API server refuses the webhook: the
    pod stays ready (the certificate still works), ``/readyz`` says when it expires, and
    the log says it once."""
    now = dt.datetime.now(dt.UTC)
    ca = certs.generate_ca(dt.timedelta(days=30), now=now - dt.timedelta(days=10))
    old = certs.issue_serving(
        ca, ["localhost", "127.0.0.1"], dt.timedelta(days=12), now=now - dt.timedelta(days=10)
    )
    (server.cert_dir / "tls.key").write_bytes(old.key_pem)
    (server.cert_dir / "tls.crt").write_bytes(old.cert_pem)

    def detail() -> str:
        ready = httpx.get(server.health_url + "/readyz")
        assert ready.status_code == 200
        text: str = ready.json()["checks"]["certificate"].get("detail", "")
        return text

    wait_until(lambda: "has not been renewed" in detail(), "the expiry warning in /readyz")
    assert "(1d 23h left)" in detail() or "(2d 0h left)" in detail()
    wait_until(
        lambda: server.log().count("has not been renewed") == 1,
        "one expiry warning in the log",
        describe=server.log,
    )
