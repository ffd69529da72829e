"""The Makefile a new user meets first: ``make run`` serves with the runtime dependencies only,
on the loopback the README names; ``make test`` adds the dev tools; a venv made by another
Python is made again instead of failing until ``make clean``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAKE = shutil.which("make")

needs_make = pytest.mark.skipif(MAKE is None, reason="no make on PATH")


def _copy(tmp_path: Path) -> Path:
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def _make(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert MAKE is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "VIRTUAL_ENV"))}
    return subprocess.run(
        [MAKE, "--no-print-directory", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _makefile_default(name: str) -> str:
    match = re.search(rf"^{name} \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert match, f"no `{name} ?=` in the Makefile"
    return match.group(1)


@needs_make
def test_make_run_installs_the_runtime_dependencies_only(tmp_path: Path) -> None:
    plan = _make(_copy(tmp_path), "-n", "run")
    assert plan.returncode == 0, plan.stderr
    installs = [line for line in plan.stdout.splitlines() if "pip install" in line]
    assert any(line.rstrip().endswith("install --quiet -e .") for line in installs), installs
    assert not any("[dev]" in line for line in installs), installs


@needs_make
def test_make_test_installs_the_dev_tools(tmp_path: Path) -> None:
    plan = _make(_copy(tmp_path), "-n", "test")
    assert plan.returncode == 0, plan.stderr
    assert "-e '.[dev]'" in plan.stdout
    assert "ruff check" in plan.stdout
    assert "mypy" in plan.stdout


@needs_make
def test_make_run_binds_the_loopback_the_readme_names(tmp_path: Path) -> None:
    host = _makefile_default("HOST")
    assert host in {"127.0.0.1", "localhost", "::1"}, "make run is for a dev machine"
    plan = _make(_copy(tmp_path), "-n", "run")
    serve = [line for line in plan.stdout.splitlines() if " serve " in line]
    assert serve, plan.stdout
    assert f"--host {host}" in serve[-1]
    readme = (ROOT / "README.md").read_text("utf-8")
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert host in quick_start, "the README's quick start says where make run listens"
    assert "0.0.0.0" not in quick_start


def test_python_version_is_stated_where_a_user_looks() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    assert project["requires-python"] == ">=3.11"
    readme = (ROOT / "README.md").read_text("utf-8")
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "Python 3.11" in quick_start


@needs_make
def test_a_venv_made_by_another_python_is_made_again(tmp_path: Path) -> None:
    """A venv whose interpreter reports another Python (or no longer runs) is recreated by
    the first ``make`` that needs it, saying why; the next one leaves it alone."""
    work = _copy(tmp_path)
    stale = work / ".venv" / "bin"
    stale.mkdir(parents=True)
    (stale / "python").write_text('#!/bin/sh\necho "3.10 /opt/old-python"\n')
    (stale / "python").chmod(0o755)
    (work / ".venv" / ".interpreter").write_text("3.10 /opt/old-python\n")

    made = _make(work, f"PYTHON={sys.executable}", ".venv/.interpreter")
    assert made.returncode == 0, made.stderr
    assert "was made by 3.10 /opt/old-python" in made.stdout
    assert "making it again" in made.stdout
    version = subprocess.run(
        [str(stale / "python"), "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert version.stdout.strip() == str(sys.version_info[:2])

    stamp = work / ".venv" / ".interpreter"
    before = stamp.stat().st_mtime_ns
    again = _make(work, f"PYTHON={sys.executable}", ".venv/.interpreter")
    assert again.returncode == 0, again.stderr
    assert "making it again" not in again.stdout
    assert stamp.stat().st_mtime_ns == before, "an unchanged venv must not reinstall"


@needs_make
def test_a_venv_with_no_record_of_its_python_says_so(tmp_path: Path) -> None:
    """A venv made before the record existed is made again, and the message does not claim
    that the same interpreter is another one."""
    work = _copy(tmp_path)
    bin_dir = work / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    same = f"{sys.version_info[0]}.{sys.version_info[1]} {sys.base_prefix}"
    (bin_dir / "python").write_text(f'#!/bin/sh\necho "{same}"\n')
    (bin_dir / "python").chmod(0o755)

    made = _make(work, f"PYTHON={sys.executable}", ".venv/.interpreter")
    assert made.returncode == 0, made.stderr
    assert "has no record of the interpreter that made it: making it again" in made.stdout
    assert "was made by" not in made.stdout
    assert (work / ".venv" / ".interpreter").read_text().strip() == same


def test_serving_needs_no_dev_dependency() -> None:
    """Every coschedule module imports with the [dev] extra's packages unimportable, and
    ``serve --help`` runs: ``make run``'s runtime-only venv serves."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    dev = {
        re.split(r"[ ;=<>!\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        for requirement in project["optional-dependencies"]["dev"]
    }
    probe = f"""
import importlib, importlib.abc, importlib.metadata, pkgutil, sys
dev = {sorted(dev)!r}
blocked = {{
    module
    for module, dists in importlib.metadata.packages_distributions().items()
    if all(d.lower().replace("_", "-") in dev for d in dists)
}}
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ImportError(f"{{name}} is a dev dependency")
        return None
sys.meta_path.insert(0, Refuse())
import coschedule
for info in pkgutil.walk_packages(coschedule.__path__, "coschedule."):
    importlib.import_module(info.name)
from coschedule.cli.main import main
try:
    main(["serve", "--help"])
except SystemExit as done:
    assert done.code == 0, done.code
print("blocked", len(blocked))
"""
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--port" in result.stdout
    blocked = int(result.stdout.rsplit("blocked ", 1)[1])
    assert blocked >= 5, "the dev packages were found and refused"


