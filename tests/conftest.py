"""Shared test helpers: a real ``coschedule serve`` process over real HTTPS."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from coschedule import certs

ROOT = Path(__file__).resolve().parent.parent


# How long a test waits for what is normally a fraction of a second away (a process started
# and ready, a watch event seen): generous, so that a machine busy with other work (seven test
# suites on 2 cores) still passes. A test polls and goes on the moment its condition holds,
# so the deadline costs nothing when all is well; it only bounds a real failure.
PATIENCE_SECONDS = 120.0


def wait_until(
    check: Callable[[], object],
    what: str,
    *,
    within: float = PATIENCE_SECONDS,
    interval: float = 0.1,
    describe: Callable[[], str] | None = None,
) -> None:
    """Poll ``check`` until it is truthy; fail after ``within`` s naming ``what`` (and
    ``describe()``: a log, say)."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            detail = f":\n{describe()}" if describe is not None else ""
            raise AssertionError(f"{what}: not within {within:g} s{detail}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def trust(ca_file: str | Path) -> ssl.SSLContext:
    """A client context that trusts exactly this CA."""
    return ssl.create_default_context(cafile=str(ca_file))


@dataclass
class RunningServer:
    process: subprocess.Popen[bytes]
    port: int
    health_port: int
    cert_dir: Path
    config_dir: Path
    log_path: Path

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.health_port}"

    @property
    def ca(self) -> str:
        return str(self.cert_dir / certs.CA_FILE)

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, verify=trust(self.ca), timeout=10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def launch_server(
    tmp_path: Path,
    *,
    config: dict[str, str] | None = None,
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    config_dir_flag: bool = True,
    kubeconfig: Path | None = None,
) -> RunningServer:
    """Start ``coschedule serve`` without waiting for it: offline (``--no-cluster``) unless
    a ``kubeconfig`` is given."""
    cert_dir = tmp_path / "tls"
    if not (cert_dir / certs.CERT_FILE).exists():
        certs.write_bundle(certs.generate(["localhost", "127.0.0.1"]), cert_dir)
    config_dir = tmp_path / "config"
    config_dir.mkdir(exist_ok=True)
    for key, value in (config or {}).items():
        (config_dir / key).write_text(value)
    port, health_port = free_port(), free_port()
    log_path = tmp_path / "serve.log"
    process_env = {k: v for k, v in os.environ.items() if not k.startswith("COSCHEDULE_")}
    process_env.update(env or {})
    process_env["PYTHONPATH"] = str(ROOT)
    cluster = ["--kubeconfig", str(kubeconfig)] if kubeconfig else ["--no-cluster"]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "coschedule.cli.main",
            "serve",
            *cluster,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--health-port",
            str(health_port),
            "--cert-dir",
            str(cert_dir),
            *(["--config-dir", str(config_dir)] if config_dir_flag else []),
            *(extra_args or []),
        ],
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
        env=process_env,
        cwd=tmp_path,
    )
    return RunningServer(process, port, health_port, cert_dir, config_dir, log_path)


def start_server(
    tmp_path: Path,
    *,
    config: dict[str, str] | None = None,
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    config_dir_flag: bool = True,
) -> RunningServer:
    """An offline ``coschedule serve``, once its /readyz says ready."""
    server = launch_server(
        tmp_path, config=config, extra_args=extra_args, env=env, config_dir_flag=config_dir_flag
    )
    process = server.process

    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{server.log()}")
        try:
            return httpx.get(f"{server.health_url}/readyz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(ready, "serve ready (/readyz 200)", describe=server.log)
    except AssertionError:
        process.kill()
        raise
    return server


def write_kubeconfig(path: Path, server_url: str, namespace: str | None = None) -> Path:
    """A kubeconfig for an API server at ``server_url`` (the tests' kmock emulator, or an
    address nothing listens on), with a bearer token and, if given, a default namespace."""
    context = "cluster: kmock, user: me" + (f", namespace: {namespace}" if namespace else "")
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: kmock, cluster: {{server: "{server_url}"}}}}]
users: [{{name: me, user: {{token: t0k3n}}}}]
contexts: [{{name: here, context: {{{context}}}}}]
current-context: here
"""
    )
    return path


def reconciler_command(
    kubeconfig: Path, config_dir: Path, health_port: int
) -> tuple[list[str], dict[str, str]]:
    """``coschedule reconcile`` as the manifests run it (JSON logs), and an environment
    without the host's COSCHEDULE_* and KUBE* variables."""
    argv = [
        sys.executable,
        "-m",
        "coschedule.cli.main",
        "reconcile",
        "--kubeconfig",
        str(kubeconfig),
        "--config-dir",
        str(config_dir),
        "--health-port",
        str(health_port),
        "--log-format",
        "json",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COSCHEDULE_", "KUBE"))}
    return argv, {**env, "PYTHONPATH": str(ROOT)}


def stop_server(server: RunningServer) -> None:
    if server.process.poll() is None:
        server.process.terminate()
        try:
            server.process.wait(30)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    running = start_server(tmp_path)
    yield running
    stop_server(running)
