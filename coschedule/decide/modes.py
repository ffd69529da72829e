"""Modes (Tekton's words) and which one applies to a pod: pod label > namespace > cluster."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from coschedule.contract import LABEL_MODE


class Mode(enum.StrEnum):
    DISABLED = "disabled"
    WORKSPACES = "workspaces"
    PIPELINERUNS = "pipelineruns"
    ISOLATE_PIPELINERUN = "isolate-pipelinerun"

    @classmethod
    def parse(cls, text: str) -> Mode | None:
        try:
            return cls(text.strip().lower())
        except ValueError:
            return None

    @property
    def per_run(self) -> bool:
        """Modes whose group is a whole run rather than a claim."""
        return self is Mode.PIPELINERUNS or self is Mode.ISOLATE_PIPELINERUN


MODE_CHOICES = ", ".join(m.value for m in Mode)


@dataclass(frozen=True, slots=True)
class ModeChoice:
    mode: Mode
    source: str  # "pod label", "namespace label", "cluster config"
    reason: str


@dataclass(frozen=True, slots=True)
class InvalidMode:
    source: str
    value: str


def choose_mode(
    pod_labels: Mapping[str, str],
    namespace_labels: Mapping[str, str] | None,
    cluster_mode: Mode,
    cluster_reason: str,
) -> ModeChoice | InvalidMode:
    """The pod's own label wins (Tekton copies PipelineRun labels to pods), then the
    namespace's label, then the cluster configuration."""
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
    return ModeChoice(cluster_mode, "cluster config", f"cluster config ({cluster_reason})")
