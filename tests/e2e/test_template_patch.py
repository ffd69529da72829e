"""The placeholder template patch as kube-apiserver applies it: the strategic merge patch
``template_patch`` makes leaves exactly the new template on a StatefulSet, where a JSON
merge patch of the same template keeps what the older one had and the newer one lacks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from coschedule.kube.client import STRATEGIC_MERGE
from coschedule.reconcile.placeholder import template_patch
from tests.e2e.conftest import E2E
from tests.reconcile.test_relocation import older_and_newer_template


def statefulset(name: str, template: dict[str, Any], selector: dict[str, str]) -> dict[str, Any]:
    """Not ours (no managed-by label: the reconciler leaves it alone), and no replicas."""
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": 0,
            "serviceName": name,
            "selector": {"matchLabels": selector},
            "template": template,
        },
    }


def test_kube_apiserver_leaves_exactly_the_new_template(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    old, new = older_and_newer_template()
    # The selector must match both templates: the labels they share.
    shared = {
        k: v for k, v in new["metadata"]["labels"].items() if old["metadata"]["labels"].get(k) == v
    }
    ns = namespace()
    for name in ("replaced", "merged"):
        e2e.api.create(statefulset(name, old, shared), namespace=ns)
    e2e.api.patch(
        "StatefulSet",
        "replaced",
        {"spec": {"template": template_patch(new)}},
        ns,
        patch_type=STRATEGIC_MERGE,
    )
    # The same template as the JSON merge patch the reconciler sent before.
    e2e.api.patch("StatefulSet", "merged", {"spec": {"template": new}}, ns)

    replaced = (e2e.api.get("StatefulSet", "replaced", ns) or {})["spec"]["template"]
    assert replaced["spec"]["nodeSelector"] == {"pool": "ab"}
    assert replaced["metadata"]["labels"] == new["metadata"]["labels"]
    assert "podAntiAffinity" not in replaced["spec"].get("affinity", {})
    assert replaced["spec"].get("affinity", {}).get("nodeAffinity") == new["spec"].get(
        "affinity", {}
    ).get("nodeAffinity")
    assert replaced["spec"]["topologySpreadConstraints"] == new["spec"]["topologySpreadConstraints"]
    # The JSON merge patch the reconciler sent before kept every key it left out.
    merged = (e2e.api.get("StatefulSet", "merged", ns) or {})["spec"]["template"]
    assert merged["spec"]["nodeSelector"] == {"pool": "ab", "disk": "ssd"}
    assert merged["metadata"]["labels"]["coschedule.dev/tenant"] == "payments"
