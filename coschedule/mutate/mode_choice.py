"""Which mode applies to a pod: pod label > namespace > cluster."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from coschedule.marks import LABEL_MODE, Mode


@dataclass(frozen=True, slots=True)
class ModeChoice:
    mode: Mode
    source: str  # "pod label", "namespace label", "cluster config"
    reason: str


@dataclass(frozen=True, slots=True)
class InvalidMode:
    source: str
    value: str


def cluster_choice(cluster_mode: Mode, cluster_reason: str) -> ModeChoice:
    """The choice when neither the pod nor its namespace is labelled (built once per
    settings by the caller: it is the answer for most pods)."""
    return ModeChoice(cluster_mode, "cluster config", f"cluster config ({cluster_reason})")


def choose_mode(
    pod_labels: Mapping[str, str],
    namespace_labels: Mapping[str, str] | None,
    cluster: ModeChoice,
) -> ModeChoice | InvalidMode:
    """The pod's own label wins (Tekton copies PipelineRun labels to pods), then the
    namespace's label, then the cluster configuration (``cluster_choice``)."""
    if (value := pod_labels.get(LABEL_MODE)) is not None:
        mode = Mode.parse(value)
        if mode is None:
            return InvalidMode("pod label", value)
        return ModeChoice(mode, "pod label", f"pod label {LABEL_MODE}={value}")
    if namespace_labels is not None and (value := namespace_labels.get(LABEL_MODE)) is not None:
        mode = Mode.parse(value)
        if mode is None:
            return InvalidMode("namespace label", value)
        return ModeChoice(mode, "namespace label", f"namespace label {LABEL_MODE}={value}")
    return cluster