def _image_plan(tmp_path: Path, *args: str) -> str:
    plan = _make(_copy(tmp_path), "-n", "image", *args)
    assert plan.returncode == 0, plan.stderr
    return plan.stdout


@needs_make
@pytest.mark.parametrize("tool", ["docker", "podman"])
def test_make_image_builds_the_dockerfile_and_saves_an_archive(tmp_path: Path, tool: str) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    plan = _image_plan(tmp_path, f"IMAGE_TOOL={tool}", "IMAGE=reg.example/cs:1")
    assert f'tool="{tool}"' in plan
    # The version label given on the command line too: podman 4.3 caches the Dockerfile's
    # LABEL step whatever VERSION is (tests/real/test_artifact.py rebuilds with another).
    label = f"--label org.opencontainers.image.version={version}"
    assert re.search(
        rf"\$tool build +--build-arg VERSION={version} {label} -t reg\.example/cs:1 \.;", plan
    )
    assert "$tool save -o build/coschedule-image.tar reg.example/cs:1" in plan
    # The Dockerfile's own base unless PYTHON_IMAGE is given.
    given = _image_plan(tmp_path, f"IMAGE_TOOL={tool}", "PYTHON_IMAGE=mirror.example/py:3.11")
    assert "--build-arg PYTHON_IMAGE=mirror.example/py:3.11 --build-arg VERSION=" in given


@needs_make
def test_make_image_without_a_registry_uses_the_imagekit(tmp_path: Path) -> None:
    """Where no registry is reachable: podman through ../shared/image's imagekit, its system
    packages by `imagekit deps`, the base it makes from Debian passed as PYTHON_IMAGE."""
    plan = _image_plan(tmp_path, "IMAGE_TOOL=imagekit", "IMAGE_WORK=/tmp/ik-test", "VERSION=9.9")
    kit = _makefile_default("IMAGEKIT")
    assert f"{kit} deps" in plan
    assert f"out=$({kit} base /tmp/ik-test); base=${{out##*[[:space:]]}}" in plan
    assert f"{kit} podman /tmp/ik-test build $({kit} build-env /tmp/ik-test)" in plan
    assert (
        "--pull=never --build-arg PYTHON_IMAGE=$base --build-arg VERSION=9.9 "
        "--label org.opencontainers.image.version=9.9 "
    ) in plan
    assert "save --format docker-archive -o build/coschedule-image.tar" in plan


@needs_make
def test_make_image_names_what_is_missing(tmp_path: Path) -> None:
    done = _make(_copy(tmp_path), "image", "IMAGE_TOOL=none")
    assert done.returncode != 0
    assert "no docker daemon, no podman" in done.stderr


@needs_make
def test_make_lock_compiles_from_pyproject_with_hashes(tmp_path: Path) -> None:
    plan = _make(_copy(tmp_path), "-n", "lock")
    assert plan.returncode == 0, plan.stderr
    compiles = [line for line in plan.stdout.splitlines() if "uv pip compile" in line]
    assert len(compiles) == 2, plan.stdout
    for line in compiles:
        assert "--generate-hashes" in line
        assert "--python-version 3.11" in line
    assert compiles[0].endswith("--output-file requirements/runtime.lock pyproject.toml")
    assert "build-system" in plan.stdout
    assert "uv==" in (ROOT / "pyproject.toml").read_text(), "uv pinned in the dev extra"


@needs_make
def test_make_help_names_every_target() -> None:
    text = (ROOT / "Makefile").read_text()
    phony = re.search(r"^\.PHONY: (.+)$", text, re.M)
    assert phony
    targets = set(phony.group(1).split()) - {"FORCE"}
    result = _make(ROOT, "help")
    assert result.returncode == 0, result.stderr
    named = {m.group(1) for m in re.finditer(r"^make (\S+)", result.stdout, re.M)}
    assert named == targets
