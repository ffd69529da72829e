"""``pod_fields.claim_volumes``: the claims of a pod's volumes, and which malformed volume it
names first, the same whether every volume is an object (the fast path) or not."""

from __future__ import annotations

from typing import Any

import pytest

from coschedule.wire.pod_fields import MalformedPod, claim_volumes


def _claim(name: str, claim: Any) -> dict[str, Any]:
    return {"name": name, "persistentVolumeClaim": {"claimName": claim}}


def test_claims_come_with_their_index_and_name_in_order() -> None:
    volumes = [
        {"name": "tools", "emptyDir": {}},
        _claim("ws", "data"),
        {"name": "home", "emptyDir": {}},
        {"persistentVolumeClaim": {"claimName": "cache"}},  # no name: ""
        _claim("out", "out-claim"),
    ]
    assert claim_volumes({"volumes": volumes}) == [
        (1, "ws", "data"),
        (3, "", "cache"),
        (4, "out", "out-claim"),
    ]


@pytest.mark.parametrize("spec", [{}, {"volumes": None}, {"volumes": []}])
def test_no_volumes_no_claims(spec: dict[str, Any]) -> None:
    assert claim_volumes(spec) == []


def test_volumes_without_a_claim_give_none() -> None:
    assert claim_volumes({"volumes": [{"name": "a", "emptyDir": {}}, {"name": "b"}]}) == []


@pytest.mark.parametrize(
    ("volumes", "message"),
    [
        (["tools"], r"volumes\[0\] must be an object"),
        ([{"name": "a"}, 3], r"volumes\[1\] must be an object"),
        # The first bad volume is named, whatever is wrong with a later one.
        ([_claim("a", ""), "x"], r"volumes\[0\]\.persistentVolumeClaim\.claimName"),
        ([{"name": "a"}, [], _claim("b", "")], r"volumes\[1\] must be an object"),
        ([{"name": "a"}, {"persistentVolumeClaim": "c"}], r"volumes\[1\]\.persistentVolumeClaim"),
        ([_claim("a", "ok"), _claim("b", 7)], r"volumes\[1\]\.persistentVolumeClaim\.claimName"),
    ],
)
def test_the_first_malformed_volume_is_named(volumes: list[Any], message: str) -> None:
    with pytest.raises(MalformedPod, match=message):
        claim_volumes({"volumes": volumes})


def test_volumes_not_an_array_are_refused() -> None:
    with pytest.raises(MalformedPod, match=r"pod\.spec\.volumes must be an array"):
        claim_volumes({"volumes": {"name": "a"}})
