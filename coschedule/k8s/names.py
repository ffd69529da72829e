"""Kubernetes' name rules (apimachinery's validation): label keys and values, DNS names."""

from __future__ import annotations

import re

_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def valid_dns_label(name: str) -> bool:
    """An RFC 1123 label (a namespace's name): at most 63 characters."""
    return len(name) <= 63 and _DNS_LABEL.match(name) is not None


def valid_dns_subdomain(name: str) -> bool:
    """An RFC 1123 subdomain (most objects' names): at most 253 characters."""
    return len(name) <= 253 and _DNS_SUBDOMAIN.match(name) is not None


def valid_label_value(value: str) -> bool:
    return len(value) <= 63 and _VALUE.match(value) is not None


def label_key_problem(key: str) -> str | None:
    """Why ``key`` is not a valid label key (a qualified name), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and not valid_dns_subdomain(prefix):
        return f"prefix {prefix!r} must be a DNS subdomain of at most 253 characters"
    if not name or len(name) > 63 or not _NAME.match(name):
        return (
            f"name {name!r} must be 1-63 characters, alphanumeric at both ends, with '-', "
            "'_' or '.' between"
        )
    return None


def valid_label_key(key: str) -> bool:
    return label_key_problem(key) is None
