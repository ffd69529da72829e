"""The image's hash-pinned requirements (requirements/*.lock, `make lock`) agree with
pyproject.toml: every direct dependency is locked at the version pyproject pins, nothing is
locked as direct that pyproject no longer asks for, and every package, transitive ones
included, is pinned by version and hash. No network: the files are read as they are."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
RUNTIME_LOCK = ROOT / "requirements" / "runtime.lock"
BUILD_LOCK = ROOT / "requirements" / "build.lock"
FIX = "run `make lock` and commit requirements/"
# What uv writes under a package that pyproject.toml asks for itself.
DIRECT = "coschedule (pyproject.toml)"
_ENTRY = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+?)(?: ; (?P<marker>.+?))?$"
)


@dataclass
class Locked:
    version: Version
    marker: str | None
    hashes: list[str] = field(default_factory=list)
    via: list[str] = field(default_factory=list)


def parse_lock(text: str) -> dict[str, Locked]:
    """``name==version [; marker]`` entries with their ``--hash`` lines and ``# via`` notes,
    as pip-compile and `uv pip compile --generate-hashes` write them."""
    locked: dict[str, Locked] = {}
    current: Locked | None = None
    for raw in text.splitlines():
        line = raw.strip().removesuffix("\\").strip()
        if not line:
            continue
        if line.startswith("--hash="):
            assert current is not None, f"a hash before any package: {raw}"
            current.hashes.append(line.removeprefix("--hash="))
        elif line.startswith("#"):
            note = line.lstrip("#").strip()
            if current is not None and note and note != "via":
                current.via.append(note.removeprefix("via ").strip())
        elif match := _ENTRY.match(line):
            current = Locked(Version(match["version"]), match["marker"])
            locked[canonicalize_name(match["name"])] = current
        else:
            raise AssertionError(f"not a pinned requirement: {raw!r} ({FIX})")
    return locked


def _pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))


def _direct() -> list[Requirement]:
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    return [Requirement(spec) for spec in project["dependencies"]]


def check_lock(requirements: list[Requirement], locked: dict[str, Locked]) -> list[str]:
    """What is wrong between the requirements and the lock (empty: they agree)."""
    wrong = []
    wanted: dict[str, Requirement] = {canonicalize_name(r.name): r for r in requirements}
    for name, req in wanted.items():
        entry = locked.get(name)
        if entry is None:
            wrong.append(f"{req} is not locked")
        elif not req.specifier.contains(entry.version, prereleases=True):
            wrong.append(f"{req} but the lock has {name}=={entry.version}")
        elif req.marker is not None and (
            entry.marker is None or Marker(entry.marker) != req.marker
        ):
            wrong.append(f"{req} but the lock's marker is {entry.marker!r}")
    for package, entry in locked.items():
        if not entry.hashes:
            wrong.append(f"{package}=={entry.version} has no --hash")
        if any(not re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in entry.hashes):
            wrong.append(f"{package}: a hash that is not sha256")
        if DIRECT in entry.via and package not in wanted:
            wrong.append(f"{package} is locked as a direct dependency pyproject.toml no longer has")
    return wrong


def test_runtime_lock_agrees_with_pyproject_dependencies() -> None:
    locked = parse_lock(RUNTIME_LOCK.read_text("utf-8"))
    assert check_lock(_direct(), locked) == [], FIX
    direct = {name for name, entry in locked.items() if DIRECT in entry.via}
    assert direct == {canonicalize_name(req.name) for req in _direct()}, FIX
    # Transitive packages are locked too (pydantic under fastapi, h11 under uvicorn, ...).
    assert len(locked) > len(direct)
    assert all(entry.via for entry in locked.values()), "each entry says why it is there"


def test_build_lock_agrees_with_the_build_system() -> None:
    build_system = _pyproject()["build-system"]
    assert isinstance(build_system, dict)
    wanted = [Requirement(spec) for spec in build_system["requires"]]
    locked = parse_lock(BUILD_LOCK.read_text("utf-8"))
    assert check_lock(wanted, locked) == [], FIX


def _with_version(text: str, name: str, version: str) -> str:
    return re.sub(rf"^{name}==\S+", f"{name}=={version}", text, count=1, flags=re.M)


def test_a_lock_behind_pyproject_is_caught() -> None:
    """The check itself: a dependency bumped in pyproject but not re-locked, one dropped from
    pyproject but still locked as direct, one added but not locked, an entry without hashes."""
    text = RUNTIME_LOCK.read_text("utf-8")
    direct = _direct()
    fastapi = next(req for req in direct if req.name == "fastapi")
    pinned = str(fastapi.specifier).removeprefix("==")

    stale = parse_lock(_with_version(text, "fastapi", pinned + ".post99"))
    assert any("fastapi" in w for w in check_lock(direct, stale))

    dropped = [req for req in direct if req.name != "orjson"]
    assert any("orjson is locked as a direct" in w for w in check_lock(dropped, parse_lock(text)))

    added = [*direct, Requirement("rich==14.0.0")]
    assert "rich==14.0.0 is not locked" in check_lock(added, parse_lock(text))

    unhashed = parse_lock(re.sub(r"^\s+--hash=sha256:\w+( \\)?$", "", text, flags=re.M))
    assert any("has no --hash" in w for w in check_lock(direct, unhashed))

    marker = parse_lock(text.replace("uvloop==0.23.0 ; sys_platform != 'win32'", "uvloop==0.23.0"))
    assert any("marker" in w for w in check_lock(direct, marker))


@pytest.mark.parametrize("line", ["fastapi>=0.1", "-e .", "git+https://example.invalid/x"])
def test_an_unpinned_entry_is_refused(line: str) -> None:
    with pytest.raises(AssertionError, match="not a pinned requirement"):
        parse_lock(f"{line}\n")
