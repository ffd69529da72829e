"""The version a release tag must carry: the package's, the chart's and the manifests'.

``python3 .github/scripts/release_version.py v0.1.0`` prints ``0.1.0`` when pyproject.toml,
charts/coschedule/Chart.yaml (version and appVersion) and the image tag of
manifests/base/kustomization.yaml all say 0.1.0, and fails naming each one that does not.
The release workflow runs it before it builds ghcr.io/coschedule/coschedule:<version>, so
the image it pushes is the one the manifests and the chart pull.

``--notes`` prints instead the CHANGELOG.md section ``## [0.1.0]`` (the release's notes;
none is an error: a release says what it changed). ``--dist DIR`` also checks the Python
distributions in DIR before they go to PyPI: every one is version 0.1.0, the wheel installs
the ``coschedule`` command and carries the LICENSE, so ``pipx install coschedule==0.1.0``
gives the CLI of the image tagged 0.1.0. Standard library only: it runs on a bare CI runner.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
import zipfile
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


def notes(version: str, root: Path = ROOT) -> str:
    """The CHANGELOG.md section of ``version``, without its heading."""
    text = (root / "CHANGELOG.md").read_text("utf-8")
    heading = re.compile(rf"^## \[{re.escape(version)}\][^\n]*\n", re.MULTILINE)
    found = heading.search(text)
    if found is None:
        raise ValueError(
            f"CHANGELOG.md has no section '## [{version}] - YYYY-MM-DD': rename "
            "'## [Unreleased]' to it before tagging"
        )
    rest = text[found.end() :]
    end = re.search(r"^(## |\[[^\]]+\]: )", rest, re.MULTILINE)
    body = (rest[: end.start()] if end else rest).strip()
    if not body:
        raise ValueError(f"CHANGELOG.md section [{version}] is empty")
    return body + "\n"


def check_dist(version: str, dist: Path) -> list[str]:
    """The distributions in ``dist``, each checked to be ``version`` of coschedule."""
    found = sorted(p for p in dist.iterdir() if p.name.endswith((".whl", ".tar.gz")))
    wheels = [p for p in found if p.suffix == ".whl"]
    if not wheels:
        raise ValueError(f"{dist}: no wheel to publish")
    wrong = [p.name for p in found if not p.name.startswith(f"coschedule-{version}")]
    if wrong:
        raise ValueError(f"{dist}: not coschedule {version}: {', '.join(wrong)}")
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
            info = f"coschedule-{version}.dist-info"
            metadata = archive.read(f"{info}/METADATA").decode()
            entry_points = archive.read(f"{info}/entry_points.txt").decode()
        if f"\nVersion: {version}\n" not in metadata:
            raise ValueError(f"{wheel.name}: METADATA does not say Version: {version}")
        if not re.search(r"^coschedule\s*=\s*coschedule\.cli\.main:main$", entry_points, re.M):
            raise ValueError(f"{wheel.name}: no console script coschedule")
        if f"{info}/licenses/LICENSE" not in names:
            raise ValueError(f"{wheel.name}: no LICENSE in {info}/licenses")
    return [p.name for p in found]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="release_version.py", description=__doc__)
    parser.add_argument("tag", help="the release tag, v<version>")
    parser.add_argument("--notes", action="store_true", help="print the CHANGELOG section")
    parser.add_argument("--dist", type=Path, help="check the distributions in this folder")
    args = parser.parse_args(argv[1:])
    try:
        version = check(args.tag)
        if args.dist is not None:
            for name in check_dist(version, args.dist):
                print(f"release_version: {name} is coschedule {version}", file=sys.stderr)
        print(notes(version) if args.notes else version, end="" if args.notes else "\n")
    except (ValueError, OSError, KeyError, zipfile.BadZipFile) as exc:
        print(f"release_version: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
