"""The commands' rough edges, as a user meets them: each mistake or broken environment is one
line on stderr and a stated exit code, never a traceback."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from coschedule.cli import manifests
from tests.conftest import PATIENCE_SECONDS, ROOT, write_kubeconfig
from tests.fixtures import load_pod, pod_path
from tests.test_cli import _cert_dir, run

# Root reads and writes any file whatever its mode; these tests take the capabilities that let
# it (as a non-root user lacks them) away, so a mode-000 folder is unreadable to the process.
SETPRIV = shutil.which("setpriv")
_UNPRIVILEGED = (
    [SETPRIV, "--bounding-set", "-dac_override,-dac_read_search,-fowner"]
    if os.geteuid() == 0 and SETPRIV
    else []
)
needs_permissions = pytest.mark.skipif(
    os.geteuid() == 0 and not SETPRIV, reason="root without setpriv: file modes are not enforced"
)


def unprivileged(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_UNPRIVILEGED, sys.executable, "-m", "coschedule.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=PATIENCE_SECONDS,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )


def one_line(stderr: str, prefix: str = "coschedule ") -> str:
    """The one line the command wrote (a log line before it, such as serve's note that the
    config folder is absent, is not part of it)."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.strip().splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, stderr
    return lines[0]


# ---- explain --run against an API server that is not there --------------------------------


