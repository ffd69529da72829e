"""Admission logging (one line per denied, warned or bad request at INFO, allowed at DEBUG),
the JSON and text formats, the metrics kept as plain counts, and the joined answer bytes."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from bench.payloads import tekton_pod
from coschedule import certs, logs
from coschedule.cli.main import build_parser
from coschedule.config.store import SettingsStore
from coschedule.server.admission_metrics import (
    LATENCY_BUCKETS,
    PATCH_OPS_BUCKETS,
    AdmissionMetrics,
)
from coschedule.server.pod_endpoint import PodEndpoint
from coschedule.server.webhook_metrics import WebhookMetrics
from coschedule.wire.review import encode_allowed, encode_response
from tests.conftest import PATIENCE_SECONDS, free_port, wait_until
from tests.fixtures import admission_review

FIELDS = ("uid", "namespace", "pod", "run", "mode", "placeholder", "rule", "latency_ms")


def handle(pod: dict[str, Any], env: dict[str, str] | None = None) -> tuple[int, bytes]:
    store = SettingsStore(None, env or {"COSCHEDULE_COSCHEDULE": "pipelineruns"})
    handler = PodEndpoint(store, WebhookMetrics())
    return handler.handle(orjson.dumps(admission_review(pod, uid="uid-1")))


def admission_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "coschedule.admission"]


def denied_pod() -> dict[str, Any]:
    pod = tekton_pod()
    pod["metadata"]["labels"]["coschedule.dev/mode"] = "sometimes"
    return pod


def test_a_denial_logs_one_info_line_with_every_field(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="coschedule.admission")
    status, body = handle(denied_pod())
    assert status == 200
    assert orjson.loads(body)["response"]["allowed"] is False
    (record,) = admission_records(caplog)
    assert record.levelno == logging.INFO
    assert record.getMessage() == "admission denied"
    fields = {name: getattr(record, name) for name in FIELDS}
    pod = tekton_pod()
    assert fields["uid"] == "uid-1"
    assert fields["namespace"] == pod["metadata"]["namespace"]
    assert fields["pod"] == pod["metadata"]["name"]
    assert fields["run"] == pod["metadata"]["labels"]["tekton.dev/pipelineRun"]
    assert fields["rule"] == "invalid-mode"
    assert fields["mode"] == "none"  # no mode could be chosen
    assert isinstance(fields["latency_ms"], float)
    assert fields["latency_ms"] >= 0


def test_a_placed_denial_names_mode_and_placeholder(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="coschedule.admission")
    pod = tekton_pod()
    pod["spec"]["nodeSelector"] = {"node-role.kubernetes.io/control-plane": ""}
    handle(
        pod, {"COSCHEDULE_COSCHEDULE": "pipelineruns", "COSCHEDULE_POLICY_CONTROL_PLANE": "deny"}
    )
    (record,) = admission_records(caplog)
    assert record.getMessage() == "admission denied"
    assert record.mode == "pipelineruns"  # type: ignore[attr-defined]
    assert record.placeholder.startswith("affinity-assistant-")  # type: ignore[attr-defined]
    assert "control-plane" in record.rule  # type: ignore[attr-defined]


def test_an_allowed_admission_logs_nothing_at_info_and_one_line_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="coschedule.admission")
    status, _ = handle(tekton_pod())
    assert status == 200
    assert admission_records(caplog) == []

    caplog.set_level(logging.DEBUG, logger="coschedule.admission")
    handle(tekton_pod())
    (record,) = admission_records(caplog)
    assert record.levelno == logging.DEBUG
    assert record.getMessage() == "admission allowed"
    assert record.placeholder.startswith("affinity-assistant-")  # type: ignore[attr-defined]
    assert record.rule is None  # type: ignore[attr-defined]
    assert record.ops > 0  # type: ignore[attr-defined]


def test_a_warning_logs_at_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="coschedule.admission")
    pod = tekton_pod()
    pod["spec"]["tolerations"].append({"operator": "Exists"})  # tolerates every taint
    _, body = handle(pod)
    assert orjson.loads(body)["response"]["warnings"]
    (record,) = admission_records(caplog)
    assert record.getMessage() == "admission allowed with warnings"
    assert record.warnings  # type: ignore[attr-defined]


def test_a_bad_request_logs_at_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="coschedule.admission")
    handler = PodEndpoint(SettingsStore(None, {}), WebhookMetrics())
    status, _ = handler.handle(b"[]")
    assert status == 400
    (record,) = admission_records(caplog)
    assert record.rule == "bad-request"  # type: ignore[attr-defined]
    assert "JSON object" in record.error  # type: ignore[attr-defined]


def _record(**extra: Any) -> logging.LogRecord:
    record = logging.makeLogRecord(
        {"name": "coschedule.admission", "levelno": 20, "levelname": "INFO", "msg": "denied"}
    )
    record.__dict__.update(extra)
    return record


def test_json_and_text_formats() -> None:
    record = _record(uid="u1", pod="p 1", run=None, rule="invalid-mode", latency_ms=0.25)
    doc = json.loads(logs.JsonFormatter().format(record))
    assert doc["level"] == "info"
    assert doc["msg"] == "denied"
    assert (doc["uid"], doc["pod"], doc["run"], doc["latency_ms"]) == ("u1", "p 1", None, 0.25)
    text = logs.TextFormatter().format(record)
    assert " INFO coschedule.admission: denied " in text
    assert 'uid=u1 pod="p 1" rule=invalid-mode latency_ms=0.25' in text
    assert "run=" not in text  # None is left out
    assert "\n" not in logs.TextFormatter().format(_record(msg="x", why="a\nb"))


@pytest.mark.parametrize("command", ["serve", "reconcile"])
def test_log_format_flag(command: str) -> None:
    parser = build_parser()
    assert parser.parse_args([command]).log_format == "text"
    assert parser.parse_args([command, "--log-format", "json"]).log_format == "json"
    with pytest.raises(SystemExit):
        parser.parse_args([command, "--log-format", "xml"])


@pytest.mark.parametrize(("fmt", "first"), [("json", "{"), ("text", "20")])
def test_serve_logs_in_the_chosen_format(fmt: str, first: str, tmp_path: Any) -> None:
    """A real `coschedule serve` process: its first log line is in the chosen format."""
    certs.write_bundle(certs.generate(["localhost"]), tmp_path)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "coschedule.cli.main",
            "serve",
            "--no-cluster",
            "--port",
            str(free_port()),
            "--health-port",
            str(free_port()),
            "--cert-dir",
            str(tmp_path),
            "--log-format",
            fmt,
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
    finally:
        process.terminate()
        process.wait(timeout=PATIENCE_SECONDS)
    assert line.startswith(first), line
    if fmt == "json":
        assert "level" in json.loads(line)


def test_serve_logs_each_lifecycle_line_once(tmp_path: Any) -> None:
    """A real `coschedule serve` process from start to SIGTERM: two listeners, yet every line
    once (uvicorn's per-listener lifecycle lines were each printed twice)."""
    certs.write_bundle(certs.generate(["localhost"]), tmp_path)
    health = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "coschedule.cli.main",
            "serve",
            "--no-cluster",
            "--port",
            str(free_port()),
            "--health-port",
            str(health),
            "--cert-dir",
            str(tmp_path),
            "--log-format",
            "json",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )

    def live() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{health}/livez", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(live, "serve live", interval=0.025)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=PATIENCE_SECONDS)
    finally:
        if process.returncode is None:
            process.kill()
            process.wait()
    entries = [json.loads(line) for line in stderr.splitlines()]
    messages = [(entry["logger"], entry["msg"]) for entry in entries]
    assert ("coschedule.serve", "serving") in messages
    # Built, then frozen before serving: no full collection walks the startup heap again.
    [serving] = [e for e in entries if e["msg"] == "serving"]
    assert serving["frozen_objects"] > 10_000
    assert messages[-2:] == [("coschedule.serve", "shutting down"), ("coschedule.serve", "stopped")]
    assert len(messages) == len(set(messages)), messages
    assert not [m for m in messages if m[0].startswith("uvicorn")], messages


