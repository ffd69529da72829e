"""Hardening policy: each rule in each mode, the DefaultTolerationSeconds exception, the
empty-key toleration, config errors, and the checks running on the pod as it will be stored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonpatch as reference_jsonpatch
import pytest

from coschedule.config.policy import (
    CONTROL_PLANE,
    HARD_ANTI_AFFINITY_TOPOLOGY,
    RESERVED_TOLERATIONS,
    UNSATISFIABLE_PLACEMENT,
    Finding,
    PolicyMode,
    PolicySettings,
    check_policy,
    parse_policy,
)
from coschedule.config.settings import ConfigError, Settings, parse_settings, read_raw_config
from coschedule.k8s.constants import REQUIRED
from coschedule.marks import Mode
from coschedule.mutate.decision import AdmissionContext, Decision, decide
from coschedule.wire.pod_fields import MalformedPod
from tests.fixtures import DEFAULT_TOLERATIONS, FIXTURE_NAMES, load_pod

OFF, WARN, DENY = PolicyMode.OFF, PolicyMode.WARN, PolicyMode.DENY
ALL_WARN = PolicySettings(WARN, WARN, WARN)
ZONE = "topology.kubernetes.io/zone"
DTS = DEFAULT_TOLERATIONS


def tolerations_findings(*tolerations: dict[str, Any]) -> list[tuple[str, str]]:
    found = check_policy({}, [*DTS, *tolerations], None, ALL_WARN)
    return [(f.rule, f.field) for f in found]


def zone_anti_affinity(namespace_selector: Any = None, topology: str = ZONE) -> dict[str, Any]:
    term: dict[str, Any] = {
        "labelSelector": {"matchLabels": {"app": "db"}},
        "topologyKey": topology,
    }
    if namespace_selector != "absent":
        term["namespaceSelector"] = namespace_selector
    return {"podAntiAffinity": {REQUIRED: [term]}}


def required_node_affinity(*expressions: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            REQUIRED: {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "Exists"}]},
                    {"matchExpressions": list(expressions)},
                ]
            }
        }
    }


def ctx(raw: dict[str, str] | None = None, mode: Mode = Mode.PIPELINERUNS) -> AdmissionContext:
    settings = parse_settings({"coschedule": mode.value, **(raw or {})})
    return AdmissionContext(settings, "ci")


def admit(pod: dict[str, Any], context: AdmissionContext) -> tuple[Decision, dict[str, Any]]:
    decision = decide(pod, context)
    patched = reference_jsonpatch.apply_patch(pod, decision.ops) if decision.ops else pod
    return decision, patched


# ---- config ---------------------------------------------------------------------------------


def test_defaults_warn_warn_deny_deny() -> None:
    assert parse_policy({}) == PolicySettings(WARN, WARN, DENY, DENY)
    assert Settings().policy == PolicySettings(WARN, WARN, DENY, DENY)
    assert parse_settings({}).policy == PolicySettings(WARN, WARN, DENY, DENY)


@pytest.mark.parametrize(
    "rule",
    [
        "reserved-tolerations",
        "control-plane",
        "hard-anti-affinity-topology",
        "unsatisfiable-placement",
    ],
)
@pytest.mark.parametrize("text", ["off", "warn", "deny", " DENY\n"])
def test_every_key_takes_every_mode(rule: str, text: str) -> None:
    policy = parse_settings({f"policy-{rule}": text}).policy
    assert policy.mode(rule) is PolicyMode(text.strip().lower())


@pytest.mark.parametrize(
    "rule",
    [
        "reserved-tolerations",
        "control-plane",
        "hard-anti-affinity-topology",
        "unsatisfiable-placement",
    ],
)
def test_invalid_mode_is_a_config_error_naming_the_key(rule: str) -> None:
    with pytest.raises(ConfigError, match=f"\"policy-{rule}\": 'block' is not a policy mode"):
        parse_settings({f"policy-{rule}": "block"})


def test_unknown_policy_key_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"unknown config key.*policy-typo"):
        parse_settings({"policy-typo": "warn"})


def test_environment_variables_set_policy(tmp_path: Path) -> None:
    raw = read_raw_config(
        tmp_path,
        {
            "COSCHEDULE_POLICY_CONTROL_PLANE": "deny",
            "COSCHEDULE_POLICY_RESERVED_TOLERATIONS": "off",
            "COSCHEDULE_POLICY_HARD_ANTI_AFFINITY_TOPOLOGY": "warn",
        },
    )
    assert parse_settings(raw).policy == PolicySettings(OFF, DENY, WARN)


def test_a_default_that_a_deny_policy_refuses_is_a_config_error() -> None:
    rule = "- tolerations: [{key: node-role.kubernetes.io/control-plane, operator: Exists}]"
    with pytest.raises(ConfigError) as error:
        parse_settings({"scheduling-defaults": rule, "policy-control-plane": "deny"})
    assert "scheduling-defaults" in str(error.value)
    assert "policy-control-plane" in str(error.value)
    # In warn mode the admins may do it: the pods get warnings.
    assert parse_settings({"scheduling-defaults": rule}).scheduling_defaults


# ---- reserved-tolerations -------------------------------------------------------------------


def test_the_default_toleration_seconds_pair_is_exempt() -> None:
    assert tolerations_findings() == []
    # Another duration is still only an eviction delay.
    assert check_policy({}, [{**DTS[0], "tolerationSeconds": 30}, DTS[1]], None, ALL_WARN) == []


@pytest.mark.parametrize(
    "toleration",
    [
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists"},
        {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists"},
        {"key": "node.kubernetes.io/disk-pressure", "operator": "Equal", "value": ""},
        {
            "key": "node.kubernetes.io/out-of-service",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 300,
        },
    ],
)
def test_reserved_taint_tolerations_are_found(toleration: dict[str, Any]) -> None:
    assert tolerations_findings(toleration) == [(RESERVED_TOLERATIONS, "spec.tolerations[2]")]


@pytest.mark.parametrize(
    "toleration",
    [
        {"key": "node.kubernetes.io/unschedulable", "effect": "PreferNoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ci", "effect": "NoSchedule"},
        {"key": "example.com/node.kubernetes.io", "operator": "Exists"},
        {"operator": "Exists", "effect": "PreferNoSchedule"},
    ],
)
def test_other_tolerations_are_not_reserved(toleration: dict[str, Any]) -> None:
    assert tolerations_findings(toleration) == []


def test_empty_key_exists_tolerates_reserved_and_control_plane_taints() -> None:
    assert tolerations_findings({"operator": "Exists"}) == [
        (RESERVED_TOLERATIONS, "spec.tolerations[2]"),
        (CONTROL_PLANE, "spec.tolerations[2]"),
    ]
    # NoExecute: evictions (reserved taints), not the NoSchedule control-plane taint.
    assert tolerations_findings({"operator": "Exists", "effect": "NoExecute"}) == [
        (RESERVED_TOLERATIONS, "spec.tolerations[2]")
    ]
    assert tolerations_findings({"key": "", "operator": "Exists", "effect": "NoSchedule"}) == [
        (RESERVED_TOLERATIONS, "spec.tolerations[2]"),
        (CONTROL_PLANE, "spec.tolerations[2]"),
    ]


# ---- control-plane --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key", ["node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master"]
)
def test_control_plane_node_selector_affinity_and_toleration(key: str) -> None:
    found = check_policy({key: ""}, [], None, ALL_WARN)
    assert [(f.rule, f.field) for f in found] == [(CONTROL_PLANE, f"spec.nodeSelector[{key}]")]
    for operator, values in (("In", [""]), ("Exists", None)):
        expression: dict[str, Any] = {"key": key, "operator": operator}
        if values is not None:
            expression["values"] = values
        found = check_policy({}, [], required_node_affinity(expression), ALL_WARN)
        assert [f.field for f in found] == [
            f"spec.affinity.nodeAffinity.{REQUIRED}.nodeSelectorTerms[1].matchExpressions[0]"
        ]
    assert tolerations_findings({"key": key, "operator": "Exists", "effect": "NoSchedule"}) == [
        (CONTROL_PLANE, "spec.tolerations[2]")
    ]


def test_control_plane_avoidance_and_soft_preferences_are_fine() -> None:
    key = "node-role.kubernetes.io/control-plane"
    affinity = required_node_affinity(
        {"key": key, "operator": "DoesNotExist"},
        {"key": "node-role.kubernetes.io/master", "operator": "NotIn", "values": [""]},
    )
    affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] = [
        {"weight": 1, "preference": {"matchExpressions": [{"key": key, "operator": "Exists"}]}}
    ]
    affinity["nodeAffinity"][REQUIRED]["nodeSelectorTerms"].append(
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["cp-1"]}]}
    )
    assert check_policy({"node-role": "worker"}, [], affinity, ALL_WARN) == []
    assert tolerations_findings({"key": key, "effect": "PreferNoSchedule"}) == []


# ---- hard-anti-affinity-topology ------------------------------------------------------------


def test_all_namespace_hard_anti_affinity_on_a_zone_is_found() -> None:
    selectors: list[dict[str, Any]] = [{}, {"matchLabels": {}, "matchExpressions": []}]
    for selector in selectors:
        found = check_policy({}, [], zone_anti_affinity(selector), ALL_WARN)
        assert [(f.rule, f.field) for f in found] == [
            (HARD_ANTI_AFFINITY_TOPOLOGY, f"spec.affinity.podAntiAffinity.{REQUIRED}[0]")
        ]
        assert "kubernetes.io/hostname" in found[0].message
        assert ZONE in found[0].message


@pytest.mark.parametrize(
    "affinity",
    [
        zone_anti_affinity({}, topology="kubernetes.io/hostname"),
        zone_anti_affinity("absent"),
        zone_anti_affinity(None),  # null: the pod's own namespace
        zone_anti_affinity({"matchLabels": {"team": "db"}}),
        zone_anti_affinity({"matchExpressions": [{"key": "t", "operator": "Exists"}]}),
        {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 1,
                        "podAffinityTerm": zone_anti_affinity({})["podAntiAffinity"][REQUIRED][0],
                    }
                ]
            }
        },
        # A pod *affinity* term (like the placeholder term coschedule injects) is not checked.
        {"podAffinity": {REQUIRED: zone_anti_affinity({})["podAntiAffinity"][REQUIRED]}},
    ],
)
def test_scoped_or_soft_anti_affinity_is_fine(affinity: dict[str, Any]) -> None:
    assert check_policy({}, [], affinity, ALL_WARN) == []


# ---- modes, in decide() ---------------------------------------------------------------------

UNSCHEDULABLE = {
    "key": "node.kubernetes.io/unschedulable",
    "operator": "Exists",
    "effect": "NoSchedule",
}
CASES: list[tuple[str, str, Any]] = [
    (
        RESERVED_TOLERATIONS,
        "spec.tolerations[2]",
        lambda pod: pod["spec"]["tolerations"].append(UNSCHEDULABLE),
    ),
    (
        CONTROL_PLANE,
        "spec.nodeSelector[node-role.kubernetes.io/control-plane]",
        lambda pod: pod["spec"].update(nodeSelector={"node-role.kubernetes.io/control-plane": ""}),
    ),
    (
        HARD_ANTI_AFFINITY_TOPOLOGY,
        f"spec.affinity.podAntiAffinity.{REQUIRED}[0]",
        lambda pod: pod["spec"].update(affinity=zone_anti_affinity({})),
    ),
    (
        UNSATISFIABLE_PLACEMENT,
        f"spec.affinity.nodeAffinity.{REQUIRED}",
        lambda pod: pod["spec"].update(
            nodeSelector={"pool": "a"},
            affinity={
                "nodeAffinity": {
                    REQUIRED: {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "pool", "operator": "In", "values": ["b"]}
                                ]
                            }
                        ]
                    }
                }
            },
        ),
    ),
]


@pytest.mark.parametrize(("rule", "field", "mutate"), CASES)
@pytest.mark.parametrize("mode", list(PolicyMode))
def test_each_rule_in_each_mode(rule: str, field: str, mutate: Any, mode: PolicyMode) -> None:
    pod = load_pod("tekton-taskrun")
    mutate(pod)
    decision, _ = admit(pod, ctx({f"policy-{rule}": mode.value}))
    if mode is OFF:
        assert decision.allowed
        assert decision.warnings == []
        assert decision.findings == []
    elif mode is WARN:
        assert decision.allowed
        assert decision.ops, "the pod is still coscheduled"
        (warning,) = decision.warnings
        assert warning.startswith(f"coschedule: policy {rule}: ")
        assert len(warning) <= 120
        assert [(f.rule, f.field) for f in decision.findings] == [(rule, field)]
    else:
        assert not decision.allowed
        assert decision.rule == f"policy-{rule}"
        assert decision.ops == []
        message = decision.message or ""
        assert message.startswith(f"coschedule: rule policy-{rule}: {field}")
        assert "Fix:" in message


@pytest.mark.parametrize("name", FIXTURE_NAMES)
@pytest.mark.parametrize("mode", list(Mode))
def test_realistic_pods_trip_nothing(name: str, mode: Mode) -> None:
    pod = load_pod(name)
    decision = decide(pod, ctx(mode=mode))
    assert decision.findings == []
    assert not [w for w in decision.warnings if "policy" in w]


def test_only_the_first_deny_counts_and_warnings_accumulate() -> None:
    pod = load_pod("tekton-taskrun")
    pod["spec"]["tolerations"] += [
        UNSCHEDULABLE,
        {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists"},
    ]
    pod["spec"]["nodeSelector"] = {"node-role.kubernetes.io/master": ""}
    pod["spec"]["affinity"] = zone_anti_affinity({})
    decision = decide(
        pod,
        ctx({"policy-control-plane": "deny", "policy-hard-anti-affinity-topology": "deny"}),
    )
    assert decision.rule == "policy-control-plane"  # rule order: the first deny
    assert len(decision.warnings) == 2  # both reserved tolerations
    assert [f.mode for f in decision.findings] == [WARN, WARN, DENY, DENY]


def test_checks_see_the_merged_defaults() -> None:
    defaults = "- tolerations: [{key: node.kubernetes.io/unschedulable, operator: Exists}]"
    decision, patched = admit(load_pod("tekton-taskrun"), ctx({"scheduling-defaults": defaults}))
    assert decision.allowed
    assert patched["spec"]["tolerations"][2]["key"] == "node.kubernetes.io/unschedulable"
    assert decision.warnings == [
        "coschedule: policy reserved-tolerations: spec.tolerations[2] tolerates "
        "node.kubernetes.io/unschedulable: remove it"
    ]


def test_a_pod_own_toleration_wins_over_a_default_and_is_what_is_checked() -> None:
    pod = load_pod("tekton-taskrun")
    pod["spec"]["tolerations"].append({"key": "example.com/cp", "operator": "Exists"})
    defaults = "- tolerations: [{key: example.com/cp, operator: Exists}, {operator: Exists}]"
    decision = decide(pod, ctx({"scheduling-defaults": defaults}))
    # The rule's wildcard was added (a key of its own) and is what fires.
    assert {f.field for f in decision.findings} == {"spec.tolerations[3]"}


@pytest.mark.parametrize("mode", [Mode.PIPELINERUNS, Mode.ISOLATE_PIPELINERUN, Mode.WORKSPACES])
def test_our_own_injected_term_never_trips_a_rule(mode: Mode) -> None:
    settings = parse_settings(
        {
            "coschedule": mode.value,
            "topology-key": ZONE,
            "policy-reserved-tolerations": "deny",
            "policy-control-plane": "deny",
        }
    )
    decision, patched = admit(load_pod("tekton-taskrun"), AdmissionContext(settings, "ci"))
    assert decision.allowed, decision.message
    assert patched["spec"]["affinity"]["podAffinity"][REQUIRED][0]["topologyKey"] == ZONE
    # Checking the stored pod itself (with our term) finds nothing either.
    stored = patched["spec"]
    assert check_policy({}, stored["tolerations"], stored["affinity"], settings.policy) == []


def test_policy_applies_when_coscheduling_is_off_for_the_pod() -> None:
    # A pod in no run, and a run in a cluster whose coscheduling is disabled.
    for pod, context in (
        (load_pod("deployment-pod"), ctx()),
        (load_pod("tekton-taskrun"), ctx(mode=Mode.DISABLED)),
    ):
        pod["spec"]["tolerations"].append(UNSCHEDULABLE)
        decision = decide(pod, context)
        assert decision.placeholder is None
        assert len(decision.warnings) == 1
        assert "reserved-tolerations" in decision.warnings[0]
    pod = load_pod("tekton-taskrun")
    pod["spec"]["affinity"] = zone_anti_affinity({})
    assert not decide(pod, ctx(mode=Mode.DISABLED)).allowed


def test_pod_that_opted_out_with_its_label_is_not_checked() -> None:
    pod = load_pod("tekton-taskrun")
    pod["metadata"]["labels"]["coschedule.dev/mode"] = "disabled"
    pod["spec"]["affinity"] = zone_anti_affinity({})
    decision = decide(pod, ctx())
    assert decision.allowed
    assert decision.ops == []
    assert decision.warnings == []


def test_placeholder_pods_are_not_checked() -> None:
    pod = load_pod("placeholder-pod")
    pod["spec"]["affinity"] = zone_anti_affinity({})
    assert decide(pod, ctx()).allowed


def test_malformed_affinity_is_a_clear_error() -> None:
    pod = load_pod("deployment-pod")
    pod["spec"]["affinity"] = {"podAntiAffinity": {REQUIRED: ["x"]}}
    with pytest.raises(MalformedPod, match="podAntiAffinity"):
        decide(pod, ctx())
    pod["spec"]["affinity"] = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": {}}}}
    with pytest.raises(MalformedPod, match="nodeSelectorTerms must be an array"):
        decide(pod, ctx())


def test_finding_warning_is_capped() -> None:
    long_key = "node.kubernetes.io/" + "x" * 300
    finding: Finding = check_policy({}, [{"key": long_key}], None, ALL_WARN)[0]
    assert len(finding.warning) == 256
    assert finding.warning.endswith("…")


# ---- unsatisfiable-placement ----------------------------------------------------------------


def _pool_terms(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": list(t)} for t in terms]}
        }
    }


def _pool(operator: str, *values: str) -> dict[str, Any]:
    found: dict[str, Any] = {"key": "pool", "operator": operator}
    if values:
        found["values"] = list(values)
    return found


@pytest.mark.parametrize(
    ("selector", "affinity", "why"),
    [
        (
            {"pool": "a"},
            _pool_terms([_pool("In", "b")]),
            "term 0 asks pool In [b] and nodeSelector pool=a",
        ),
        (
            {},
            _pool_terms([_pool("Exists"), _pool("DoesNotExist")]),
            "term 0 asks pool Exists and pool DoesNotExist",
        ),
        (
            {"pool": "a"},
            _pool_terms([_pool("NotIn", "a")], [_pool("In", "b", "c")]),
            "term 0 asks pool NotIn [a] and nodeSelector pool=a; "
            "term 1 asks pool In [b, c] and nodeSelector pool=a",
        ),
    ],
)
def test_a_pod_no_node_can_take_is_denied_naming_each_term(
    selector: dict[str, str], affinity: dict[str, Any], why: str
) -> None:
    pod = load_pod("tekton-taskrun")
    pod["spec"]["nodeSelector"] = selector
    pod["spec"]["affinity"] = affinity
    decision, _ = admit(pod, ctx())
    assert not decision.allowed
    assert decision.rule == "policy-unsatisfiable-placement"
    assert why in (decision.message or "")
    assert "Fix: make the nodeSelector and every node-affinity term agree" in (
        decision.message or ""
    )


@pytest.mark.parametrize(
    ("selector", "affinity"),
    [
        ({"pool": "a"}, _pool_terms([_pool("In", "a", "b")])),
        ({"pool": "a"}, _pool_terms([_pool("In", "b")], [_pool("Exists")])),  # term 1 allows it
        ({}, _pool_terms([_pool("NotIn", "a"), _pool("NotIn", "b")])),
        ({"pool": "a"}, {"podAntiAffinity": {}}),  # no node affinity at all
    ],
)
def test_a_pod_some_node_can_take_is_admitted(
    selector: dict[str, str], affinity: dict[str, Any]
) -> None:
    pod = load_pod("tekton-taskrun")
    pod["spec"]["nodeSelector"] = selector
    pod["spec"]["affinity"] = affinity
    decision, _ = admit(pod, ctx())
    assert decision.allowed, decision.message
    assert not [f for f in decision.findings if f.rule == UNSATISFIABLE_PLACEMENT]


def test_the_check_sees_the_nodeselector_a_scheduling_default_adds() -> None:
    rules = '[{"namespaces": ["ci"], "nodeSelector": {"pool": "a"}}]'
    pod = load_pod("tekton-taskrun")
    pod["spec"]["affinity"] = _pool_terms([_pool("In", "b")])
    decision, _ = admit(pod, ctx({"scheduling-defaults": rules}))
    assert decision.rule == "policy-unsatisfiable-placement"
