"""Isolation scope on a real control plane and scheduler: isolated runs of different
namespaces never share a node in scope cluster; in scope tenant runs of one tenant's
namespaces may, another tenant's may not; a cross-namespace scope with a zone topology key
is refused (the config at reload, a namespace's label at admission).

The runs go to the two tainted pool nodes (``POOL_NODES``) so that two runs fill them and
the third must wait; the ``pool`` fixture waits until no other scenario's pod is left there.
"""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from coschedule.marks import run_placeholder
from tests.e2e.conftest import E2E, TENANT_LABEL
from tests.e2e.kube import ApiError, dump, wait_for
from tests.e2e.runs import (
    node,
    placeholder_pod_name,
    topology_key,
    unschedulable,
    wait_bound,
    wait_placeholder_bound,
)
from tests.e2e.world import (
    POOL_NODES,
    ZONE,
    TektonRun,
    bare_pod,
    create_pod,
    describe_namespace,
    in_pool,
    unique,
)

pytestmark = pytest.mark.e2e

NEEDS = ("scheduler", "controller-manager", "reconciler")
NO_WORKSPACE = "tekton-taskrun-no-workspace"
ISOLATE = "isolate-pipelinerun"
SCOPE_LABEL = "coschedule.dev/isolation-scope"
ANTI_AFFINITY = "anti-affinity"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def start_run(e2e: E2E, ns: str) -> tuple[TektonRun, str]:
    """A PipelineRun whose first task pod asks for the pool nodes: (run, its placeholder)."""
    run = TektonRun(e2e.api, ns, unique("pr")).create()
    run.pods["build"] = create_pod(
        e2e.api, in_pool(run.pod_manifest("build", fixture=NO_WORKSPACE))
    )
    return run, run_placeholder(ns, run.name)


def landed(e2e: E2E, ns: str, run: TektonRun, placeholder: str) -> str:
    """The pool node the run's placeholder and its pod are on."""
    pinned = node(wait_placeholder_bound(e2e.api, ns, placeholder))
    assert pinned in POOL_NODES, pinned
    wait_bound(e2e.api, ns, run.pod_name("build"), node=pinned)
    return pinned


def waits(e2e: E2E, ns: str, placeholder: str) -> str:
    """The scheduler's message once the placeholder cannot be placed for anti-affinity; it
    is still not bound."""
    _, message = unschedulable(e2e.api, ns, placeholder_pod_name(placeholder), ANTI_AFFINITY)
    pod = e2e.api.must_get("Pod", placeholder_pod_name(placeholder), ns)
    assert not pod["spec"].get("nodeName"), dump(pod)
    return message


def test_cluster_scope_puts_runs_of_two_namespaces_on_two_nodes_and_a_third_waits(
    e2e: E2E, namespace: Callable[..., str], pool: None
) -> None:
    e2e.require(*NEEDS)
    api = e2e.api
    scoped = {SCOPE_LABEL: "cluster"}
    one, two, three = (namespace(mode=ISOLATE, labels=scoped) for _ in range(3))
    run_one, ph_one = start_run(e2e, one)
    node_one = landed(e2e, one, run_one, ph_one)
    sts = api.must_get("StatefulSet", ph_one, one)
    terms = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][REQUIRED]
    assert [t.get("namespaceSelector") for t in terms] == [{}], dump(sts)

    run_two, ph_two = start_run(e2e, two)
    node_two = landed(e2e, two, run_two, ph_two)
    assert node_one != node_two, describe_namespace(api, two)

    # Both pool nodes hold an isolated run of another namespace: the third run waits.
    run_three, ph_three = start_run(e2e, three)
    waits(e2e, three, ph_three)

    # When the first run is done and its placeholder gone, the third takes its node.
    run_one.finish("True")
    pinned = node(wait_placeholder_bound(api, three, ph_three, timeout=90))
    assert pinned == node_one, describe_namespace(api, three)
    wait_bound(api, three, run_three.pod_name("build"), node=pinned)