@pytest.mark.parametrize("level", ["info", "warning", "debug"])
def test_http_client_and_server_chatter_is_quiet_unless_debug(level: str) -> None:
    """httpx logs one INFO line per API request and uvicorn one per listener's lifecycle
    step: hidden at info, their warnings still shown, everything at debug."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        logs.setup(level, "json")
        for name in logs.QUIET_LOGGERS:
            logger = logging.getLogger(name)
            assert logger.isEnabledFor(logging.INFO) == (level == "debug")
            assert logger.isEnabledFor(logging.WARNING)
        assert logging.getLogger("coschedule.x").isEnabledFor(logging.INFO) == (level != "warning")
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
        for name in logs.QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.NOTSET)


def test_metrics_expose_what_prometheus_client_would() -> None:
    """The plain counts render as a Counter and two Histograms fed the same admissions."""
    ours = CollectorRegistry()
    admissions = AdmissionMetrics(ours)
    theirs = CollectorRegistry()
    requests = Counter(
        "coschedule_admission_requests",
        "Admission requests answered, by effective mode, allowed and code: the review's "
        "code for an answered review (200 allowed, 403 denied, both over HTTP 200), else "
        "the HTTP status of the refused request.",
        ["mode", "allowed", "code"],
        registry=theirs,
    )
    duration = Histogram(
        "coschedule_admission_duration_seconds",
        "Time to decide and encode one admission, from the whole body read to the answer.",
        buckets=LATENCY_BUCKETS,
        registry=theirs,
    )
    ops = Histogram(
        "coschedule_admission_patch_ops",
        "JSONPatch operations per admitted pod.",
        buckets=PATCH_OPS_BUCKETS,
        registry=theirs,
    )
    seen = [
        (("pipelineruns", "true", "200"), 0.00004, 7),
        (("pipelineruns", "true", "200"), 0.0001, 0),
        (("none", "false", "403"), 0.0003, None),
        (("none", "false", "400"), None, None),
        (("workspaces", "true", "200"), 2.0, 25),
    ]
    for key, seconds, count in seen:
        admissions.record(key, seconds, count)
        requests.labels(*key).inc()
        if seconds is not None:
            duration.observe(seconds)
        if count is not None:
            ops.observe(count)

    def lines(registry: CollectorRegistry) -> list[str]:
        return [
            line
            for line in generate_latest(registry).decode().splitlines()
            if "_created" not in line
        ]

    assert lines(ours) == lines(theirs)


@pytest.mark.parametrize("uid", ["u1", 'quo"te', "ünï"])
@pytest.mark.parametrize("warnings", [[], ["careful"]])
def test_joined_answer_is_the_encoded_one(uid: str, warnings: list[str]) -> None:
    patch = [{"op": "add", "path": "/metadata/labels/a~1b", "value": {"x": "é"}}]
    expected = encode_response(uid, allowed=True, patch=patch, warnings=warnings)
    assert encode_allowed(uid, patch, warnings) == expected
    assert encode_allowed(uid, [], warnings) == encode_response(
        uid, allowed=True, patch=[], warnings=warnings
    )
