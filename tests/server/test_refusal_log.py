"""Every refused request is logged, on both endpoints, and read here as the real process
writes it: 405, a wrong Content-Type, 413 (declared and sent), a bad review and a malformed
object, each one JSON line naming the endpoint, the status and why. Fields are capped, so a
100,000-character name cannot make a 100 KB line. uvicorn's lifecycle lines show once."""

from __future__ import annotations

import io
import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from coschedule import logs
from coschedule.server.admission import MAX_BODY_BYTES
from tests.concurrency.runs import pipeline_run
from tests.conftest import RunningServer, start_server, stop_server, trust
from tests.fixtures import admission_review, load_pod

ENDPOINTS = ["/mutate", "/mutate-runs"]
HUGE = 100_000


def pod_review(**request: Any) -> dict[str, Any]:
    review = admission_review(load_pod("tekton-taskrun"), uid="pod-uid")
    review["request"].update(request)
    return review


def run_review(**request: Any) -> dict[str, Any]:
    review = admission_review(pipeline_run("r1"), kind="PipelineRun", uid="run-uid")
    review["request"].update(request)
    return review


REVIEWS = {"/mutate": pod_review, "/mutate-runs": run_review}


def raw(server: RunningServer, request: bytes) -> int:
    """One request as bytes over TLS (a declared length no client would send for a small
    body); the status of the answer."""
    context = trust(server.ca)
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as plain,
        context.wrap_socket(plain, server_hostname="localhost") as tls,
    ):
        tls.sendall(request)
        head = b""
        while b"\r\n" not in head:
            chunk = tls.recv(4096)
            if not chunk:
                break
            head += chunk
    return int(head.split(b" ", 2)[1])


def lines(server: RunningServer) -> list[dict[str, Any]]:
    return [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]


def refusals(server: RunningServer) -> list[dict[str, Any]]:
    return [
        line
        for line in lines(server)
        if line["logger"] == "coschedule.admission" and line["msg"].startswith("admission refused")
    ]


@pytest.fixture
def json_server(tmp_path: Path) -> Iterator[RunningServer]:
    running = start_server(tmp_path, extra_args=["--log-format", "json"])
    yield running
    stop_server(running)


@pytest.mark.parametrize("path", ENDPOINTS)
def test_every_refused_request_is_one_line_in_the_real_log(
    json_server: RunningServer, path: str
) -> None:
    server = json_server
    review = orjson.dumps(REVIEWS[path]())
    with server.client() as client:
        assert client.get(path).status_code == 405
        wrong = client.post(path, content=review, headers={"Content-Type": "text/plain"})
        assert wrong.status_code == 400
        broken = client.post(
            path, content=b"{not json", headers={"Content-Type": "application/json"}
        )
        assert broken.status_code == 400
        # Sent without a length (chunked), found too large while it is read.
        sent = client.post(
            path,
            content=iter([b" " * (1024 * 1024)] * 8),
            headers={"Content-Type": "application/json"},
        )
        assert sent.status_code == 413
    declared = (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {MAX_BODY_BYTES + 1}\r\nConnection: close\r\n\r\n"
    ).encode()
    assert raw(server, declared) == 413

    found = refusals(server)
    assert [(line["status"], line["rule"]) for line in found] == [
        (405, "method-not-allowed"),
        (400, "wrong-content-type"),
        (400, "bad-request"),
        (413, "body-too-large"),
        (413, "body-too-large"),
    ]
    assert {line["endpoint"] for line in found} == {path}
    assert all(line["level"] == "info" for line in found)
    assert "text/plain" in found[1]["error"]
    assert found[3]["error"] == f"more than {MAX_BODY_BYTES} bytes sent"
    assert found[4]["error"] == f"declared {MAX_BODY_BYTES + 1} bytes"
    # Refused at the door: no review was read, so the peer is named instead.
    for line in (found[0], found[1], found[3], found[4]):
        assert line["client"].startswith("127.0.0.1:")
        assert line["uid"] is None


