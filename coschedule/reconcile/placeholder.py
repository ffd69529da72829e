"""The placeholder StatefulSet, built from a group's pods and the settings. Pure.

The pod template's hash is stored in an annotation: the apiserver defaults many template
fields, so comparing templates field by field would see a difference on every reconcile;
comparing the hash of what we asked for does not, and still notices when we want a change.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from coschedule import marks
from coschedule.config.settings import Settings
from coschedule.k8s.constants import REQUIRED
from coschedule.k8s.node_constraints import NodeConstraints
from coschedule.marks import (
    ANNOTATION_CLAIMS,
    ANNOTATION_MODE,
    ANNOTATION_RUN,
    ANNOTATION_RUN_LABEL,
    COMPONENT_AFFINITY_ASSISTANT,
    LABEL_COMPONENT,
    LABEL_TENANT,
    ClaimTemplate,
    IsolationScope,
    Mode,
)
from coschedule.placement import anti_affinity
from coschedule.reconcile import relocation
from coschedule.reconcile.model import MarkedPod, Obj, OwnerRef

ANNOTATION_TEMPLATE_HASH = "coschedule.dev/template-hash"
CONTAINER_NAME = "affinity-assistant"
RUN_AS_USER = 65532  # the distroless "nonroot" user; pause runs as anyone
TEMPLATE_MOUNT_ROOT = "/claim-templates"
UPDATE_STRATEGY = "OnDelete"
# A strategic merge patch's directive: ``{"$patch": "replace", ...}`` replaces the map whole.
PATCH_DIRECTIVE = "$patch"
DEFAULT_SCHEDULER = "default-scheduler"


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """What the group's pods say the placeholder must look like."""

    namespace: str
    name: str
    mode: Mode
    run: str
    topology_key: str
    claims: tuple[str, ...]
    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...]
    scheduler_name: str = ""
    # isolate-pipelinerun's reach, and the tenant of the namespace ("" when none).
    scope: IsolationScope = IsolationScope.NAMESPACE
    tenant: str = ""
    # The meet of the required node-affinity terms of its pods (None: none requires any).
    node_terms: tuple[Mapping[str, Any], ...] | None = None
    # Pods whose node constraints leave no node in common with the earlier pods' (or none
    # at all): they cannot follow the placeholder, which is built without them.
    excluded: tuple[str, ...] = ()
    # Which group label gave ``run`` (tekton.dev/pipelineRun: a PipelineRun's name).
    run_label: str = ""


def first_pod(pods: Sequence[MarkedPod]) -> MarkedPod:
    """Deterministic: the oldest pod, ties broken by name."""
    return min(pods, key=lambda p: (p.created, p.name))


def group_spec(
    namespace: str, name: str, pods: Sequence[MarkedPod], kept: Sequence[str] = ()
) -> GroupSpec | None:
    """The placeholder ``pods`` need. ``kept``: claims a run's placeholder already mounts
    that no pod of ``pods`` names now (``Observed.claims_kept``); a run keeps them."""
    if not pods:
        return None
    first = first_pod(pods)
    where, excluded = run_constraints(pods)
    if first.marks.mode is Mode.WORKSPACES:
        claims = first.marks.claims[:1]
    else:
        # Every claim any pod of the run mounts; sorted so the volume list never reorders.
        claims = tuple(sorted({*kept, *(claim for pod in pods for claim in pod.marks.claims)}))
    return GroupSpec(
        namespace=namespace,
        name=name,
        mode=first.marks.mode,
        run=first.marks.run,
        topology_key=first.marks.topology_key,
        claims=claims,
        node_selector=dict(where.node_selector),
        tolerations=tuple(where.tolerations),
        scheduler_name=first.scheduler_name,
        scope=first.marks.scope,
        tenant=first.marks.tenant,
        node_terms=where.terms,
        excluded=excluded,
        run_label=first.marks.run_label,
    )


def run_constraints(pods: Sequence[MarkedPod]) -> tuple[NodeConstraints, tuple[str, ...]]:
    """Where every pod of the group may go (the meet of their constraints, oldest pod
    first), and the pods left out: one whose own constraints allow no node, or none that
    the earlier pods allow (it could never join them). With every pod left out, the oldest
    pod's constraints as they are: the run cannot run anywhere, and says so."""
    ordered = sorted(pods, key=lambda p: (p.created, p.name))
    found: NodeConstraints | None = None
    excluded: list[str] = []
    for pod in ordered:
        own = pod.constraints()
        met = own if found is None else found.meet(own)
        if met is None or not met.satisfiable():
            excluded.append(pod.name)
            continue
        found = met
    return (found or ordered[0].constraints()), tuple(excluded)


def _keep_apart(group: GroupSpec, spec: Obj) -> None:
    """How placeholders keep apart. An isolated run's: a required anti-affinity, one run
    per node within its scope. Every other: a ``ScheduleAnyway`` topology spread constraint
    over the placeholders of its namespace (a placeholder requests almost nothing; without
    it the scheduler stacks a burst of them on a few nodes, where the runs' pods no longer
    fit). It spreads runs as a preferred anti-affinity does at half kube-scheduler's cost
    per placeholder, and unlike an anti-affinity term, plain pods' scoring never walks it
    (docs/benchmarks.md, issue 20)."""
    if group.mode is Mode.ISOLATE_PIPELINERUN:
        spec["affinity"] = {
            "podAntiAffinity": {
                REQUIRED: anti_affinity.required_terms(
                    group.scope, group.tenant, group.topology_key
                )
            }
        }
        return
    spec["topologySpreadConstraints"] = [
        {
            "maxSkew": 1,
            "topologyKey": group.topology_key,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {LABEL_COMPONENT: COMPONENT_AFFINITY_ASSISTANT}},
        }
    ]


