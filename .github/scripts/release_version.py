"""The version a release tag must carry: the package's, the chart's and the manifests'.

``python3 .github/scripts/release_version.py v0.1.0`` prints ``0.1.0`` when pyproject.toml,
charts/coschedule/Chart.yaml (version and appVersion) and the image tag of
manifests/base/kustomization.yaml all say 0.1.0, and fails naming each one that does not.
The release workflow runs it before it builds ghcr.io/coschedule/coschedule:<version>, so
the image it pushes is the one the manifests and the chart pull. Standard library only: it
runs on a bare CI runner.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "ghcr.io/coschedule/coschedule"


def _line_value(path: Path, pattern: str) -> str | None:
    match = re.search(pattern, path.read_text("utf-8"), re.MULTILINE)
    return match.group(1) if match else None


def carried_versions(root: Path = ROOT) -> dict[str, str | None]:
    """Where the version is written, and what each place says."""
    project = tomllib.loads((root / "pyproject.toml").read_text("utf-8"))["project"]
    chart = root / "charts" / "coschedule" / "Chart.yaml"
    kustomization = root / "manifests" / "base" / "kustomization.yaml"
    return {
        "pyproject.toml project.version": str(project["version"]),
        "charts/coschedule/Chart.yaml version": _line_value(chart, r'^version:\s*"?([^"\s]+)"?'),
        "charts/coschedule/Chart.yaml appVersion": _line_value(
            chart, r'^appVersion:\s*"?([^"\s]+)"?'
        ),
        "manifests/base/kustomization.yaml newTag": _line_value(
            kustomization, r'^\s+newTag:\s*"?([^"\s]+)"?'
        ),
    }


def check(tag: str, root: Path = ROOT) -> str:
    """The version of tag ``v<version>``; ValueError naming every place that disagrees."""
    if not re.fullmatch(r"v\d+\.\d+\.\d+([-+][0-9A-Za-z.-]+)?", tag):
        raise ValueError(f"tag {tag!r} is not v<semver> (e.g. v0.1.0)")
    version = tag[1:]
    wrong = [
        f"{where} is {value!r}"
        for where, value in carried_versions(root).items()
        if value != version
    ]
    if wrong:
        raise ValueError(f"tag {tag} does not match: " + "; ".join(wrong))
    return version


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: release_version.py v<version>", file=sys.stderr)
        return 2
    try:
        print(check(argv[1]))
    except ValueError as exc:
        print(f"release_version: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
