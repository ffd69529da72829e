"""Benchmark server processes (``bench.target``) and what /proc says about them."""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from bench.payloads import ROOT
from bench.target import FLOOR_RESPONSE, WEBHOOK_MODE

CLOCK_TICKS: Final[int] = os.sysconf("SC_CLK_TCK")
# Polled, so a server that starts at once is used at once; the bound is for a loaded machine.
START_TIMEOUT_S: Final[float] = 120.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (utime + stime of /proc/<pid>/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def write_results(
    path: Path, started_at: str, source: dict[str, Any], load: list[float], **fields: Any
) -> None:
    """A real-stack bench's JSON: when, on what machine and code, under what load, then its
    own figures."""
    doc = {"date": started_at, "machine": machine(), "source": source, "load": load, **fields}
    path.write_text(json.dumps(doc, indent=1, default=str))


def machine() -> dict[str, Any]:
    info: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() and key.strip() not in info:
            info[key.strip()] = value.strip()
        if not line.strip():
            break  # the first processor is enough
    model = info.get("model name", "unknown")
    versions: dict[str, str] = {}
    from importlib.metadata import PackageNotFoundError, version

    for package in ("uvicorn", "uvloop", "httptools", "orjson", "fastapi"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = "absent"
    return {
        "cpu_model": model,
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "cpu_family_model": f"{info.get('cpu family', '?')}/{info.get('model', '?')}",
        "virtual_machine": "hypervisor" in info.get("flags", "").split(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "kernel": platform.release(),
        "openssl": ssl.OPENSSL_VERSION,
        "packages": versions,
    }


def expected_answer(app: str, body: bytes) -> bytes:
    """What a correct server answers to ``body``: the floor's fixed review, or the
    webhook's own decision computed in this process with the same settings."""
    if app == "floor":
        return FLOOR_RESPONSE
    from coschedule.config.store import SettingsStore
    from coschedule.server.cluster import ClusterLink
    from coschedule.server.pod_endpoint import PodEndpoint
    from coschedule.server.webhook_metrics import WebhookMetrics

    link = ClusterLink()
    store = SettingsStore(
        None, {"COSCHEDULE_COSCHEDULE": WEBHOOK_MODE}, adjust=link.adjust_settings
    )
    status, answer = PodEndpoint(store, WebhookMetrics()).handle(body)
    if status != 200:
        raise RuntimeError(f"the webhook refuses the benchmark payload: {status} {answer!r}")
    return answer


def post_once(port: int, body: bytes, ca_file: Path, timeout: float = 5.0) -> tuple[int, bytes]:
    """One review over a fresh TLS connection that verifies the server certificate."""
    context = ssl.create_default_context(cafile=str(ca_file))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as sock,
    ):
        sock.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    data = b"".join(chunks)
    head, _, payload = data.partition(b"\r\n\r\n")
    return int(head[9:12]), payload


@dataclass
class Server:
    """One or more ``bench.target`` processes serving one app on one port."""

    app: str  # "webhook" or "floor"
    cert_dir: Path
    cpus: list[int | None]  # one entry per worker process: its core, or None (unpinned)
    port: int = field(default_factory=free_port)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    log_dir: Path | None = None
    log_level: str = "info"  # the webhook's logging, as `coschedule serve`; "off" disables it
    # The checkout the process runs (bench.hotpath --baseline: an earlier commit's tree).
    root: Path = ROOT

    @property
    def label(self) -> str:
        workers = len(self.cpus)
        pinned = [c for c in self.cpus if c is not None]
        where = f"core {pinned[0]}" if workers == 1 and pinned else f"{workers} workers"
        return f"{self.app} ({where})"

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def start(self, probe_body: bytes) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("COSCHEDULE_")}
        env["PYTHONPATH"] = str(self.root)
        for index, cpu in enumerate(self.cpus):
            args = [
                sys.executable,
                "-m",
                "bench.target",
                "--app",
                self.app,
                "--port",
                str(self.port),
                "--cert-dir",
                str(self.cert_dir),
            ]
            if cpu is not None:
                args += ["--cpu", str(cpu)]
            if self.app == "webhook":
                args += ["--log-level", self.log_level]
            if len(self.cpus) > 1:
                args.append("--reuse-port")
            log = (
                (self.log_dir / f"{self.app}-{self.port}-{index}.log").open("wb")
                if self.log_dir
                else subprocess.DEVNULL
            )
            self.processes.append(
                subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.root)
            )
        self.wait_ready(probe_body)

    def wait_ready(self, body: bytes) -> None:
        """Until the server answers a review correctly; a wrong answer is fatal."""
        expected = expected_answer(self.app, body)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"{self.label} exited with {process.returncode}")
            try:
                status, answer = post_once(self.port, body, self.cert_dir / "ca.crt")
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
                continue
            if status != 200 or answer != expected:
                raise RuntimeError(f"{self.label} answered {status}: {answer[:300]!r}")
            if len(self.processes) > 1:
                # One worker answering is not all answering: the kernel spreads new
                # connections over the workers, so a few more checks reach the others.
                time.sleep(0.5)
                for _ in range(4 * len(self.processes)):
                    self.check(body)
            return

    def check(self, body: bytes) -> None:
        """Fail loudly when the server's answer to ``body`` is not the correct one."""
        status, answer = post_once(self.port, body, self.cert_dir / "ca.crt")
        expected = expected_answer(self.app, body)
        if status != 200 or answer != expected:
            raise RuntimeError(f"{self.label} answered {status}: {answer[:300]!r}")

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.pids)

    def rss_bytes(self) -> int:
        return sum(rss_bytes(pid) for pid in self.pids)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes.clear()

    def __enter__(self) -> Server:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
