"""Kubernetes' name rules: label keys and values, DNS labels and subdomains."""

from __future__ import annotations

import pytest

from coschedule.k8s.names import (
    label_key_problem,
    valid_dns_label,
    valid_dns_subdomain,
    valid_label_key,
    valid_label_value,
)


@pytest.mark.parametrize(
    "key", ["app", "tekton.dev/pipelineRun", "a_b.c-d", "example.com/x", "x" * 63]
)
def test_valid_label_keys(key: str) -> None:
    assert valid_label_key(key)
    assert label_key_problem(key) is None


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("", "name"),
        ("/app", "prefix"),
        ("Example.com/app", "prefix"),
        ("a..b/app", "prefix"),
        ("example.com/", "name"),
        ("-app", "name"),
        ("x" * 64, "name"),
        ("a/b/c", "prefix"),
    ],
)
def test_invalid_label_keys_say_which_part(key: str, says: str) -> None:
    problem = label_key_problem(key)
    assert problem is not None
    assert problem.startswith(says)
    assert not valid_label_key(key)


def test_label_values_dns_labels_and_subdomains() -> None:
    assert valid_label_value("")
    assert valid_label_value("v1.2_x-y")
    assert not valid_label_value("-v")
    assert not valid_label_value("x" * 64)
    assert valid_dns_label("ci-1")
    assert not valid_dns_label("ci.1")
    assert not valid_dns_label("x" * 64)
    assert valid_dns_subdomain("high.priority-1")
    assert not valid_dns_subdomain("a..b")
    assert not valid_dns_subdomain("UPPER")
    assert not valid_dns_subdomain("a" * 254)
