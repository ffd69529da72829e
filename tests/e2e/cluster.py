"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, and where present
kube-controller-manager and kube-scheduler. No kubelet: nodes are API objects.

Binaries come from ``$KUBEBUILDER_ASSETS`` (the envtest convention), else from
setup-envtest's default folder (``~/.local/share/kubebuilder-envtest/k8s/<newest>``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.e2e.kube import Api
from tests.e2e.pki import Pki, make_pki, write_kubeconfig

REQUIRED = ("kube-apiserver", "etcd")
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
OPTIONAL = ("kube-scheduler", "kube-controller-manager", "kubectl")
ENVTEST_HOME = Path("~/.local/share/kubebuilder-envtest/k8s").expanduser()

# No kubelet heartbeats: the node lifecycle controller would mark every fake node unreachable
# and the taint controllers would evict what runs there.
KCM_CONTROLLERS = (
    "*,-node-lifecycle-controller,-taint-eviction-controller,-device-taint-eviction-controller"
)
# Real kubelets heartbeat (tests/real): every controller a cluster runs, node lifecycle and
# taint eviction included; the cloud ones and node IPAM have nothing to do on loopback.
KCM_CONTROLLERS_WITH_KUBELETS = (
    "*,-node-ipam-controller,-service-lb-controller,-cloud-node-lifecycle-controller,"
    "-node-route-controller"
)


