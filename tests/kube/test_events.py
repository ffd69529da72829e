"""One Event shape for every Event the reconciler records."""

from __future__ import annotations

from datetime import UTC, datetime

from coschedule.kube.events import MAX_MESSAGE, event_body

NOW = datetime(2026, 11, 23, 3, 4, 5, tzinfo=UTC)
RUN = {"apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "name": "build-7", "uid": "u-1"}


def test_the_event_names_its_object_in_the_namespace_it_is_recorded_in() -> None:
    body = event_body("ci", RUN, "Cancelled", "cancelled by ConcurrencyControl x", now=NOW)
    assert body["involvedObject"] == {**RUN, "namespace": "ci"}
    assert body["metadata"] == {"generateName": "build-7.", "namespace": "ci"}
    assert (body["reason"], body["type"]) == ("Cancelled", "Normal")
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2026-11-23T03:04:05Z"
    assert body["source"] == {"component": "coschedule-reconciler"}


def test_an_unknown_uid_is_left_out_rather_than_sent_empty() -> None:
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": "affinity-assistant-1",
        "uid": "",
    }
    body = event_body("ci", sts, "PlaceholderRelocated", "moved", "Warning", now=NOW)
    assert "uid" not in body["involvedObject"]
    assert body["type"] == "Warning"


def test_a_long_message_is_cut_to_what_kubectl_shows() -> None:
    body = event_body("ci", RUN, "RunStuck", "x" * (MAX_MESSAGE + 50), now=NOW)
    assert len(body["message"]) == MAX_MESSAGE
