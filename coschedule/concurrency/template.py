"""The group key template: ``$(params.NAME)``, ``$(labels.KEY)``, ``$(annotations.KEY)``,
``$(context.namespace)`` and literal text; and the label value a key becomes.

The CRD's CEL rules (manifests/crds/crd-concurrencycontrol.yaml) accept exactly what
``parse_template`` accepts: the same grammar, written as the regular expressions below.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from coschedule.k8s.names import valid_label_value

# A reference's text between "$(" and ")".
REFERENCE = (
    r"params\.[A-Za-z0-9_.-]+|labels\.[A-Za-z0-9_./-]+|annotations\.[A-Za-z0-9_./-]+"
    r"|context\.namespace"
)
# The whole template: references, runs of "$" not starting a reference, other text.
GRAMMAR = rf"^(\$*\$\(({REFERENCE})\)|\$+[^$(]|\$+$|[^$])*$"
UNCLOSED = r"\$\([^)]*$"
MAX_LENGTH = 1024

_REFERENCE = re.compile(rf"^({REFERENCE})$")
HASH_HEX = 16


class BadTemplate(ValueError):
    """The key template is malformed; the message names the field and the fix."""


@dataclass(frozen=True, slots=True)
class Ref:
    source: str  # params | labels | annotations | context
    name: str


Part = str | Ref


@dataclass(frozen=True, slots=True)
class Template:
    text: str
    parts: tuple[Part, ...]

    def expand(
        self,
        namespace: str,
        labels: Mapping[str, str],
        annotations: Mapping[str, str],
        params: Mapping[str, Any],
    ) -> str:
        """The key of one run; whatever is missing is an empty string."""
        out: list[str] = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
            elif part.source == "params":
                out.append(_text(params.get(part.name)))
            elif part.source == "labels":
                out.append(labels.get(part.name, ""))
            elif part.source == "annotations":
                out.append(annotations.get(part.name, ""))
            else:
                out.append(namespace)
        return "".join(out)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    # Tekton array and object params: their JSON, so equal values give equal keys.
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def parse_template(text: str, where: str = "spec.key") -> Template:
    if len(text) > MAX_LENGTH:
        raise BadTemplate(f"{where} is longer than {MAX_LENGTH} characters")
    parts: list[Part] = []
    literal: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("$(", i):
            end = text.find(")", i + 2)
            if end < 0:
                raise BadTemplate(
                    f"{where}: unclosed '$(' at position {i}: write $(params.NAME), "
                    "$(labels.KEY), $(annotations.KEY) or $(context.namespace)"
                )
            inner = text[i + 2 : end]
            if not _REFERENCE.match(inner):
                raise BadTemplate(
                    f"{where}: unknown reference $({inner}) at position {i}: only "
                    "$(params.NAME), $(labels.KEY), $(annotations.KEY) and "
                    "$(context.namespace) are understood"
                )
            if literal:
                parts.append("".join(literal))
                literal = []
            source, _, name = inner.partition(".")
            parts.append(Ref(source, name))
            i = end + 1
        else:
            literal.append(text[i])
            i += 1
    if literal:
        parts.append("".join(literal))
    return Template(text, tuple(parts))


def label_value(key: str) -> str:
    """The key itself when it is a valid label value, else the first 16 hex digits of its
    SHA-256 (UTF-8): never refused, and equal keys always share a group."""
    if valid_label_value(key):
        return key
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:HASH_HEX]


_INTEGER = re.compile(r"^[+-]?[0-9]{1,18}$")


def priority_value(text: str) -> int:
    """A priority template's value as an integer: a decimal integer (surrounding blanks
    ignored); anything else, a missing value included, is 0. Never refused, as keys."""
    text = text.strip()
    return int(text) if _INTEGER.match(text) else 0
