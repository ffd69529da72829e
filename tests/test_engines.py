"""The engine entries, and the YAML that must agree with them: the ConcurrencyControl CRD's
``kinds`` and ``strategy`` enums (kustomize base and the Helm chart's copy), the run
webhook's rules and the reconciler's RBAC."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from coschedule.config.settings import DEFAULT_GROUP_LABELS
from coschedule.engines import (
    BY_KIND,
    CLAIM_OWNER_KINDS,
    ENGINES,
    RUN_ENGINES,
    RUN_LABELS,
    WALK_UP,
    Kind,
    Strategy,
    run_control,
    run_kind_of,
)
from coschedule.marks import LABEL_GROUP
from tests.chart import render_chart

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "manifests" / "base"
CRDS = (
    ROOT / "manifests" / "crds" / "crd-concurrencycontrol.yaml",
    ROOT / "charts" / "coschedule" / "crds" / "concurrencycontrols.coschedule.dev.yaml",
)
RUNS_PATH = "/mutate-runs"
Obj = dict[str, Any]


def _spec_schema(crd: Obj) -> Obj:
    [version] = crd["spec"]["versions"]
    schema: Obj = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    return schema


@pytest.mark.parametrize("path", CRDS, ids=lambda p: p.parent.parent.name)
def test_the_crd_enums_are_the_codes(path: Path) -> None:
    spec = _spec_schema(yaml.safe_load(path.read_text()))
    kinds = [kind.value for kind in Kind]
    assert spec["kinds"]["items"]["enum"] == kinds
    assert spec["kinds"]["default"] == kinds
    assert spec["kinds"]["maxItems"] == len(kinds)
    assert spec["strategy"]["enum"] == [strategy.value for strategy in Strategy]


def _base_objects() -> list[Obj]:
    objects: list[Obj] = []
    for path in sorted(BASE.glob("*.yaml")):
        objects += [doc for doc in yaml.safe_load_all(path.read_text()) if isinstance(doc, dict)]
    return objects


def _chart_objects() -> list[Obj]:
    return render_chart()


def _run_webhook_rules(objects: Iterable[Obj]) -> set[tuple[str, str, str]]:
    [config] = [o for o in objects if o.get("kind") == "MutatingWebhookConfiguration"]
    [runs] = [
        w for w in config["webhooks"] if w["clientConfig"]["service"]["path"].endswith("-runs")
    ]
    return {
        (group, version, resource)
        for rule in runs["rules"]
        for group in rule["apiGroups"]
        for version in rule["apiVersions"]
        for resource in rule["resources"]
    }


def _reconciler_verbs(objects: Iterable[Obj]) -> dict[tuple[str, str], set[str]]:
    [role] = [
        o
        for o in objects
        if o.get("kind") == "ClusterRole" and o["metadata"]["name"].endswith("reconciler")
    ]
    verbs: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule.get("apiGroups") or ():
            for resource in rule.get("resources") or ():
                verbs.setdefault((group, resource), set()).update(rule["verbs"])
    return verbs


@pytest.mark.parametrize("objects", [_base_objects, _chart_objects], ids=["base", "chart"])
def test_the_webhook_and_rbac_cover_every_engine(objects: Any) -> None:
    rendered = objects()
    wanted = {(e.group, e.version, e.plural) for e in RUN_ENGINES.values()}
    assert _run_webhook_rules(rendered) == wanted
    verbs = _reconciler_verbs(rendered)
    for engine in ENGINES:
        # The owner walk GETs every engine's objects; runs are also watched and patched.
        needed = {"get", "list", "watch", "patch"} if engine.run else {"get"}
        assert needed <= verbs.get((engine.group, engine.plural), set()), engine.kind


def test_the_entries_give_group_labels_walks_and_run_kinds() -> None:
    assert (LABEL_GROUP, *RUN_LABELS) == DEFAULT_GROUP_LABELS
    assert RUN_LABELS == (
        "tekton.dev/pipelineRun",
        "workflows.argoproj.io/workflow",
        "buildrun.shipwright.io/name",
    )
    assert {"TaskRun": frozenset({"PipelineRun", "BuildRun"})} == WALK_UP
    assert "Job" not in WALK_UP  # a CronJob never completes: the walk stops at the Job
    assert {"PipelineRun", "Workflow", "BuildRun", "TaskRun", "Job"} == CLAIM_OWNER_KINDS
    assert set(RUN_ENGINES) == set(Kind)
    assert run_kind_of("tekton.dev", "PipelineRun") is Kind.PIPELINE_RUN
    assert run_kind_of("argoproj.io", "Workflow") is Kind.WORKFLOW
    assert run_kind_of("tekton.dev", "TaskRun") is None
    assert run_kind_of("argoproj.io", "PipelineRun") is None
    assert BY_KIND["Job"].api_version == "batch/v1"


def _conditions(*conditions: Obj) -> Obj:
    return {"status": {"conditions": list(conditions)}}


@pytest.mark.parametrize(
    ("kind", "obj", "why"),
    [
        ("PipelineRun", _conditions({"type": "Succeeded", "status": "Unknown"}), None),
        (
            "PipelineRun",
            _conditions({"type": "Succeeded", "status": "False", "reason": "Cancelled"}),
            "Succeeded=False (Cancelled)",
        ),
        (
            "BuildRun",
            _conditions({"type": "Succeeded", "status": "True", "reason": "Succeeded"}),
            "Succeeded=True (Succeeded)",
        ),
        ("TaskRun", {}, None),
        ("Workflow", {"status": {"phase": "Running"}}, None),
        ("Workflow", {"status": {"phase": "Error"}}, "phase Error"),
        ("Job", _conditions({"type": "Complete", "status": "False"}), None),
        ("Job", _conditions({"type": "Failed", "status": "True"}), "condition Failed"),
        ("Job", {"status": "odd"}, None),
    ],
)
def test_when_each_engine_is_done(kind: str, obj: Obj, why: str | None) -> None:
    assert BY_KIND[kind].done(obj) == why


def test_run_controls_read_and_write_the_engines_own_fields() -> None:
    tekton, argo = run_control(Kind.PIPELINE_RUN), run_control(Kind.WORKFLOW)
    assert tekton.is_pending(tekton.pending)
    assert argo.is_pending(argo.pending)
    assert not tekton.is_pending(tekton.start)
    assert not argo.is_pending(argo.start)
    for control in (tekton, argo):
        for strategy in Strategy:
            if strategy is not Strategy.QUEUE:
                spec = {control.cancel_field: control.cancel_values[strategy]}
                assert control.is_stopping(spec)
                assert control.start_state_set(spec)
    assert tekton.params({"params": [{"name": "a", "value": 1}, {"name": "a", "value": 2}]}) == {
        "a": 1
    }
    assert argo.params({"arguments": {"parameters": [{"name": "b", "value": "x"}, "odd"]}}) == {
        "b": "x"
    }
