"""An API server that does not answer: said once, clearly; readyz says why (issue 14.6)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from coschedule.kube.reachability import ApiReachability
from tests.conftest import (
    PATIENCE_SECONDS,
    ROOT,
    free_port,
    reconciler_command,
    wait_until,
    write_kubeconfig,
)


def test_reachability_says_it_once_then_reminds_then_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    tracker = ApiReachability("https://10.0.0.1:6443", remind_every=60, clock=lambda: now[0])
    refused = httpx.ConnectError("[Errno 111] Connection refused")
    caplog.set_level(logging.DEBUG, logger="coschedule.apiserver")
    for _ in range(50):  # 50 failures in 59 s: one line
        tracker.failed(refused)
        now[0] += 59 / 50
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [
        "waiting for the API server at https://10.0.0.1:6443: [Errno 111] Connection refused; "
        "retrying with backoff (a reminder every 60 s)"
    ]
    assert tracker.waiting_detail() == (
        "waiting for the API server at https://10.0.0.1:6443 for 59 s: "
        "[Errno 111] Connection refused"
    )
    now[0] = 161.0
    tracker.failed(refused)
    tracker.failed(refused)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2
    assert warnings[1].startswith("still waiting for the API server at https://10.0.0.1:6443")
    assert "after 61 s (51 attempts)" in warnings[1]
    tracker.answered()
    assert tracker.waiting_detail() is None
    assert caplog.records[-1].getMessage() == (
        "the API server at https://10.0.0.1:6443 answers again after 61 s"
    )
    tracker.answered()  # answering while not waiting says nothing
    assert caplog.records[-1].levelno == logging.INFO
    assert len([r for r in caplog.records if "answers again" in r.getMessage()]) == 1


def test_reconcile_against_a_closed_port(tmp_path: Path) -> None:
    closed = free_port()  # bound and released: nothing listens there
    health = free_port()
    server = f"https://127.0.0.1:{closed}"
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server, "coschedule-system")
    (tmp_path / "config").mkdir()
    argv, env = reconciler_command(kubeconfig, tmp_path / "config", health)
    log_path = tmp_path / "reconcile.log"
    process = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log_path.open("wb"),
    )
    try:
        detail = ""

        def says_waiting() -> bool:
            nonlocal detail
            try:
                answer = httpx.get(f"http://127.0.0.1:{health}/readyz", timeout=5)
            except httpx.TransportError:
                return False  # not listening yet
            assert answer.status_code == 503
            detail = answer.json()["checks"]["caches"]["detail"]
            return "waiting for the API server" in detail

        wait_until(
            says_waiting, "readyz says it waits for the API server", describe=log_path.read_text
        )
        assert detail.startswith("caches not synced: ")
        assert f"waiting for the API server at {server} for " in detail
        assert detail.endswith(": connection refused")
        # Informers back off and retry, the elector retries every 2 s: many failures ...
        time.sleep(5)
        assert httpx.get(f"http://127.0.0.1:{health}/livez", timeout=5).status_code == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=PATIENCE_SECONDS) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    warnings = [line for line in lines if line["level"] in ("warning", "error")]
    waiting = [w for w in warnings if "waiting for the API server" in w["msg"]]
    # ... and one line that says what the process waits for; no warning per retry.
    assert len(waiting) == 1, warnings
    assert waiting[0]["msg"].startswith(f"waiting for the API server at {server}: ")
    assert waiting[0]["msg"].endswith(
        ": connection refused; retrying with backoff (a reminder every 60 s)"
    )
    others = [w["msg"] for w in warnings if w is not waiting[0]]
    assert all(m == "could not release the Lease" for m in others), others


def test_serve_against_a_closed_port_says_why_it_is_not_ready(tmp_path: Path) -> None:
    from coschedule import certs

    closed, port, health = free_port(), free_port(), free_port()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{closed}")
    certs.write_bundle(certs.generate(["127.0.0.1"]), tmp_path / "tls")
    (tmp_path / "config").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COSCHEDULE_", "KUBE"))}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "coschedule.cli.main",
            "serve",
            "--host=127.0.0.1",
            f"--port={port}",
            f"--health-port={health}",
            f"--cert-dir={tmp_path / 'tls'}",
            f"--config-dir={tmp_path / 'config'}",
            f"--kubeconfig={kubeconfig}",
        ],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        detail = ""

        def says_waiting() -> bool:
            nonlocal detail
            try:
                answer = httpx.get(f"http://127.0.0.1:{health}/readyz", timeout=5)
            except httpx.TransportError:
                return False  # not listening yet
            assert answer.status_code == 503
            detail = answer.json()["checks"]["namespace-cache"]["detail"]
            return "waiting for the API server" in detail

        wait_until(says_waiting, "readyz says it waits for the API server")
        assert detail.startswith("namespace cache not synced yet; waiting for the API server")
        assert detail.endswith(": connection refused")
    finally:
        process.terminate()
        process.wait(timeout=PATIENCE_SECONDS)