def _version_key(folder: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", folder.name.split("-")[0]))


def find_binaries() -> tuple[Path | None, str]:
    """(folder, where it came from) or (None, why not)."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        folder = Path(assets).expanduser()
        missing = [name for name in REQUIRED if not (folder / name).is_file()]
        if not missing:
            return folder, f"KUBEBUILDER_ASSETS={folder}"
        return None, f"KUBEBUILDER_ASSETS={folder} lacks {', '.join(missing)}"
    if ENVTEST_HOME.is_dir():
        candidates = [
            d
            for d in ENVTEST_HOME.iterdir()
            if d.is_dir() and not d.is_symlink() and all((d / n).is_file() for n in REQUIRED)
        ]
        if candidates:
            folder = max(candidates, key=_version_key)
            return folder, f"setup-envtest folder {folder}"
    return (
        None,
        "no kube-apiserver/etcd in KUBEBUILDER_ASSETS or ~/.local/share/kubebuilder-envtest",
    )


def find_kubectl(binaries: Path | None) -> Path | None:
    if binaries is not None and (binaries / "kubectl").is_file():
        return binaries / "kubectl"
    found = shutil.which("kubectl")
    return Path(found) if found else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Proc:
    """A child process whose output goes to a log file."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    cwd: Path | None = None
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``."""
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(5)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])


def wait_healthy(
    url: str,
    proc: Proc,
    *,
    timeout: float,
    ca_file: Path | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(
                f"{proc.name} exited with {proc.returncode()} before {url} was healthy:\n"
                f"{proc.tail(60)}"
            )
        try:
            verify: ssl.SSLContext | bool = (
                ssl.create_default_context(cafile=str(ca_file)) if ca_file else False
            )
            response = httpx.get(url, verify=verify, headers=headers, timeout=2)
            if response.status_code == 200:
                return
            last = f"HTTP {response.status_code}: {response.text[:500]}"
        except httpx.HTTPError as exc:
            last = str(exc)
        time.sleep(0.2)
    raise RuntimeError(
        f"{proc.name}: {url} not healthy after {timeout:.0f}s ({last}):\n{proc.tail(60)}"
    )


@dataclass
class ControlPlane:
    binaries: Path
    workdir: Path
    pki: Pki | None = None
    server: str = ""
    admin_kubeconfig: Path | None = None
    procs: dict[str, Proc] = field(default_factory=dict)
    api: Api | None = None
    kcm_controllers: str = KCM_CONTROLLERS
    kcm_args: tuple[str, ...] = ()  # more kube-controller-manager flags (node lifecycle)
    # More kube-apiserver flags (the artifact tier: --enable-aggregator-routing=true).
    apiserver_args: tuple[str, ...] = ()

    @property
    def has_scheduler(self) -> bool:
        return (self.binaries / "kube-scheduler").is_file()

    @property
    def has_controller_manager(self) -> bool:
        return (self.binaries / "kube-controller-manager").is_file()

    def _proc(self, name: str, argv: Sequence[str]) -> Proc:
        proc = Proc(name, list(argv), self.workdir / "logs" / f"{name}.log")
        self.procs[name] = proc
        return proc.start()

    def start_apiserver(self) -> Api:
        self.pki = pki = make_pki(self.workdir / "pki")
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        b = self.binaries
        etcd = self._proc(
            "etcd",
            [
                str(b / "etcd"),
                "--name=e2e",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=e2e=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        wait_healthy(f"http://127.0.0.1:{etcd_port}/health", etcd, timeout=30)
        self.server = f"https://127.0.0.1:{api_port}"
        apiserver = self._proc(
            "kube-apiserver",
            [
                str(b / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={api_port}",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--tls-cert-file={pki.apiserver_crt}",
                f"--tls-private-key-file={pki.apiserver_key}",
                f"--client-ca-file={pki.ca_crt}",
                f"--token-auth-file={pki.tokens_csv}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",
                "--v=1",
                *self.apiserver_args,
            ],
        )
        headers = {"Authorization": f"Bearer {pki.admin_token}"}
        wait_healthy(
            f"{self.server}/readyz",
            apiserver,
            timeout=90,
            ca_file=pki.ca_crt,
            headers=headers,
        )
        self.admin_kubeconfig = write_kubeconfig(
            self.workdir / "admin.kubeconfig", self.server, pki.ca_crt, pki.admin_token, "admin"
        )
        self.api = Api(self.server, pki.ca_crt, pki.admin_token)
        return self.api

    def start_controllers(self) -> None:
        """kube-controller-manager and kube-scheduler, where present; returns once both are
        healthy (started together: they take a few seconds each)."""
        pending: list[tuple[str, Proc]] = []
        if self.has_controller_manager:
            pending.append(self._launch_controller_manager())
        if self.has_scheduler:
            pending.append(self._launch_scheduler(()))
        for url, proc in pending:
            wait_healthy(url, proc, timeout=90)

    def start_controller_manager(self) -> Proc:
        """kube-controller-manager alone (``kcm_controllers``); returns once it is healthy."""
        url, proc = self._launch_controller_manager()
        wait_healthy(url, proc, timeout=90)
        return proc

    def _launch_controller_manager(self) -> tuple[str, Proc]:
        assert self.pki is not None
        port = free_port()
        proc = self._proc(
            "kube-controller-manager",
            [
                str(self.binaries / "kube-controller-manager"),
                *self._component_args(port, "kcm-certs"),
                f"--service-account-private-key-file={self.pki.sa_key}",
                f"--root-ca-file={self.pki.ca_crt}",
                "--use-service-account-credentials=true",
                f"--controllers={self.kcm_controllers}",
                *self.kcm_args,
                "--v=1",
            ],
        )
        return f"https://127.0.0.1:{port}/healthz", proc

    def start_scheduler(self, extra_args: Sequence[str] = ()) -> Proc:
        """kube-scheduler alone (with ``extra_args``, e.g. client rate limits); returns once
        it is healthy."""
        url, proc = self._launch_scheduler(extra_args)
        wait_healthy(url, proc, timeout=90)
        return proc

    def _launch_scheduler(self, extra_args: Sequence[str]) -> tuple[str, Proc]:
        port = free_port()
        proc = self._proc(
            "kube-scheduler",
            [
                str(self.binaries / "kube-scheduler"),
                *self._component_args(port, "scheduler-certs"),
                "--v=1",
                *extra_args,
            ],
        )
        return f"https://127.0.0.1:{port}/healthz", proc

    def _component_args(self, port: int, cert_dir: str) -> list[str]:
        """What kube-controller-manager and kube-scheduler share: the admin kubeconfig for
        everything, loopback serving, no leader election."""
        assert self.admin_kubeconfig is not None
        kc = str(self.admin_kubeconfig)
        return [
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--authentication-skip-lookup=true",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.workdir / cert_dir}",
            "--leader-elect=false",
        ]

    def stop(self) -> None:
        """Everything, newest first; never raises."""
        if self.api is not None:
            with contextlib.suppress(Exception):
                self.api.close()
        for proc in reversed(list(self.procs.values())):
            with contextlib.suppress(Exception):
                proc.stop(timeout=5)

    def tails(self, lines: int = 25, control_plane_lines: int = 8) -> str:
        """The last lines of every component's log: ours in full measure, the control
        plane's shorter (the whole logs stay in the session's tmp folder)."""
        out = []
        for name, proc in self.procs.items():
            count = control_plane_lines if name in CONTROL_PLANE else lines
            state = "running" if proc.alive() else f"exited {proc.returncode()}"
            out.append(f"----- {name} ({state}), last {count} lines of {proc.log_path}")
            out.append(proc.tail(count))
        return "\n".join(out)
