"""Relocation steering: the state on the StatefulSet, the node affinity it puts on the
placeholder's template, and that ``plan``'s drift check keeps it (never reverts a move)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from coschedule.config.settings import Settings
from coschedule.k8s.constants import PREFERRED, REQUIRED
from coschedule.marks import Mode
from coschedule.reconcile import relocation
from coschedule.reconcile.placeholder import (
    ANNOTATION_TEMPLATE_HASH,
    group_spec,
    pod_template,
    template_hash,
    template_patch,
)
from coschedule.reconcile.plan import drift
from tests.reconcile.apiserver import merge_patch, strategic_merge_patch
from tests.reconcile.pods import marked_pod, parsed
from tests.reconcile.test_plan import existing_set, observed_for

SETTINGS = Settings(mode=Mode.PIPELINERUNS)
HOST = "kubernetes.io/hostname"


def test_state_round_trips_and_accumulates_left_domains() -> None:
    first = relocation.first(HOST, "n1", "n2", 100.0)
    again = first.moved(HOST, "n2", "n3", 200.0)
    parsed_back = relocation.parse({relocation.ANNOTATION_RELOCATIONS: again.encode()})
    assert parsed_back == relocation.Relocations(HOST, ("n1", "n2"), "n3", 200.0)


def test_junk_state_is_ignored_not_fatal() -> None:
    for junk in ("", "{", "[]", '{"left": "n1"}', '{"topologyKey": 1, "left": [], "target": ""}'):
        assert relocation.parse({relocation.ANNOTATION_RELOCATIONS: junk}) is None


def test_steer_adds_required_not_in_and_preferred_target() -> None:
    group = group_spec("ci", "affinity-assistant-x", [parsed(marked_pod("tekton-taskrun"))])
    assert group is not None
    template = pod_template(group, SETTINGS)
    state = relocation.first(HOST, "n1", "n2", 100.0).moved(HOST, "n2", "n3", 150.0)
    steered = relocation.steer(template, {relocation.ANNOTATION_RELOCATIONS: state.encode()})
    affinity = steered["spec"]["affinity"]
    required = affinity["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
    assert required == [
        {"matchExpressions": [{"key": HOST, "operator": "NotIn", "values": ["n1", "n2"]}]}
    ]
    preferred = affinity["nodeAffinity"][PREFERRED]
    assert preferred[0]["weight"] == 100
    assert preferred[0]["preference"]["matchExpressions"][0]["values"] == ["n3"]
    # What keeps placeholders apart stays, and the input is not modified.
    assert (
        steered["spec"]["topologySpreadConstraints"]
        == template["spec"]["topologySpreadConstraints"]
    )
    assert "affinity" not in template["spec"]
    assert relocation.steer(template, {}) is template


def test_drift_keeps_a_relocated_template() -> None:
    pod = marked_pod("tekton-taskrun")
    observed = observed_for(pod)
    group = group_spec(observed.namespace, observed.name, observed.pods)
    assert group is not None
    state = relocation.first(HOST, "n1", "n2", 100.0)
    annotations = {relocation.ANNOTATION_RELOCATIONS: state.encode()}
    steered = relocation.steer(pod_template(group, SETTINGS), annotations)
    sts = existing_set(observed)
    moved = replace(
        sts,
        annotations={
            **sts.annotations,
            **annotations,
            ANNOTATION_TEMPLATE_HASH: template_hash(steered),
        },
    )
    assert drift(moved, group, SETTINGS, None) is None
    # A hand edit of the template hash is put back to the steered template, not the plain one.
    edited = replace(moved, annotations={**moved.annotations, ANNOTATION_TEMPLATE_HASH: "x"})
    patch = drift(edited, group, SETTINGS, None)
    assert patch is not None
    assert patch.patch["spec"]["template"] == template_patch(steered)


def test_placeholder_copies_the_groups_scheduler_name() -> None:
    pod = marked_pod("tekton-taskrun")
    pod["spec"]["schedulerName"] = "volcano"
    group = group_spec("ci", "affinity-assistant-x", [parsed(pod)])
    assert group is not None
    assert pod_template(group, SETTINGS)["spec"]["schedulerName"] == "volcano"
    default = group_spec("ci", "affinity-assistant-x", [parsed(marked_pod("tekton-taskrun"))])
    assert default is not None
    # The default scheduler stays implicit: existing placeholders do not drift on upgrade.
    assert "schedulerName" not in pod_template(default, SETTINGS)["spec"]


def older_and_newer_template() -> tuple[dict[str, Any], dict[str, Any]]:
    """A placeholder's template before and after: the older one has what the newer one
    lacks (an older version's anti-affinity, a tenant label the namespace lost, a
    relocation's node affinity, a nodeSelector key the run's pods no longer ask for)."""
    group = group_spec("ci", "affinity-assistant-x", [parsed(marked_pod("tekton-taskrun"))])
    assert group is not None
    new = pod_template(replace(group, node_selector={"pool": "ab"}), SETTINGS)
    old = relocation.steer(
        pod_template(
            replace(group, tenant="payments", node_selector={"pool": "ab", "disk": "ssd"}),
            SETTINGS,
        ),
        {relocation.ANNOTATION_RELOCATIONS: relocation.first(HOST, "n1", "n2", 1.0).encode()},
    )
    term = {"topologyKey": HOST, "labelSelector": {"matchLabels": {"old": "version"}}}
    old["spec"]["affinity"]["podAntiAffinity"] = {
        PREFERRED: [{"weight": 100, "podAffinityTerm": term}]
    }
    assert old["metadata"]["labels"]["coschedule.dev/tenant"] == "payments"
    return old, new


def test_a_template_patch_removes_what_the_new_template_leaves_out() -> None:
    """Applied as kube-apiserver applies a strategic merge patch over the older template,
    the patch leaves exactly the new one (the e2e suite checks it on kube-apiserver too:
    tests/e2e/test_template_patch.py)."""
    old, new = older_and_newer_template()
    assert strategic_merge_patch(old, template_patch(new)) == new
    # What a JSON merge patch of the same template would have left: the lost key.
    merged = merge_patch(old, new)
    assert merged["spec"]["nodeSelector"] == {"pool": "ab", "disk": "ssd"}
    # And a patch over an equal template changes nothing.
    assert strategic_merge_patch(new, template_patch(new)) == new
