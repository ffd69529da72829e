"""coschedule.k8s is the ground floor: it imports nothing of coschedule outside itself."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import coschedule.k8s

FLOOR = Path(coschedule.k8s.__file__).parent


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_the_k8s_package_imports_only_itself_and_the_standard_library() -> None:
    modules = sorted(FLOOR.glob("*.py"))
    assert len(modules) > 5
    for path in modules:
        outside = {
            name
            for name in _imports(path)
            if name.split(".")[0] == "coschedule" and not name.startswith("coschedule.k8s")
        }
        assert not outside, f"{path.name} imports {sorted(outside)}"
        third_party = {
            name.split(".")[0]
            for name in _imports(path)
            if name.split(".")[0] not in ("coschedule", "__future__")
            and name.split(".")[0] not in sys.stdlib_module_names
        }
        assert not third_party, f"{path.name} imports {sorted(third_party)}"