def pod_template(
    group: GroupSpec, settings: Settings, claim_templates: Sequence[ClaimTemplate] = ()
) -> Obj:
    container: Obj = {
        "name": CONTAINER_NAME,
        "image": settings.placeholder_image,
        "resources": {k: dict(v) for k, v in settings.placeholder_resources.items()},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if claim_templates:
        container["volumeMounts"] = [
            {"name": t.name, "mountPath": f"{TEMPLATE_MOUNT_ROOT}/{t.name}"}
            for t in claim_templates
        ]
    spec: Obj = {
        "containers": [container],
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 1,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    _keep_apart(group, spec)
    if settings.placeholder_priority_class:
        spec["priorityClassName"] = settings.placeholder_priority_class
    if group.node_selector:
        spec["nodeSelector"] = dict(group.node_selector)
    if group.tolerations:
        spec["tolerations"] = [dict(t) for t in group.tolerations]
    node_affinity = NodeConstraints(group.node_selector, group.node_terms).affinity()
    if node_affinity is not None:
        spec.setdefault("affinity", {})["nodeAffinity"] = node_affinity
    # The group's scheduler places the placeholder too: one scheduler sees the run's pods
    # and their pin. The default one is left implicit so existing templates do not drift.
    if group.scheduler_name and group.scheduler_name != DEFAULT_SCHEDULER:
        spec["schedulerName"] = group.scheduler_name
    # Claims our own volumeClaimTemplates make are mounted through the templates.
    made = {marks.placeholder_claim(t.name, group.name) for t in claim_templates}
    plain = [claim for claim in group.claims if claim not in made]
    if plain:
        spec["volumes"] = [
            {"name": f"claim-{index}", "persistentVolumeClaim": {"claimName": claim}}
            for index, claim in enumerate(plain)
        ]
    labels = marks.placeholder_labels(group.name)
    if group.tenant:  # what other tenants' placeholders repel (scope tenant)
        labels[LABEL_TENANT] = group.tenant
    return {"metadata": {"labels": labels}, "spec": spec}


def template_hash(template: Obj) -> str:
    # The pod template only: volumeClaimTemplates are immutable, decided once at creation.
    return hashlib.sha256(orjson.dumps(template, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def set_annotations(group: GroupSpec, digest: str) -> dict[str, str]:
    result = {
        ANNOTATION_MODE: group.mode.value,
        ANNOTATION_CLAIMS: ",".join(group.claims),
        ANNOTATION_TEMPLATE_HASH: digest,
    }
    if group.mode.per_run:  # a claim's group may hold pods of many runs
        result[ANNOTATION_RUN] = group.run
        # With the run, what kind of run it is: a new leader that finds the StatefulSet
        # without an owner and without pods can tell whether it is a PipelineRun's.
        if group.run_label:
            result[ANNOTATION_RUN_LABEL] = group.run_label
    return result


def steered_template(
    group: GroupSpec,
    settings: Settings,
    claim_templates: Sequence[ClaimTemplate],
    annotations: Mapping[str, str],
) -> tuple[Obj, dict[str, str]]:
    """The one rule for a placeholder's pod template and its hash (creation, drift and
    relocation alike): built from the group, steered by the relocations in ``annotations``;
    with the StatefulSet annotations that record it."""
    template = relocation.steer(pod_template(group, settings, claim_templates), annotations)
    return template, set_annotations(group, template_hash(template))


def template_patch(template: Obj) -> Obj:
    """``template`` as the strategic merge patch that makes a StatefulSet's pod template be
    it, whole: ``$patch: replace`` drops whatever an older template held that this one does
    not (an upgrade's traded anti-affinity, a tenant label the namespace lost, a smaller
    nodeSelector's keys), where a merge would keep it."""
    return {PATCH_DIRECTIVE: "replace", **template}


def build_statefulset(
    group: GroupSpec,
    settings: Settings,
    owner: OwnerRef | None = None,
    claim_templates: Sequence[ClaimTemplate] = (),
) -> Obj:
    """The whole StatefulSet to create for ``group``."""
    template, annotations = steered_template(group, settings, claim_templates, {})
    metadata: Obj = {
        "name": group.name,
        "namespace": group.namespace,
        "labels": marks.placeholder_labels(group.name),
        "annotations": annotations,
    }
    if owner is not None:
        metadata["ownerReferences"] = [owner.as_owner_reference()]
    spec: Obj = {
        "replicas": 1,
        "podManagementPolicy": "Parallel",
        # A template change (new claims, a new image) must not restart a placeholder under
        # a live run: it would be rescheduled, maybe away from the run's volumes. It takes
        # effect when the pod is next recreated, e.g. moved off a cordoned node.
        "updateStrategy": {"type": UPDATE_STRATEGY},
        # No Service object needs to exist; the field is required.
        "serviceName": group.name,
        "selector": {"matchLabels": marks.placeholder_selector(group.name)},
        "template": template,
    }
    if claim_templates:
        spec["volumeClaimTemplates"] = [_claim_template(t, owner) for t in claim_templates]
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": metadata, "spec": spec}


def _claim_template(template: ClaimTemplate, owner: OwnerRef | None) -> Obj:
    """A volumeClaimTemplate. The StatefulSet controller copies its metadata into the claim
    it makes, so the run's owner there makes deleting the run delete the claim (as with the
    engine's own claims) even if the StatefulSet went first; and unlike
    ``persistentVolumeClaimRetentionPolicy: Delete``, a StatefulSet deleted by hand mid-run
    does not take the run's data with it: the recreated one adopts the same claim."""
    metadata = marks.template_metadata(template)
    if owner is not None:
        metadata["ownerReferences"] = [owner.as_owner_reference()]
    return {"metadata": metadata, "spec": dict(template.spec)}
