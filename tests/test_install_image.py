"""Install with your own image, every documented way: the image reaches every workload
(Deployments, the certs Job, any Helm hook) and none keeps the shipped default.

The kustomize paths are rendered with the same kustomize as tests/test_manifests.py, the
chart with the same Helm as tests/test_chart.py. The user overlay is the one the README
shows, taken from the README itself.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.chart import CHART, render_chart
from tests.test_manifests import (
    BASE,
    CERT_MANAGER,
    IMAGE,
    MANIFESTS,
    SELF_SIGNED,
    Obj,
    _kustomize_command,
    containers,
    pod_templates,
    render,
)

ROOT = MANIFESTS.parent
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text("utf-8"))["appVersion"]
DEFAULT = f"{IMAGE}:{APP_VERSION}"
MINE = "registry.example.com/platform/coschedule"
DIGEST = "sha256:" + "ab" * 32
# Every workload an install has, by certificate source (the cert-manager path has no Job).
WORKLOADS = {
    "self-signed": {"Deployment coschedule-webhook", "Deployment coschedule-reconciler", "Job"},
    "cert-manager": {"Deployment coschedule-webhook", "Deployment coschedule-reconciler"},
}


def workload_images(docs: list[Obj]) -> dict[str, set[str]]:
    """Workload (``Kind name``; a Job by kind alone: the chart's has the revision in its
    name) to the images of its containers; a bare Pod (a Helm test or hook) counts too."""
    found: dict[str, set[str]] = {}
    pods = [*pod_templates(docs), *((d, d) for d in docs if d["kind"] == "Pod")]
    for owner, pod in pods:
        key = "Job" if owner["kind"] == "Job" else f"{owner['kind']} {owner['metadata']['name']}"
        found.setdefault(key, set()).update(c["image"] for c in containers(pod))
    return found


def _kustomize(folder: Path) -> list[Obj]:
    command = _kustomize_command()
    if command is None:
        pytest.skip("neither kubectl nor kustomize is installed: cannot render manifests/")
    done = subprocess.run(
        [*command, str(folder)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def _readme_overlay() -> str:
    """The README's "your own image" kustomization, as a user copies it."""
    readme = (ROOT / "README.md").read_text("utf-8")
    blocks = re.findall(r"```yaml\n(# my-coschedule/kustomization\.yaml.*?)```", readme, re.S)
    assert len(blocks) == 1, "the README shows one kustomization of your own"
    return str(blocks[0])


def _user_overlay(tmp_path: Path, overlay: str) -> Path:
    """The README's kustomization beside a checkout (a link to this one), REGISTRY filled in
    and, for cert-manager, the overlay its comment names."""
    (tmp_path / "coschedule").symlink_to(ROOT, target_is_directory=True)
    mine = tmp_path / "my-coschedule"
    mine.mkdir()
    text = _readme_overlay().replace("REGISTRY/coschedule", MINE)
    if overlay != SELF_SIGNED:
        text = text.replace("manifests/overlays/self-signed", f"manifests/{overlay}")
    (mine / "kustomization.yaml").write_text(text)
    return mine


@pytest.mark.parametrize(
    ("overlay", "source"), [(SELF_SIGNED, "self-signed"), (CERT_MANAGER, "cert-manager")]
)
def test_the_readme_overlay_sets_every_workload_image(
    tmp_path: Path, overlay: str, source: str
) -> None:
    docs = _kustomize(_user_overlay(tmp_path, overlay))
    images = workload_images(docs)
    assert set(images) == WORKLOADS[source]
    for workload, found in images.items():
        assert found == {f"{MINE}:{APP_VERSION}"}, workload


def test_an_overlay_of_your_own_pins_by_digest(tmp_path: Path) -> None:
    mine = _user_overlay(tmp_path, SELF_SIGNED)
    text = (mine / "kustomization.yaml").read_text()
    text = re.sub(r"newTag: \S+", f"digest: {DIGEST}", text)
    (mine / "kustomization.yaml").write_text(text)
    images = workload_images(_kustomize(mine))
    assert images == {key: {f"{MINE}@{DIGEST}"} for key in WORKLOADS["self-signed"]}


def test_kustomize_edit_set_image_in_the_base_reaches_the_certs_job(tmp_path: Path) -> None:
    """What ``kustomize edit set image ghcr.io/coschedule/coschedule=MINE:9.9.9`` writes in
    manifests/base: the self-signed overlay's Job, which the base does not hold, follows."""
    copy = tmp_path / "manifests"
    shutil.copytree(MANIFESTS, copy)
    kustomization = copy / "base" / "kustomization.yaml"
    doc = yaml.safe_load(kustomization.read_text())
    doc["images"] = [{"name": IMAGE, "newName": MINE, "newTag": "9.9.9"}]
    kustomization.write_text(yaml.safe_dump(doc))
    for overlay, source in ((SELF_SIGNED, "self-signed"), (CERT_MANAGER, "cert-manager")):
        images = workload_images(_kustomize(copy / overlay))
        assert images == {key: {f"{MINE}:9.9.9"} for key in WORKLOADS[source]}, overlay


@pytest.mark.parametrize(
    ("target", "source"),
    [(BASE, "cert-manager"), (SELF_SIGNED, "self-signed"), (CERT_MANAGER, "cert-manager")],
)
def test_the_shipped_manifests_run_the_release_image_everywhere(target: str, source: str) -> None:
    images = workload_images(render(target))
    assert images == {key: {DEFAULT} for key in WORKLOADS[source]}


@pytest.mark.parametrize("source", ["self-signed", "cert-manager"])
@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ({}, DEFAULT),
        ({"repository": MINE}, f"{MINE}:{APP_VERSION}"),
        ({"repository": MINE, "tag": "9.9.9"}, f"{MINE}:9.9.9"),
        ({"repository": MINE, "tag": "9.9.9", "digest": DIGEST}, f"{MINE}@{DIGEST}"),
    ],
    ids=["default", "repository", "tag", "digest"],
)
def test_the_chart_image_reaches_every_workload_hooks_included(
    source: str, image: Obj, expected: str
) -> None:
    docs = render_chart({"certificates": {"source": source}, "image": image})
    images = workload_images(docs)
    assert set(images) == WORKLOADS[source]
    for workload, found in images.items():
        assert found == {expected}, workload
    if image:
        assert DEFAULT not in {i for found in images.values() for i in found}