def test_explain_run_against_an_unreachable_api_server_is_one_line(tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9")
    result = run("explain", "--run", "pipelinerun/x", "-n", "ci", "--kubeconfig", str(kubeconfig))
    assert result.returncode == 1, result.stderr
    line = one_line(result.stderr)
    assert line == "coschedule explain: cannot read the cluster: connection refused"


# ---- serve: a certificate folder it cannot read, a folder it cannot write -------------------


@needs_permissions
def test_serve_with_an_unreadable_cert_dir_says_so(tmp_path: Path) -> None:
    folder = _cert_dir(tmp_path)
    folder.chmod(0)
    try:
        result = unprivileged(
            "serve", "--no-cluster", "--host", "127.0.0.1", "--cert-dir", str(folder),
            "--port", "1", "--health-port", "2",
        )  # fmt: skip
    finally:
        folder.chmod(0o755)
    assert result.returncode == 2, result.stderr
    line = one_line(result.stderr)
    assert line.startswith(f"coschedule serve: --cert-dir {folder}: permission denied"), line
    assert "this process can read" in line


@needs_permissions
def test_serve_in_a_read_only_folder_says_where_the_certificate_cannot_be_made(
    tmp_path: Path,
) -> None:
    here = tmp_path / "read-only"
    here.mkdir()
    here.chmod(0o555)
    try:
        result = unprivileged(
            "serve", "--no-cluster", "--host", "127.0.0.1", "--port", "1", "--health-port", "2",
            cwd=here,
        )  # fmt: skip
    finally:
        here.chmod(0o755)
    assert result.returncode == 2, result.stderr
    line = one_line(result.stderr)
    assert line.startswith(
        "coschedule serve: the default certificate folder certs: permission denied"
    ), line
    assert "run where certs/ can be made" in line
    assert not (here / "certs").exists()


# ---- serve: a port in use is said before "serving" ------------------------------------------


@pytest.mark.parametrize("which", ["--port", "--health-port"])
def test_serve_on_a_port_in_use_says_which_before_serving(tmp_path: Path, which: str) -> None:
    folder = _cert_dir(tmp_path)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    ports = {"--port": busy, "--health-port": free}
    if which == "--health-port":
        ports = {"--port": free, "--health-port": busy}
    try:
        result = run(
            "serve", "--no-cluster", "--host", "127.0.0.1", "--cert-dir", str(folder),
            "--port", str(ports["--port"]), "--health-port", str(ports["--health-port"]),
        )  # fmt: skip
    finally:
        taken.close()
    assert result.returncode == 1, result.stderr  # EXIT_LISTEN, as the reconciler's
    assert "Traceback" not in result.stderr
    assert "serving" not in result.stderr
    assert (
        f"coschedule serve: {which} {busy}: cannot listen on 127.0.0.1:{busy}: address already "
        "in use: another process listens there; stop it or give another port"
    ) in result.stderr.splitlines()


# ---- explain | head ----------------------------------------------------------------------


def test_explain_into_a_closed_pipe_is_quiet() -> None:
    """``coschedule explain ... | head -1``: the reader is gone before the report is
    written; no BrokenPipeError, and the exit code a shell gives a command SIGPIPE ended."""
    process = subprocess.Popen(
        [sys.executable, "-m", "coschedule.cli.main", "explain", "-f",
         str(pod_path("tekton-taskrun")), "-o", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert process.stdout is not None
    assert process.stderr is not None
    process.stdout.close()  # before it writes: its write meets a closed pipe
    err = process.stderr.read().decode()
    assert process.wait(PATIENCE_SECONDS) == 141
    assert err == ""


# ---- explain's input: YAML errors, several documents, the size cap, libyaml ----------------


def test_a_yaml_error_is_one_line_with_its_location() -> None:
    result = run("explain", "-f", "-", stdin="kind: Pod\nmetadata:\n  name: a\n   bad: [1\n")
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert re.fullmatch(
        r"coschedule explain: cannot read -: not YAML or JSON: line \d+, column \d+: .+", line
    ), line


def test_a_file_of_several_documents_is_refused_naming_them() -> None:
    pod = yaml.safe_dump(load_pod("tekton-taskrun"))
    result = run("explain", "-f", "-", stdin=f"{pod}---\n{pod}---\nkind: Service\n")
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert line == (
        "coschedule explain: cannot read -: 3 YAML documents (Pod, Pod, Service); give one "
        "(e.g. kubectl get pod NAME -o yaml)"
    )
    assert "expected a single document" not in line
    # An empty document around the one (a leading or trailing ---) is not a second one.
    result = run("explain", "-f", "-", stdin=f"---\n{pod}---\n")
    assert result.returncode == 0, result.stderr


def test_input_over_the_webhooks_cap_is_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    body = yaml.safe_dump(load_pod("tekton-taskrun"))
    big.write_text(body + "#" * (manifests.MAX_INPUT_BYTES - len(body.encode()) + 1))
    result = run("explain", "-f", str(big))
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert line.startswith(f"coschedule explain: cannot read {big}: larger than 7340032 bytes")
    big.write_text(body + "#" * (manifests.MAX_INPUT_BYTES - len(body.encode()) - 1))
    assert run("explain", "-f", str(big)).returncode == 0


def test_yaml_is_parsed_by_libyaml_and_json_by_orjson() -> None:
    assert yaml.__with_libyaml__, "PyYAML's wheel carries libyaml on every supported platform"
    assert manifests._Loader.__name__ == "CSafeLoader"
    pod = load_pod("tekton-taskrun")
    assert manifests.one_document(json.dumps(pod)) == pod
    assert manifests.one_document(yaml.safe_dump(pod)) == pod
    # A flow-style YAML mapping is not JSON: the YAML parser reads it.
    assert manifests.one_document("{a: 1}") == {"a": 1}


# ---- explain's namespace ---------------------------------------------------------------------


def test_explain_takes_dash_n_and_says_an_assumed_namespace() -> None:
    pod = load_pod("tekton-taskrun")
    del pod["metadata"]["namespace"]
    text = json.dumps(pod)
    result = run("explain", "-f", "-", "--mode", "pipelineruns", stdin=text)
    assert result.returncode == 0, result.stderr
    assert (
        "namespace:   default (assumed: the manifest names none and no -n was given)"
        in result.stdout.splitlines()
    )
    out = run("explain", "-f", "-", "--mode", "pipelineruns", "-o", "json", stdin=text)
    report = json.loads(out.stdout)
    assert (report["namespace"], report["namespaceFrom"]) == (
        "default",
        "assumed: the manifest names none and no -n was given",
    )

    from coschedule.marks import run_placeholder

    result = run("explain", "-f", "-", "--mode", "pipelineruns", "-n", "team-a", stdin=text)
    assert result.returncode == 0, result.stderr
    assert "namespace:   team-a" in result.stdout.splitlines()
    assert f"placeholder: {run_placeholder('team-a', 'pr-7f3k2')}" in result.stdout


def test_a_run_without_a_namespace_says_it_is_assumed(tmp_path: Path) -> None:
    from tests.concurrency.runs import pipeline_run

    run_doc = pipeline_run("a")
    del run_doc["metadata"]["namespace"]
    result = run("explain", "-f", "-", stdin=json.dumps(run_doc))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == (
        "run:      PipelineRun in namespace default (assumed: the manifest names none and no -n "
        "was given)"
    )


# ---- the reason line counts the operations printed -----------------------------------------


def test_the_reason_line_counts_every_patch_operation_printed(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "scheduling-defaults").write_text(
        "- nodeSelector: {kubernetes.io/arch: arm64}\n  schedulerName: build-scheduler\n"
    )
    result = run(
        "explain", "-f", str(pod_path("tekton-taskrun")), "--mode", "pipelineruns",
        "--config-dir", str(config),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    start = lines.index("patch (JSONPatch):") + 1
    printed = 0
    while start + printed < len(lines) and lines[start + printed].startswith('  {"op"'):
        printed += 1
    counted = [line for line in lines if line.endswith("patch operation(s)")]
    assert counted == [f"  - {printed} patch operation(s)"]
    assert printed > 3  # the placeholder's ops and the defaults' (the count was 3 of them)
