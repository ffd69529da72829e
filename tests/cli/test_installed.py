"""The CLI as PyPI gets it (``pipx install coschedule``): the wheel ``make dist`` builds,
installed alone into a fresh virtualenv, run outside the checkout with no kubectl on PATH.
``explain`` works offline, ``release-held`` reaches a cluster through a kubeconfig whose user
is an exec credential plugin (EKS's and GKE's kind), and the version is the image's."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from tests.cli.test_release_held import seed, started
from tests.conftest import ROOT
from tests.reconcile.apiserver import MiniApi

CHART = yaml.safe_load((ROOT / "charts" / "coschedule" / "Chart.yaml").read_text("utf-8"))
TOKEN = "exec-plugin-token"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin folder of a virtualenv holding the built wheel and nothing of the checkout.
    Its dependencies come from this test environment's site-packages by a path entry (the
    machine reaches no index), which adds no coschedule: ours is installed editable there,
    through a .pth file that a plain path entry does not run."""
    where = tmp_path_factory.mktemp("pipx")
    build = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "dist",
            f"DIST={where / 'dist'}",
            f"PYTHON={sys.executable}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = (where / "dist").glob("coschedule-*.whl")
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]
    subprocess.run([*pip, "--no-deps", "--no-index", str(wheel)], check=True, timeout=120)
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv / "bin"


def _run(bin_dir: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / "coschedule"), *args],
        cwd=cwd,
        env={"PATH": str(bin_dir), "HOME": str(cwd)},  # no kubectl, no ~/.kube
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_wheel_is_the_image_version_and_runs_from_itself(
    installed: Path, tmp_path: Path
) -> None:
    version = _run(installed, tmp_path, "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.split() == ["coschedule", CHART["appVersion"]]
    where = subprocess.run(
        [str(installed / "python"), "-c", "import coschedule; print(coschedule.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(installed.parent)), where


def test_explain_works_without_a_checkout(installed: Path, tmp_path: Path) -> None:
    pod = tmp_path / "pod.json"
    pod.write_bytes((ROOT / "tests" / "fixtures" / "pods" / "tekton-taskrun.json").read_bytes())
    done = _run(installed, tmp_path, "explain", "-f", str(pod), "--mode", "pipelineruns")
    assert done.returncode == 0, done.stderr
    assert "decision:    allowed" in done.stdout
    assert "run 'pr-7f3k2': from label tekton.dev/pipelineRun" in done.stdout


def _exec_kubeconfig(tmp_path: Path, server: str) -> Path:
    """A kubeconfig whose user is an exec plugin (client.authentication.k8s.io/v1), as
    ``aws eks update-kubeconfig`` writes one; the plugin prints an ExecCredential."""
    plugin = tmp_path / "credential-plugin"
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"token": TOKEN},
    }
    plugin.write_text(f"#!{sys.executable}\nprint({json.dumps(json.dumps(credential))})\n")
    plugin.chmod(0o755)
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin)}}
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


async def test_release_held_through_an_exec_credential_plugin(
    installed: Path, api: MiniApi, tmp_path: Path
) -> None:
    seed(api)
    api.tokens = {TOKEN}  # any other credential is answered 401
    kubeconfig = str(_exec_kubeconfig(tmp_path, api.url))
    done = await asyncio.to_thread(
        _run,
        installed,
        tmp_path,
        "release-held",
        "--kubeconfig",
        kubeconfig,
        "--dry-run",
        "-n",
        "ci",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "would release PipelineRun ci/held-1 (held by ConcurrencyControl ci, key main)",
        "would release Workflow ci/wf-held (held by ConcurrencyControl ci, key main)",
        "2 held run(s) would be released (dry run: nothing changed)",
        # release-held also lifts our scheduling gate (after an uninstall); none here.
        "no pod is held by the coschedule.dev/placeholder gate",
    ]
    assert started(api) == set()
    # The token is the plugin's: a kubeconfig with another is refused by the same server.
    api.tokens = {"another"}
    refused = await asyncio.to_thread(
        _run, installed, tmp_path, "release-held", "--kubeconfig", kubeconfig, "--dry-run"
    )
    assert refused.returncode == 1
    assert "401" in refused.stderr
