"""Admission pre-flight, rule claims-conflict: a run whose bound volumes cannot share one
topology domain (or that its pod's own node constraints exclude) is refused at once.

The views are the real watch-fed caches (``ClaimCache``, ``VolumeCache``) fed the way
their informers feed them, with PVCs and PVs shaped as the API returns them.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from coschedule.config.settings import Settings
from coschedule.k8s.volumes import volume_topology
from coschedule.kube.client import Credentials, KubeClient
from coschedule.kube.volume_cache import VolumeCache
from coschedule.marks import Mode
from coschedule.mutate import volume_conflict
from coschedule.mutate.decision import AdmissionContext, Decision, decide
from tests.fixtures import load_pod
from tests.mutate.test_claim_rewrite import CLAIM_A, CLAIM_B, NS, cache, deliver, pvc

HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


def pv(name: str, key: str, value: str) -> dict[str, Any]:
    """A PersistentVolume as a local-volume or CSI provisioner makes it."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "resourceVersion": "3"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "local": {"path": "/mnt/disks/ssd1"},
            "claimRef": {"namespace": NS, "name": name.removeprefix("pv-")},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}
                    ]
                }
            },
        },
        "status": {"phase": "Bound"},
    }


def volumes(*pvs: dict[str, Any], synced: bool = True) -> VolumeCache:
    view = VolumeCache(KubeClient(Credentials(server="https://127.0.0.1:1")))
    for obj in pvs:
        transformed = view.informer.transform(copy.deepcopy(obj))
        view.informer.apply("ADDED", transformed)
    if synced:
        view.informer.synced.set()
    return view


def admit(
    pod: dict[str, Any],
    pvs: list[dict[str, Any]],
    *,
    claims: list[dict[str, Any]],
    mode: Mode = Mode.PIPELINERUNS,
    topology_key: str = HOST,
    synced: bool = True,
) -> Decision:
    view = cache()
    for claim in claims:
        deliver(view, claim)
    settings = Settings(mode=mode, topology_key=topology_key)
    return decide(pod, AdmissionContext(settings, NS, None, view, volumes(*pvs, synced=synced)))


TWO_CLAIMS = "tekton-taskrun-two-workspaces"  # mounts CLAIM_A and CLAIM_B


def test_two_node_local_volumes_on_two_nodes_are_refused_naming_both() -> None:
    decision = admit(
        load_pod(TWO_CLAIMS),
        [pv(f"pv-{CLAIM_A}", HOST, "node-1"), pv(f"pv-{CLAIM_B}", HOST, "node-2")],
        claims=[pvc(CLAIM_A, bound=True), pvc(CLAIM_B, bound=True)],
    )
    assert not decision.allowed
    assert decision.rule == volume_conflict.RULE
    message = decision.message or ""
    assert message.startswith("coschedule: rule claims-conflict: ")
    assert f"claim {CLAIM_A} (volume pv-{CLAIM_A}) on node node-1" in message
    assert f"claim {CLAIM_B} (volume pv-{CLAIM_B}) on node node-2" in message
    assert "Fix:" in message


def test_the_runs_other_bound_claim_counts_too() -> None:
    # The pod mounts CLAIM_A only; the run's CLAIM_B (owned by the PipelineRun) is elsewhere.
    decision = admit(
        load_pod("tekton-taskrun"),
        [pv(f"pv-{CLAIM_A}", HOST, "node-1"), pv(f"pv-{CLAIM_B}", HOST, "node-2")],
        claims=[pvc(CLAIM_A, bound=True), pvc(CLAIM_B, bound=True)],
    )
    assert decision.rule == volume_conflict.RULE
    assert "topology key kubernetes.io/hostname" in (decision.message or "")


def test_zonal_volumes_in_one_zone_are_admitted_with_a_zone_topology_key() -> None:
    pvs = [pv(f"pv-{CLAIM_A}", ZONE, "zone-a"), pv(f"pv-{CLAIM_B}", ZONE, "zone-a")]
    claims = [pvc(CLAIM_A, bound=True), pvc(CLAIM_B, bound=True)]
    decision = admit(load_pod(TWO_CLAIMS), pvs, claims=claims, topology_key=ZONE)
    assert decision.allowed, decision.message
    assert decision.placeholder