def test_tenant_scope_lets_one_tenants_namespaces_share_a_node_and_keeps_another_off(
    e2e: E2E, namespace: Callable[..., str], pool: None
) -> None:
    e2e.require(*NEEDS)
    api = e2e.api
    scoped = {SCOPE_LABEL: "tenant"}
    blue = namespace(mode=ISOLATE, labels={**scoped, TENANT_LABEL: "blue"})
    red_a = namespace(mode=ISOLATE, labels={**scoped, TENANT_LABEL: "red"})
    red_b = namespace(mode=ISOLATE, labels={**scoped, TENANT_LABEL: "red"})

    run_blue, ph_blue = start_run(e2e, blue)
    node_blue = landed(e2e, blue, run_blue, ph_blue)
    labels = api.must_get("Pod", placeholder_pod_name(ph_blue), blue)["metadata"]["labels"]
    assert labels.get("coschedule.dev/tenant") == "blue", labels

    # Tenant red: never next to blue; its two namespaces' runs share the other node.
    run_a, ph_a = start_run(e2e, red_a)
    node_red = landed(e2e, red_a, run_a, ph_a)
    assert node_red != node_blue, describe_namespace(api, red_a)
    run_b, ph_b = start_run(e2e, red_b)
    assert landed(e2e, red_b, run_b, ph_b) == node_red, describe_namespace(api, red_b)

    # A second blue run: its own namespace's run holds one node, tenant red the other.
    _, ph_blue_two = start_run(e2e, blue)
    waits(e2e, blue, ph_blue_two)


def _readyz(e2e: E2E) -> str:
    ca = base64.b64decode(e2e.product.ca_bundle).decode()  # the caBundle of the registration
    context = ssl.create_default_context(cadata=ca)
    response = httpx.get(
        f"https://127.0.0.1:{e2e.product.webhook_port}/readyz", verify=context, timeout=5
    )
    return json.dumps(response.json())


def test_a_cross_namespace_scope_with_a_zone_key_is_refused(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    """The config at reload (the last good one stays, /readyz says why, naming both keys);
    a namespace's label at admission (one line naming the label and the fix)."""
    api = e2e.api
    config_dir = e2e.product.config_dir
    assert config_dir is not None
    ns = namespace(mode=ISOLATE, labels={SCOPE_LABEL: "cluster"})

    # The cluster config: refused at reload, the hostname key stays.
    written: list[Path] = []
    try:
        for key, value in (("isolation-scope", "cluster"), ("topology-key", ZONE)):
            tmp = config_dir / f".{key}.tmp"
            tmp.write_text(value)
            tmp.replace(config_dir / key)
            written.append(config_dir / key)
        detail = wait_for(
            "the webhook to refuse the reload",
            lambda: text if "isolation-scope" in (text := _readyz(e2e)) else None,
            timeout=20,
        )
        assert '\\"topology-key\\"' in detail, detail
        probe = api.create(bare_pod(ns, "probe", {"coschedule.dev/group": "probe"}), dry_run=True)
        annotations = probe["metadata"]["annotations"]
        assert annotations["coschedule.dev/topology-key"] == "kubernetes.io/hostname", annotations
        assert annotations["coschedule.dev/isolation-scope"] == "cluster", annotations
    finally:
        for path in written:
            path.unlink(missing_ok=True)
        wait_for(
            "the webhook to load the config again",
            lambda: "isolation-scope" not in _readyz(e2e),
            timeout=20,
        )

    # A namespace's label asking for the same: its runs' pods are denied, saying why.
    # (The reload is watched through a namespace without the label.)
    with topology_key(e2e, namespace(mode="pipelineruns"), ZONE):
        with pytest.raises(ApiError) as caught:
            api.create(bare_pod(ns, "probe", {"coschedule.dev/group": "probe"}), dry_run=True)
        body = caught.value.body
        assert caught.value.status == 403 or "denied the request" in body, body
        assert "rule invalid-isolation-scope" in body, body
        assert f"namespace '{ns}''s label {SCOPE_LABEL} is cluster" in body, body
        assert "Fix: set the label to namespace, or remove it." in body, body
