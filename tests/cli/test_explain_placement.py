"""``coschedule explain`` shows how a pod is tied to its placeholder (the ``placement`` key):
offline no placeholder is bound, so a Tekton pod placed by node name is gated;
``--placeholder-node`` explains it as if the placeholder were bound there."""

from __future__ import annotations

import json

from coschedule.cli.explain import explain, render_text
from coschedule.config.settings import Settings
from coschedule.marks import GATE_PLACEHOLDER, Mode, Placement
from tests.fixtures import load_pod, pod_path
from tests.test_cli import run

SETTINGS = Settings(mode=Mode.PIPELINERUNS)


def test_offline_a_taskrun_pod_placed_by_node_name_is_gated() -> None:
    decision, report = explain(load_pod("tekton-taskrun"), SETTINGS, placement=Placement.AUTO)
    assert decision.allowed
    assert report["placement"] == {"by": "node-name", "gated": True, "node": None}
    assert report["schedulingGates"] == [{"name": GATE_PLACEHOLDER}]
    assert report["affinity"] is None  # no pod-affinity term, no pin
    text = render_text(report)
    assert f"placement:   by node name: held behind the {GATE_PLACEHOLDER}" in text
    assert f"resulting scheduling gates:\n  - {GATE_PLACEHOLDER}" in text


def test_as_if_the_placeholder_were_bound_the_pod_is_pinned_there() -> None:
    _, report = explain(
        load_pod("tekton-taskrun"), SETTINGS, placement=Placement.AUTO, placeholder_node="node-7"
    )
    assert report["placement"] == {"by": "node-name", "gated": False, "node": "node-7"}
    [term] = report["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": ["node-7"]}]
    assert "schedulingGates" not in report
    assert any("bound to 'node-7'" in reason for reason in report["reasons"])
    assert "placement:   by node name: pinned to node-7" in render_text(report)


def test_pod_affinity_placements_say_so_and_why() -> None:
    # Placement pod-affinity; and under auto (the default), an Argo pod (its step fails if
    # deleted).
    _, chosen = explain(
        load_pod("tekton-taskrun"),
        SETTINGS,
        placement=Placement.POD_AFFINITY,
        placeholder_node="node-7",
    )
    _, argo = explain(load_pod("argo-workflow-pod"), SETTINGS)
    for report in (chosen, argo):
        assert report["placement"] == {"by": "pod-affinity", "gated": False, "node": None}
        assert report["affinity"]["podAffinity"]
        assert "placement:   pod affinity" in render_text(report)
    assert any("does not recreate a deleted pod" in r for r in argo["reasons"])
    # A pod that is not placed at all (not in a run) has no placement.
    _, alone = explain(load_pod("deployment-pod"), SETTINGS, placement=Placement.AUTO)
    assert "placement" not in alone
    assert "placement:" not in render_text(alone)


def test_the_command_takes_placement_and_placeholder_node() -> None:
    args = ("explain", "-f", str(pod_path("tekton-taskrun")), "--mode", "pipelineruns")
    result = run(*args, "--placement", "auto", "--placeholder-node", "node-7", "-o", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["placement"]["node"] == "node-7"
    # From the config folder's key, as serve reads it.
    env = {"COSCHEDULE_PLACEMENT": "auto"}
    result = run(*args, "-o", "json", env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["placement"]["gated"] is True
    refused = run(*args, "--placement", "node-name")
    assert refused.returncode == 2
    assert "--placement 'node-name' is not one of auto, pod-affinity" in refused.stderr
