"""``coschedule explain`` shows the merged scheduling defaults (and from which rule) and the
policy rules that fired, in the text and the JSON report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from coschedule.cli.explain import explain, render_text
from coschedule.config.settings import parse_settings
from tests.conftest import ROOT
from tests.fixtures import load_pod

DEFAULTS = """
- namespaces: [ci]
  nodeSelector: {kubernetes.io/arch: arm64}
- selector: {matchLabels: {tekton.dev/pipelineTask: build}}
  nodeSelector: {kubernetes.io/arch: amd64, disk: ssd}
  schedulerName: build-scheduler
"""


def test_report_names_the_rule_of_each_merged_default_and_each_policy_finding() -> None:
    pod = load_pod("tekton-taskrun")
    pod["spec"]["tolerations"].append({"key": "node.kubernetes.io/unschedulable"})
    settings = parse_settings({"scheduling-defaults": DEFAULTS})
    decision, report = explain(pod, settings)
    assert decision.allowed
    assert report["schedulingDefaults"] == [
        {
            "rule": 0,
            "ruleScope": "rule 0 (namespaces ci)",
            "field": "nodeSelector",
            "value": "kubernetes.io/arch=arm64",
        },
        {
            "rule": 1,
            "ruleScope": "rule 1 (selector tekton.dev/pipelineTask=build)",
            "field": "nodeSelector",
            "value": "disk=ssd",
        },
        {
            "rule": 1,
            "ruleScope": "rule 1 (selector tekton.dev/pipelineTask=build)",
            "field": "schedulerName",
            "value": "build-scheduler",
        },
    ]
    assert report["scheduling"]["nodeSelector"] == {"kubernetes.io/arch": "arm64", "disk": "ssd"}
    assert report["scheduling"]["schedulerName"] == "build-scheduler"
    (finding,) = report["policy"]
    assert finding["rule"] == "reserved-tolerations"
    assert finding["mode"] == "warn"
    assert finding["field"] == "spec.tolerations[2]"
    text = render_text(report)
    assert "scheduling defaults merged:" in text
    assert (
        "  - nodeSelector kubernetes.io/arch=arm64  <- scheduling-defaults rule 0 (namespaces ci)"
        in text
    )
    assert "schedulerName build-scheduler  <- scheduling-defaults rule 1" in text
    assert "policy rules fired:" in text
    assert "  - policy-reserved-tolerations (warn): spec.tolerations[2] tolerates" in text
    assert "resulting scheduling fields:" in text


def test_plain_pod_without_config_reports_no_defaults_or_policy() -> None:
    _, report = explain(load_pod("tekton-taskrun"), parse_settings({}))
    assert "schedulingDefaults" not in report
    assert "policy" not in report
    assert "policy rules fired" not in render_text(report)


def test_cli_json_and_text_with_a_config_dir(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "scheduling-defaults").write_text(DEFAULTS)
    (config / "policy-control-plane").write_text("deny")
    pod = load_pod("tekton-taskrun")
    pod["spec"]["tolerations"].append(
        {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}
    )
    manifest = tmp_path / "pod.json"
    manifest.write_text(json.dumps(pod))

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "coschedule.cli.main", "explain", "-f", str(manifest),
             "--config-dir", str(config), *extra],
            capture_output=True, text=True, cwd=ROOT, check=False,
        )  # fmt: skip

    result = run("-o", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["allowed"] is False
    assert report["rule"] == "policy-control-plane"
    assert report["policy"][0]["mode"] == "deny"
    assert report["schedulingDefaults"][0]["value"] == "kubernetes.io/arch=arm64"
    text = run().stdout
    assert "decision:    DENIED" in text
    assert "policy-control-plane (deny): spec.tolerations[2]" in text
    assert "<- scheduling-defaults rule 0 (namespaces ci)" in text
