"""``decide`` skips the scheduling-defaults and policy steps for a pod neither can act on
(``defaults_and_policy.nothing_to_flag``): the answer must be the one the full steps give,
for every pod.

Each case is decided twice, with the shortcut and with it turned off, and the two outcomes
(allowed, ops, warnings, rule, message, findings, reasons, or the MalformedPod message) must
be equal. The pods are the fixtures and generated specs whose affinity, nodeSelector and
tolerations take the shapes the rules care about, malformed ones included.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coschedule.config.policy import CONTROL_PLANE_KEYS, EVICTION_DELAY_KEYS, POLICY_KEYS
from coschedule.config.settings import parse_settings
from coschedule.mutate import decision as decision_mod
from coschedule.mutate.decision import AdmissionContext, decide
from coschedule.mutate.defaults_and_policy import nothing_to_flag
from coschedule.wire.pod_fields import MalformedPod
from tests.fixtures import FIXTURE_NAMES, load_pod

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
DEFAULTS = "- namespaces: [ci]\n  nodeSelector: {kubernetes.io/arch: arm64}\n"

KEYS = [
    *sorted(EVICTION_DELAY_KEYS),
    *CONTROL_PLANE_KEYS,
    "node.kubernetes.io/unschedulable",
    "node.kubernetes.io/disk-pressure",
    "team",
    "",
]
TOLERATION = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "key": st.one_of(st.sampled_from(KEYS), st.integers(0, 3)),
            "operator": st.sampled_from(["Exists", "Equal"]),
            "effect": st.one_of(
                st.sampled_from(["NoExecute", "NoSchedule", "PreferNoSchedule", ""]),
                st.integers(0, 1),
            ),
            "tolerationSeconds": st.one_of(st.integers(0, 600), st.booleans(), st.just("300")),
            "value": st.sampled_from(["", "true"]),
        },
    ),
    st.integers(0, 1),
    st.none(),
)
# Near misses of the exemption: the key is right, the effect or the seconds may not be.
EVICTION_TOLERATION = st.fixed_dictionaries(
    {"key": st.sampled_from(sorted(EVICTION_DELAY_KEYS))},
    optional={
        "operator": st.just("Exists"),
        "effect": st.sampled_from(["NoExecute", "NoSchedule", ""]),
        "tolerationSeconds": st.one_of(st.integers(0, 600), st.booleans(), st.just("300")),
    },
)
# The DefaultTolerationSeconds pair, as kube-apiserver adds it to every pod.
DEFAULT_TOLERATIONS = [
    {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
    for key in sorted(EVICTION_DELAY_KEYS)
]
TOLERATIONS = st.one_of(
    st.just(DEFAULT_TOLERATIONS),
    st.lists(TOLERATION, max_size=4),
    st.lists(EVICTION_TOLERATION, min_size=1, max_size=3),
    st.builds(lambda extra: [*DEFAULT_TOLERATIONS, *extra], st.lists(TOLERATION, max_size=2)),
    st.none(),
    st.just("not a list"),
)
NODE_SELECTOR = st.one_of(
    st.dictionaries(
        st.sampled_from([*CONTROL_PLANE_KEYS, "kubernetes.io/arch", "pool"]),
        st.one_of(st.just(""), st.just("ci"), st.integers(0, 1)),
        max_size=3,
    ),
    st.none(),
    st.just(["not", "an", "object"]),
)
ANTI_TERM = st.fixed_dictionaries(
    {"topologyKey": st.sampled_from(["kubernetes.io/hostname", "topology.kubernetes.io/zone"])},
    optional={"namespaceSelector": st.sampled_from([{}, {"matchLabels": {"a": "b"}}])},
)
AFFINITY = st.one_of(
    st.none(),
    st.just({}),
    st.just("not an object"),
    st.builds(
        lambda terms: {"podAntiAffinity": {REQUIRED: terms}}, st.lists(ANTI_TERM, max_size=2)
    ),
    st.sampled_from(CONTROL_PLANE_KEYS).map(
        lambda key: {
            "nodeAffinity": {
                REQUIRED: {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": key, "operator": "Exists"}]}
                    ]
                }
            }
        }
    ),
)
POLICY = st.fixed_dictionaries(
    {key: st.sampled_from(["off", "warn", "deny"]) for key in POLICY_KEYS}
)
ABSENT = object()


def outcome(pod: dict[str, Any], ctx: AdmissionContext) -> tuple[Any, ...]:
    try:
        d = decide(copy.deepcopy(pod), ctx)
    except MalformedPod as exc:
        return ("malformed", str(exc))
    return (d.allowed, d.ops, d.warnings, d.rule, d.message, d.findings, d.reasons)


def both(
    pod: dict[str, Any], ctx: AdmissionContext, monkeypatch: pytest.MonkeyPatch
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    short = outcome(pod, ctx)
    with monkeypatch.context() as patch:
        patch.setattr(decision_mod, "nothing_to_flag", lambda _spec: False)
        full = outcome(pod, ctx)
    return short, full


def context(policy: dict[str, str], defaults: bool, mode: str) -> AdmissionContext:
    raw = {"coschedule": mode, **policy}
    if defaults:
        raw["scheduling-defaults"] = DEFAULTS
    return AdmissionContext(parse_settings(raw), "ci")


def with_spec(pod: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    spec = pod.setdefault("spec", {})
    for key, value in fields.items():
        if value is ABSENT:
            spec.pop(key, None)
        else:
            spec[key] = value
    return pod


@pytest.mark.parametrize("name", FIXTURE_NAMES)
@pytest.mark.parametrize("mode", ["pipelineruns", "workspaces", "disabled"])
def test_every_fixture_answers_as_the_full_steps(
    name: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = context({}, defaults=False, mode=mode)
    short, full = both(load_pod(name), ctx, monkeypatch)
    assert short == full


def test_the_pods_engines_make_take_the_shortcut() -> None:
    """The point of it: a Tekton TaskRun pod as kube-apiserver sends it is one."""
    pod = load_pod("tekton-taskrun")
    assert pod["spec"]["tolerations"] == DEFAULT_TOLERATIONS
    assert nothing_to_flag(pod["spec"])
    assert not nothing_to_flag({**pod["spec"], "affinity": {}})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tolerations=st.one_of(st.just(ABSENT), TOLERATIONS),
    node_selector=st.one_of(st.just(ABSENT), NODE_SELECTOR),
    affinity=st.one_of(st.just(ABSENT), AFFINITY),
    policy=POLICY,
    defaults=st.booleans(),
    name=st.sampled_from(["tekton-taskrun", "argo-workflow-pod", "bare-pod-no-labels"]),
)
def test_generated_specs_answer_as_the_full_steps(
    tolerations: Any,
    node_selector: Any,
    affinity: Any,
    policy: dict[str, str],
    defaults: bool,
    name: str,
) -> None:
    pod = with_spec(
        load_pod(name),
        {"tolerations": tolerations, "nodeSelector": node_selector, "affinity": affinity},
    )
    ctx = context(policy, defaults, "pipelineruns")
    with pytest.MonkeyPatch.context() as monkeypatch:
        short, full = both(pod, ctx, monkeypatch)
    assert short == full
