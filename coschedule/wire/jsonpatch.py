"""Hand-built RFC 6902 operations; paths escaped per RFC 6901 (``~`` -> ``~0``, ``/`` -> ``~1``).

Building operations directly is cheaper than diffing two documents, and lets the decision
say exactly what it changes.
"""

from __future__ import annotations

from typing import Any

Op = dict[str, Any]


def escape(token: str) -> str:
    # Order matters: escaping "/" first would turn its "~1" into "~01".
    return token.replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str | int) -> str:
    return "".join("/" + (escape(t) if isinstance(t, str) else str(t)) for t in tokens)


def add(path: str, value: Any) -> Op:
    return {"op": "add", "path": path, "value": value}


def replace(path: str, value: Any) -> Op:
    return {"op": "replace", "path": path, "value": value}


def remove(path: str) -> Op:
    return {"op": "remove", "path": path}


def test(path: str, value: Any) -> Op:
    """Fail the whole patch unless ``path`` holds ``value`` (a guard on a stale view)."""
    return {"op": "test", "path": path, "value": value}


class PatchTestFailed(ValueError):
    """A ``test`` operation did not hold (kube-apiserver answers 422)."""


def unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def apply(doc: Any, ops: list[Op]) -> Any:
    """Apply add/remove/replace/test ops to a deep copy of ``doc``. For ``explain``, not the hot
    path: kube-apiserver applies the patch in the cluster."""
    import copy

    result = copy.deepcopy(doc)
    for op in ops:
        tokens = [unescape(t) for t in op["path"].split("/")[1:]]
        if not tokens:
            result = copy.deepcopy(op["value"])
            continue
        parent = result
        for token in tokens[:-1]:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        last = tokens[-1]
        kind = op["op"]
        if kind == "test":
            here = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if here != op["value"]:
                raise PatchTestFailed(f"test failed at {op['path']}: {here!r} != {op['value']!r}")
            continue
        if isinstance(parent, list):
            if kind == "remove":
                del parent[int(last)]
            elif kind == "add":
                value = copy.deepcopy(op["value"])
                if last == "-":
                    parent.append(value)
                else:
                    parent.insert(int(last), value)
            else:
                parent[int(last)] = copy.deepcopy(op["value"])
        elif kind == "remove":
            del parent[last]
        else:
            parent[last] = copy.deepcopy(op["value"])
    return result
