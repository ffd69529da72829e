"""Controls select runs by the labels users see on them: those the engine's controller adds
after admission (Tekton's ``tekton.dev/pipeline``, Argo's template labels) count, at
admission and in the reconciler alike."""

from __future__ import annotations

from typing import Any

import pytest

from coschedule.concurrency.admission import Outcome, admit_run
from coschedule.concurrency.control import parse_control
from coschedule.concurrency.runs import engine_labels, parse_run, run_labels
from coschedule.engines import Kind
from coschedule.reconcile.concurrency import slim_run
from tests.concurrency.runs import control, pipeline_run, workflow

Obj = dict[str, Any]

# The README's example, as written.
README_CONTROL = parse_control(
    control(
        "ci-per-branch",
        {
            "selector": {"matchLabels": {"tekton.dev/pipeline": "build-and-test"}},
            "kinds": ["PipelineRun"],
            "key": "$(params.branch)",
            "strategy": "GracefullyCancel",
        },
    )
)


def triggered(name: str = "pr-1", **spec: Any) -> Obj:
    """A PipelineRun as Triggers or Pipelines-as-Code create it: no tekton.dev/pipeline
    label (Tekton adds it on its first reconcile)."""
    run = pipeline_run(name, params={"branch": "fix/readme"})
    del run["metadata"]["labels"]["tekton.dev/pipeline"]
    if spec:
        run["spec"].pop("pipelineRef")
        run["spec"].update(spec)
    return run


def test_a_pipeline_ref_run_matches_the_readme_control_at_admission() -> None:
    run = triggered()
    assert "tekton.dev/pipeline" not in run["metadata"]["labels"]
    decision = admit_run(Kind.PIPELINE_RUN, run, "ci", [README_CONTROL])
    assert decision.outcome is Outcome.MADE_PENDING
    assert [m.control.name for m in decision.matches] == ["ci-per-branch"]
    # Tekton's label is Tekton's to write: the patch does not add it.
    assert not [op for op in decision.ops if "tekton.dev~1pipeline" in op["path"]]


def test_the_reconciler_sees_the_same_labels_before_tekton_adds_them() -> None:
    """Its informer keeps a slim copy of each run (no spec): the labels the engine will
    add are kept in it, so the control still holds the run when the reconciler plans."""
    slim = slim_run(triggered(), Kind.PIPELINE_RUN)
    assert "spec" not in slim or "pipelineRef" not in slim["spec"]
    run = parse_run(Kind.PIPELINE_RUN, slim)
    assert README_CONTROL.holds(run.kind, run.labels)
    assert "tekton.dev/pipeline" not in triggered()["metadata"]["labels"]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"pipelineSpec": {"tasks": []}}, {"tekton.dev/pipeline": "pr-1"}),
        (
            {
                "pipelineRef": {
                    "resolver": "cluster",
                    "params": [
                        {"name": "kind", "value": "pipeline"},
                        {"name": "name", "value": "build-and-test"},
                        {"name": "namespace", "value": "ci"},
                    ],
                }
            },
            {"tekton.dev/pipeline": "build-and-test"},
        ),
        (
            {"pipelineRef": {"resolver": "git", "params": [{"name": "url", "value": "x"}]}},
            {"tekton.dev/pipeline": "pr-1"},
        ),
        ({}, {}),
    ],
)
def test_tekton_pipeline_label_follows_tektons_rule(spec: Obj, expected: dict[str, str]) -> None:
    run = triggered(**spec) if spec else triggered()
    if not spec:
        run["spec"].pop("pipelineRef")
    assert engine_labels(Kind.PIPELINE_RUN, run) == expected


def test_a_generated_name_is_not_known_at_admission() -> None:
    run = triggered(pipelineSpec={"tasks": []})
    run["metadata"]["name"] = ""
    run["metadata"]["generateName"] = "build-"
    assert engine_labels(Kind.PIPELINE_RUN, run) == {}
    assert admit_run(Kind.PIPELINE_RUN, run, "ci", [README_CONTROL]).outcome is Outcome.UNTOUCHED


def test_the_runs_own_label_wins() -> None:
    run = triggered()
    run["metadata"]["labels"]["tekton.dev/pipeline"] = "other"
    assert run_labels(Kind.PIPELINE_RUN, run)["tekton.dev/pipeline"] == "other"
    assert admit_run(Kind.PIPELINE_RUN, run, "ci", [README_CONTROL]).outcome is Outcome.UNTOUCHED


@pytest.mark.parametrize(
    ("scope", "label"),
    [
        (False, "workflows.argoproj.io/workflow-template"),
        (True, "workflows.argoproj.io/cluster-workflow-template"),
    ],
)
def test_argo_template_ref_labels(scope: bool, label: str) -> None:
    run = workflow("wf-1", params={"env": "prod"})
    run["spec"] = {"workflowTemplateRef": {"name": "deploy", "clusterScope": scope}}
    assert engine_labels(Kind.WORKFLOW, run) == {label: "deploy"}
    deploys = parse_control(
        control(
            "deploys",
            {"selector": {"matchLabels": {label: "deploy"}}, "key": "x", "strategy": "Queue"},
        )
    )
    assert admit_run(Kind.WORKFLOW, run, "ci", [deploys]).outcome is Outcome.MADE_PENDING
    assert deploys.holds(Kind.WORKFLOW, parse_run(Kind.WORKFLOW, run).labels)


def test_a_key_template_reads_the_engine_label() -> None:
    keyed = parse_control(
        control(
            "per-pipeline",
            {"selector": {}, "key": "$(labels.tekton.dev/pipeline)", "strategy": "Queue"},
        )
    )
    [match] = admit_run(Kind.PIPELINE_RUN, triggered(), "ci", [keyed]).matches
    assert match.key == "build-and-test"
