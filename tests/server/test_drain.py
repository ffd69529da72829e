"""``serve --shutdown-delay``: on SIGTERM a real ``coschedule serve`` process goes on admitting
over the connections it has, says it is not ready and closes each connection after its answer,
then stops when the delay is over. SIGINT or a second SIGTERM stop it at once."""

from __future__ import annotations

import signal
import ssl
import subprocess
import time
from pathlib import Path

import httpx
import orjson
import pytest

from coschedule import certs
from coschedule.server.drain import Drain
from tests.conftest import PATIENCE_SECONDS, RunningServer, launch_server, wait_until
from tests.fixtures import admission_review, load_pod


def _ready_status(server: RunningServer) -> int | None:
    try:
        return httpx.get(f"{server.health_url}/readyz", timeout=5).status_code
    except httpx.TransportError:
        return None


def _start(tmp_path: Path, delay: str) -> RunningServer:
    server = launch_server(tmp_path, extra_args=["--shutdown-delay", delay])
    wait_until(lambda: _ready_status(server) == 200, "serve ready", interval=0.05)
    return server


def _exit_code(server: RunningServer, timeout: float) -> int:
    try:
        return server.process.wait(timeout)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()
        raise


def _review() -> bytes:
    return orjson.dumps(admission_review(load_pod("tekton-taskrun")))


def test_sigterm_drains_admitting_not_ready_closing_connections(tmp_path: Path) -> None:
    delay = 4.0
    server = _start(tmp_path, f"{delay:g}s")
    try:
        ca = ssl.create_default_context(cafile=server.cert_dir / certs.CA_FILE)
        with httpx.Client(base_url=server.url, verify=ca, timeout=10) as http:
            before = http.post("/mutate", content=_review(),
                               headers={"Content-Type": "application/json"})  # fmt: skip
            assert before.status_code == 200
            assert before.headers.get("connection") != "close"
            term = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            wait_until(lambda: _ready_status(server) == 503, "readyz 503", interval=0.05)
            body = httpx.get(f"{server.health_url}/readyz", timeout=5).json()
            assert "shutting down" in body["checks"]["shutdown"]["detail"], body
            # Still admitting, over the kept-alive connection, and closing it after the answer.
            during = http.post("/mutate", content=_review(),
                               headers={"Content-Type": "application/json"})  # fmt: skip
            assert during.status_code == 200, during.text
            assert during.json()["response"]["allowed"] is True
            assert during.headers.get("connection") == "close"
            assert server.process.poll() is None
        assert _exit_code(server, PATIENCE_SECONDS) == 0
        # It did not stop before the delay was over.
        assert time.monotonic() - term >= delay - 0.5
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()
    log = server.log_path.read_text()
    assert log.index("draining") < log.index("shutting down") < log.index("stopped"), log


@pytest.mark.parametrize("second", [None, signal.SIGTERM], ids=["sigint", "sigterm-twice"])
def test_sigint_or_a_second_sigterm_stops_at_once(
    tmp_path: Path, second: signal.Signals | None
) -> None:
    # A delay far past the wait below: only an immediate stop ends the process in time.
    server = _start(tmp_path, "10m")
    try:
        if second is None:
            server.process.send_signal(signal.SIGINT)
        else:
            server.process.send_signal(signal.SIGTERM)
            wait_until(lambda: _ready_status(server) == 503, "draining", interval=0.05)
            server.process.send_signal(second)
        assert _exit_code(server, 60) == 0
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()
    assert ("draining" in server.log_path.read_text()) is (second is not None)


def test_a_drain_without_a_delay_never_begins() -> None:
    drain = Drain(delay=0.0)
    assert drain.begin() is False
    assert drain.readiness() == (True, None)


def test_a_drain_begins_once_and_says_how_long_is_left() -> None:
    drain = Drain(delay=30.0)
    assert drain.begin() is True
    assert drain.begin() is False  # the second SIGTERM: stop now
    ready, detail = drain.readiness()
    assert ready is False
    assert detail is not None
    assert "shutting down: serving 30s more" in detail