def test_zonal_volumes_in_two_zones_are_refused() -> None:
    pvs = [pv(f"pv-{CLAIM_A}", ZONE, "zone-a"), pv(f"pv-{CLAIM_B}", ZONE, "zone-b")]
    claims = [pvc(CLAIM_A, bound=True), pvc(CLAIM_B, bound=True)]
    decision = admit(load_pod("tekton-taskrun"), pvs, claims=claims, topology_key=ZONE)
    assert decision.rule == volume_conflict.RULE
    assert "zone zone-a" in (decision.message or "")
    assert "zone zone-b" in (decision.message or "")


def test_node_local_volumes_on_two_nodes_of_a_zone_run_in_that_zone() -> None:
    # Zone topology: two pods of the run, each with its own node's volume, share the zone.
    pvs = [pv(f"pv-{CLAIM_A}", HOST, "node-1"), pv(f"pv-{CLAIM_B}", HOST, "node-2")]
    claims = [pvc(CLAIM_A, bound=True), pvc(CLAIM_B, bound=True)]
    assert admit(load_pod("tekton-taskrun"), pvs, claims=claims, topology_key=ZONE).allowed
    # ... but one pod that mounts both still never fits on one node.
    both = admit(load_pod(TWO_CLAIMS), pvs, claims=claims, topology_key=ZONE)
    assert both.rule == volume_conflict.RULE
    assert "cannot be used on one node" in (both.message or "")


def test_the_pods_node_selector_excluding_the_volumes_node_is_refused() -> None:
    pod = load_pod("tekton-taskrun")
    pod["spec"]["nodeSelector"] = {HOST: "node-9"}
    decision = admit(pod, [pv(f"pv-{CLAIM_A}", HOST, "node-1")], claims=[pvc(CLAIM_A, bound=True)])
    assert decision.rule == volume_conflict.RULE
    assert "nodeSelector kubernetes.io/hostname=node-9" in (decision.message or "")
    assert "node-1" in (decision.message or "")


def test_the_pods_required_node_affinity_excluding_the_zone_is_refused() -> None:
    pod = load_pod("tekton-taskrun")
    pod["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["zone-b"]}]}
                ]
            }
        }
    }
    pvs = [pv(f"pv-{CLAIM_A}", ZONE, "zone-a")]
    decision = admit(pod, pvs, claims=[pvc(CLAIM_A, bound=True)], topology_key=ZONE)
    assert decision.rule == volume_conflict.RULE
    assert "required node affinity" in (decision.message or "")
    allowed = copy.deepcopy(pod)
    terms = allowed["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    terms.append({"matchExpressions": [{"key": ZONE, "operator": "NotIn", "values": ["zone-c"]}]})
    assert admit(allowed, pvs, claims=[pvc(CLAIM_A, bound=True)], topology_key=ZONE).allowed


@pytest.mark.parametrize(
    ("mode", "synced", "bound"),
    [
        (Mode.WORKSPACES, True, True),  # a claim's group: one claim, nothing to compare
        (Mode.PIPELINERUNS, False, True),  # volume cache not synced: never a guess
        (Mode.PIPELINERUNS, True, False),  # unbound claims are provisioned together
    ],
)
def test_not_checked(mode: Mode, synced: bool, bound: bool) -> None:
    pod = load_pod("tekton-taskrun")
    decision = admit(
        pod,
        [pv(f"pv-{CLAIM_A}", HOST, "node-1"), pv(f"pv-{CLAIM_B}", HOST, "node-2")],
        claims=[pvc(CLAIM_A, bound=bound), pvc(CLAIM_B, bound=bound)],
        mode=mode,
        synced=synced,
    )
    assert decision.rule != volume_conflict.RULE


def test_volume_topology_reads_terms_fields_and_legacy_zone_labels() -> None:
    local = volume_topology(pv("pv-x", HOST, "node-1"))
    assert local.pinned(HOST) == frozenset({"node-1"})
    assert local.pinned(ZONE) is None
    assert local.describe() == "node node-1"
    assert local.allows({HOST: "node-1"}, "node-1")
    assert not local.allows({HOST: "node-2"}, "node-2")
    by_field = volume_topology(
        {
            "metadata": {"name": "pv-f"},
            "spec": {
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": ["n3"]}
                                ]
                            }
                        ]
                    }
                }
            },
        }
    )
    assert by_field.pinned(HOST) == frozenset({"n3"})
    assert by_field.allows({}, "n3")
    legacy = volume_topology({"metadata": {"name": "pv-z", "labels": {ZONE: "z1__z2"}}})
    assert legacy.pinned(ZONE) == frozenset({"z1", "z2"})
    assert volume_topology({"metadata": {"name": "pv-any"}}).describe() == "any node"
