"""The manifests ``explain`` is given (``-f``, ``--claims``, ``--controls``): read with the
webhook's own size cap, parsed as JSON by orjson or as YAML by libyaml, and every error said
on one line with where it is."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson
import yaml

from coschedule.server.admission import MAX_BODY_BYTES

# The webhook's own cap on a review: no object it admits is larger, and a larger file would
# take the YAML parser long to say so.
MAX_INPUT_BYTES = MAX_BODY_BYTES

# libyaml's loader is ~10x faster than the pure-Python one (a 2.6 MB pod: 1 s, not 10 s); the
# pure-Python one stays for an interpreter built without libyaml.
_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class Unreadable(ValueError):
    """The input cannot be read or parsed (exit code 2); the message is one line."""


def read_input(name: str) -> str:
    """The text of ``name`` (``-``: stdin), refused past ``MAX_INPUT_BYTES``."""
    try:
        if name == "-":
            data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        else:
            with Path(name).open("rb") as handle:
                data = handle.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise Unreadable(exc.strerror or str(exc)) from None
    if len(data) > MAX_INPUT_BYTES:
        raise Unreadable(
            f"larger than {MAX_INPUT_BYTES} bytes (7 MiB), the webhook's own cap on a review; "
            "no object it admits is that large"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Unreadable(f"not UTF-8 text (byte {exc.start})") from None


def documents(text: str) -> list[Any]:
    """The documents of a YAML stream (or the one JSON value), empty ones left out."""
    if text.lstrip()[:1] in ("{", "["):
        try:
            return [orjson.loads(text)]
        except orjson.JSONDecodeError:
            pass  # YAML's flow style starts so too: the YAML parser says what is wrong
    try:
        return [doc for doc in yaml.load_all(text, Loader=_Loader) if doc is not None]
    except yaml.YAMLError as exc:
        raise Unreadable(f"not YAML or JSON: {yaml_error(exc)}") from None


def one_document(text: str) -> Any:
    """The one document of ``text`` (None for an empty file); more than one is refused, not
    half read: explaining the first of several objects would answer another question."""
    docs = documents(text)
    if len(docs) > 1:
        kinds = ", ".join(_kind(doc) for doc in docs[:5]) + (", ..." if len(docs) > 5 else "")
        raise Unreadable(
            f"{len(docs)} YAML documents ({kinds}); give one (e.g. kubectl get pod NAME -o yaml)"
        )
    return docs[0] if docs else None


def yaml_error(exc: yaml.YAMLError) -> str:
    """PyYAML's several lines (the problem, its context, a snippet with a caret) as one:
    ``line 3, column 5: mapping values are not allowed here``."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        what = " ".join(part for part in (exc.context, exc.problem) if part) or "invalid YAML"
        if mark is not None:
            return f"line {mark.line + 1}, column {mark.column + 1}: {what}"
        return what
    return " ".join(str(exc).split())


def _kind(doc: Any) -> str:
    if isinstance(doc, dict):
        return str(doc.get("kind") or "no kind")[:40]
    return f"a {type(doc).__name__}"
