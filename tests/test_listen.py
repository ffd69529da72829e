"""Listening on IPv6 and IPv4 at once (coschedule.listen), with real sockets on 127.0.0.1 and
::1: the webhook's HTTPS and health ports, as ``coschedule serve`` opens them by default."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from coschedule import certs
from coschedule.cli.main import build_parser
from coschedule.listen import EVERY_ADDRESS, ListenError, describe, listen_socket
from tests.conftest import RunningServer, free_port, start_server


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


HAS_IPV6 = _ipv6_loopback()
needs_ipv6 = pytest.mark.skipif(not HAS_IPV6, reason="this machine has no IPv6 loopback (::1)")


def _connects(address: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as client:
        client.settimeout(2)
        try:
            client.connect((address, port))
        except OSError:
            return False
    return True


@pytest.fixture
def every_address() -> Iterator[socket.socket]:
    sock = listen_socket(EVERY_ADDRESS, 0)
    yield sock
    sock.close()


def test_every_address_answers_on_ipv4(every_address: socket.socket) -> None:
    port = every_address.getsockname()[1]
    assert _connects("127.0.0.1", port)


@needs_ipv6
def test_every_address_answers_on_ipv6_with_one_socket(every_address: socket.socket) -> None:
    port = every_address.getsockname()[1]
    assert _connects("::1", port)
    assert _connects("127.0.0.1", port)
    assert every_address.family == socket.AF_INET6
    assert describe(every_address) == f"[::]:{port} (IPv6 and IPv4)"


def test_an_ipv4_host_listens_on_ipv4_only() -> None:
    sock = listen_socket("127.0.0.1", 0)
    try:
        port = sock.getsockname()[1]
        assert _connects("127.0.0.1", port)
        if HAS_IPV6:
            assert not _connects("::1", port)
        assert describe(sock) == f"127.0.0.1:{port}"
    finally:
        sock.close()


def test_a_port_in_use_is_a_listen_error_naming_it(every_address: socket.socket) -> None:
    port = every_address.getsockname()[1]
    with pytest.raises(ListenError, match=rf"cannot listen on \[::\]:{port}: .*in use"):
        listen_socket(EVERY_ADDRESS, port)


def test_serve_listens_on_every_address_by_default() -> None:
    assert build_parser().parse_args(["serve"]).host == EVERY_ADDRESS


def _https_readyz(address: str, port: int, ca_file: Path) -> bytes:
    """GET /readyz over TLS, the server's certificate checked against its CA as localhost."""
    context = ssl.create_default_context(cafile=str(ca_file))
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as raw:
        raw.settimeout(5)
        raw.connect((address, port))
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := tls.recv(4096):
                answer += chunk
    return answer


@pytest.fixture
def dual_stack_server(tmp_path: Path) -> Iterator[RunningServer]:
    server = start_server(tmp_path, extra_args=["--host", EVERY_ADDRESS])
    yield server
    server.process.terminate()
    server.process.wait(10)


@pytest.mark.parametrize(
    "address", ["127.0.0.1", pytest.param("::1", marks=needs_ipv6)], ids=["ipv4", "ipv6"]
)
def test_the_webhook_answers_https_and_probes_on_both_families(
    dual_stack_server: RunningServer, address: str
) -> None:
    server = dual_stack_server
    answer = _https_readyz(address, server.port, server.cert_dir / certs.CA_FILE)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    host = f"[{address}]" if ":" in address else address
    assert httpx.get(f"http://{host}:{server.health_port}/livez", timeout=5).status_code == 200


def test_serve_on_a_port_in_use_says_so_in_one_line(
    every_address: socket.socket, tmp_path: Path
) -> None:
    from tests.test_cli import run

    taken = every_address.getsockname()[1]
    cert_dir = tmp_path / "tls"
    certs.write_bundle(certs.generate(["localhost"]), cert_dir)
    done = run(
        "serve", "--no-cluster", "--cert-dir", str(cert_dir), "--port", str(taken),
        "--health-port", str(free_port()),
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("coschedule serve:")]
    assert line.startswith(f"coschedule serve: --port {taken}: cannot listen on [::]:{taken}: ")
    assert "in use" in line


def test_reconcile_on_a_health_port_in_use_says_so_in_one_line(
    every_address: socket.socket, tmp_path: Path
) -> None:
    from tests.conftest import write_kubeconfig
    from tests.test_cli import run

    taken = every_address.getsockname()[1]
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9")
    done = run("reconcile", "--kubeconfig", str(kubeconfig), "--health-port", str(taken))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(f"coschedule reconcile: cannot listen on [::]:{taken}: ")
    )