def test_the_peer_is_named_not_what_a_forwarded_header_claims(json_server: RunningServer) -> None:
    # kube-apiserver calls the webhook directly: no proxy's X-Forwarded-For is trusted, even
    # from loopback (uvicorn's default would take it from 127.0.0.1).
    with json_server.client() as client:
        answer = client.get(
            "/mutate", headers={"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "http"}
        )
        assert answer.status_code == 405
    (line,) = refusals(json_server)
    assert line["client"].startswith("127.0.0.1:")


@pytest.mark.parametrize("path", ENDPOINTS)
def test_a_100k_name_is_cut_in_the_log_line(json_server: RunningServer, path: str) -> None:
    server = json_server
    name = "n" * HUGE
    if path == "/mutate":
        pod = load_pod("tekton-taskrun")
        pod["metadata"]["name"] = name
        pod["metadata"]["labels"]["k" * HUGE] = 5  # a label value must be a string
        review = admission_review(pod, uid="u" * HUGE)
    else:
        review = run_review(uid="u" * HUGE, object=[name])  # a run must be an object
    with server.client() as client:
        answer = client.post(
            path, content=orjson.dumps(review), headers={"Content-Type": "application/json"}
        )
    assert answer.status_code == 400

    (line,) = refusals(server)
    text = next(t for t in server.log().splitlines() if t.startswith("{") and '"status":400' in t)
    assert len(text) < 4 * logs.FIELD_LIMIT, len(text)
    assert line["uid"] == "u" * logs.FIELD_LIMIT + f"...[+{HUGE - logs.FIELD_LIMIT} chars]"
    assert line["endpoint"] == path
    assert line["rule"] == "bad-request"
    if path == "/mutate":
        assert line["pod"].startswith("n" * logs.FIELD_LIMIT + "...[+")
        assert line["error"].endswith(" chars]")  # the label key it names, cut too
    else:
        assert "must be a PipelineRun object" in line["error"]


def test_a_run_refused_for_want_of_controls_is_logged() -> None:
    """503: the ConcurrencyControl cache has not synced; the run is refused and logged."""
    from coschedule.server.run_endpoint import RunEndpoint
    from coschedule.server.webhook_metrics import WebhookMetrics

    class NotSynced:
        synced = False
        absent = False

        def controls(self, namespace: str) -> list[Any]:
            raise AssertionError("not read before the cache synced")

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.TextFormatter())
    logger = logging.getLogger("coschedule.admission")
    saved = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        review = admission_review(pipeline_run("deploy-1"), kind="PipelineRun", uid="u1")
        status, body = RunEndpoint(WebhookMetrics(), NotSynced()).handle(orjson.dumps(review))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)
    assert status == 200
    assert orjson.loads(body)["response"]["status"]["code"] == 503
    (text,) = stream.getvalue().splitlines()
    assert "admission refused: concurrency-cache-not-synced" in text
    assert "endpoint=/mutate-runs status=503 uid=u1" in text
    assert "run=deploy-1" in text


def test_the_cap_marks_the_cut() -> None:
    assert logs.cap("abc", 5) == "abc"
    assert logs.cap("abcdefgh", 5) == "abcde...[+3 chars]"
    record = logging.makeLogRecord({"name": "x", "levelno": 20, "levelname": "INFO", "msg": "m"})
    record.__dict__.update(
        name_field="x" * 10_000, warnings=["w" * 300, "v" * 300, "later"], count=3
    )
    doc = json.loads(logs.JsonFormatter().format(record))
    assert doc["name_field"] == "x" * logs.FIELD_LIMIT + f"...[+{10_000 - logs.FIELD_LIMIT} chars]"
    assert doc["warnings"] == [
        "w" * 300,
        "v" * (logs.FIELD_LIMIT - 300) + f"...[+{600 - logs.FIELD_LIMIT} chars]",
        "...[+1 items]",
    ]
    assert doc["count"] == 3
    text = logs.TextFormatter().format(record)
    assert len(text) < 3 * logs.FIELD_LIMIT


def test_uvicorn_lifecycle_lines_once_at_debug(tmp_path: Path) -> None:
    """Two listeners, each with uvicorn's lifecycle lines: at level debug, where they
    show, each shows once."""
    server = start_server(tmp_path, extra_args=["--log-format", "json", "--log-level", "debug"])
    stop_server(server)
    uvicorn = [
        line["msg"]
        for line in lines(server)
        if line["logger"] == "uvicorn.error" and line["level"] == "info"
    ]
    assert any(m.startswith("Started server process") for m in uvicorn), uvicorn
    assert len(uvicorn) == len(set(uvicorn)), uvicorn
    assert sum(m.startswith("Uvicorn running on") for m in uvicorn) == 2  # one per listener
