"""``coschedule explain -f run.yaml --controls controls.yaml``: matching controls, the key,
the outcome; exit 0 when it could decide, 2 for unusable input."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from coschedule.cli.main import main

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples" / "concurrency"
CONTROLS = str(EXAMPLES / "controls.yaml")


def test_ci_run_matches_the_branch_control(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["explain", "-f", str(EXAMPLES / "ci-run.yaml"), "--controls", CONTROLS])
    out = capsys.readouterr().out
    assert code == 0
    assert "outcome:  made pending" in out
    assert "ci-per-branch (GracefullyCancel): matches" in out
    assert "key:   'fix/typo-in-readme'" in out
    assert "(not a valid label value: hashed)" in out
    assert "deploy-per-environment (Queue): no match" in out


def test_json_report_for_a_workflow(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "explain",
            "-f",
            str(EXAMPLES / "deploy-workflow.yaml"),
            "--controls",
            CONTROLS,
            "-o",
            "json",
        ]
    )
    report = orjson.loads(capsys.readouterr().out)
    assert code == 0
    assert report["kind"] == "Workflow"
    (deploy,) = [row for row in report["controls"] if row["matches"]]
    assert deploy["control"] == "deploy-per-environment"
    assert deploy["labelValue"] == "production"
    assert {"op": "add", "path": "/spec/suspend", "value": True} in report["patch"]


def test_author_pending_and_untouched_outcomes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run.yaml"
    run.write_text((EXAMPLES / "ci-run.yaml").read_text() + "  status: PipelineRunPending\n")
    assert main(["explain", "-f", str(run), "--controls", CONTROLS]) == 0
    assert "left pending by its author" in capsys.readouterr().out
    other = tmp_path / "other.yaml"
    other.write_text((EXAMPLES / "ci-run.yaml").read_text().replace("team-a", "team-b"))
    assert main(["explain", "-f", str(other), "--controls", CONTROLS]) == 0
    out = capsys.readouterr().out
    assert "outcome:  untouched" in out
    assert "controls: none in this namespace" in out
    assert "ignored: team-a/ci-per-branch is in another namespace" in out


def test_a_run_without_controls_is_untouched(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "-f", str(EXAMPLES / "ci-run.yaml")]) == 0
    assert "outcome:  untouched" in capsys.readouterr().out


def test_an_invalid_control_is_refused_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "controls.yaml"
    bad.write_text(
        (EXAMPLES / "controls.yaml").read_text().replace("$(params.branch)", "$(params.branch")
    )
    assert main(["explain", "-f", str(EXAMPLES / "ci-run.yaml"), "--controls", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "ConcurrencyControl ci-per-branch: spec.key: unclosed '$('" in err


def test_controls_with_a_pod_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    pod = Path(__file__).resolve().parents[1] / "fixtures" / "pods" / "tekton-taskrun.json"
    assert main(["explain", "-f", str(pod), "--controls", CONTROLS]) == 2
    assert "must be a PipelineRun or a Workflow" in capsys.readouterr().err


def test_a_missing_controls_file_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["explain", "-f", str(EXAMPLES / "ci-run.yaml"), "--controls", "/nonexistent.yaml"])
    assert code == 2
    assert "cannot use /nonexistent.yaml" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("apiVersion: v1\nkind: Pod\nmetadata: {name: web}\n", "item 1 is a Pod (web), not a"),
        ("- a\n- b\n", "item 1 is a list, not a ConcurrencyControl mapping"),
        ("just text\n", "item 1 is a str, not a ConcurrencyControl mapping"),
        ("", "no ConcurrencyControl in it"),
        ("apiVersion: v1\nkind: List\nitems: [{kind: Secret}]\n", "item 1 is a Secret, not a"),
    ],
)
def test_a_controls_file_it_cannot_use_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, fragment: str
) -> None:
    controls = tmp_path / "controls.yaml"
    controls.write_text(text)
    run = str(EXAMPLES / "ci-run.yaml")
    assert main(["explain", "-f", run, "--controls", str(controls)]) == 2
    err = capsys.readouterr().err
    assert f"cannot use {controls}: " in err
    assert fragment in err


def test_a_control_among_other_kinds_is_refused_not_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    controls = tmp_path / "controls.yaml"
    examples = (EXAMPLES / "controls.yaml").read_text()
    controls.write_text(examples + "---\nkind: ConfigMap\n")
    assert main(["explain", "-f", str(EXAMPLES / "ci-run.yaml"), "--controls", str(controls)]) == 2
    item = examples.count("kind: ConcurrencyControl") + 1  # after the examples' controls
    assert f"item {item} is a ConfigMap, not a ConcurrencyControl" in capsys.readouterr().err


def test_it_says_when_no_controls_were_given(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "-f", str(EXAMPLES / "ci-run.yaml")]) == 0
    assert "controls: none given (--controls FILE" in capsys.readouterr().out
    assert main(["explain", "-f", str(EXAMPLES / "ci-run.yaml"), "-o", "json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["controlsGiven"] is False


def test_replace_and_newest_first_say_what_happens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run.yaml"
    run.write_text(
        (EXAMPLES / "ci-run.yaml")
        .read_text()
        .replace("build-and-test", "build-preview")
        .replace("name: branch", "name: pull-request")
    )
    assert main(["explain", "-f", str(run), "--controls", CONTROLS]) == 0
    out = capsys.readouterr().out
    assert "preview-per-pull-request (Replace): matches" in out
    assert "a newer run of that key replaces it" in out
    release = tmp_path / "release.yaml"
    release.write_text(
        (EXAMPLES / "deploy-workflow.yaml")
        .read_text()
        .replace("component: deploy", "component: release")
    )
    assert main(["explain", "-f", str(release), "--controls", CONTROLS]) == 0
    out = capsys.readouterr().out
    assert "release-newest-first (Queue): matches" in out
    assert "are running, newest first" in out


def test_explain_says_how_a_bounded_timed_queue_and_kueue_treat_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = {
        "apiVersion": "tekton.dev/v1",
        "kind": "PipelineRun",
        "metadata": {
            "name": "deploy-1",
            "namespace": "team-a",
            "labels": {"kueue.x-k8s.io/queue-name": "team-a"},
        },
        "spec": {
            "pipelineRef": {"name": "deploy"},
            "params": [{"name": "environment", "value": "prod"}],
        },
    }
    path = tmp_path / "run.json"
    path.write_bytes(orjson.dumps(run))
    # The documented deploy-bounded control ignores runs Kueue admits (kueue: Ignore).
    assert main(["explain", "-f", str(path), "--controls", CONTROLS]) == 0
    out = capsys.readouterr().out
    assert "outcome:  untouched" in out
    controls = tmp_path / "controls.yaml"
    controls.write_text(
        (EXAMPLES / "controls.yaml")
        .read_text()
        .replace("  maxWaitSeconds: 1800\n", "  maxWaitSeconds: 1800\n  kueue: Group\n")
    )
    assert main(["explain", "-f", str(path), "--controls", str(controls)]) == 0
    out = capsys.readouterr().out
    assert "outcome:  grouped only: Kueue admits it" in out
    assert (
        "; at most 2 wait, past that the newest waiting run is cancelled; cancelled if still "
        "waiting 1800 s after its creation"
    ) in out
