"""What a decision reads: the request's namespace, the settings, and the webhook's watch-fed
caches as views (each None where there is no cluster, as for ``explain``). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from coschedule.config.settings import Settings
from coschedule.k8s.volumes import VolumeTopology
from coschedule.marks import NamespaceInfo
from coschedule.mutate import isolation
from coschedule.mutate.claim_rewrite import ClaimView
from coschedule.mutate.isolation import ScopeChoice
from coschedule.mutate.mode_choice import ModeChoice, cluster_choice


@dataclass(frozen=True, slots=True)
class AdmissionContext:
    settings: Settings
    namespace: str
    # None: no cluster (or the namespace is not in the cache yet): the MutatingWebhook
    # configuration's namespaceSelector already chose the namespace; cluster config applies.
    namespace_info: NamespaceInfo | None = None
    # None: no cluster: claims are grouped as mounted and never rewritten.
    claims: ClaimView | None = None
    # None: no cluster (or not synced): the claims-conflict pre-flight is skipped.
    volumes: VolumeView | None = None
    # None: no cluster (or not synced): no placeholder is bound, so a pod placed by node
    # name is gated and the reconciler pins it (placement ``auto``).
    placeholders: PlaceholderView | None = None
    # Write a reason per step (``explain``); the webhook never reads them and skips them.
    explain: bool = True
    # The mode of a pod when neither it nor its namespace is labelled: most pods.
    cluster_mode: ModeChoice = field(init=False, repr=False, compare=False)
    # The same for an isolated run's scope.
    cluster_scope: ScopeChoice = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        choice = cluster_choice(self.settings.mode, self.settings.mode_reason)
        object.__setattr__(self, "cluster_mode", choice)
        object.__setattr__(self, "cluster_scope", isolation.cluster_scope(self.settings))


class VolumeView(Protocol):
    """Where each PersistentVolume can be used, by name (a watch-fed cache)."""

    @property
    def synced(self) -> bool: ...

    def get(self, name: str) -> VolumeTopology | None: ...


class PlaceholderView(Protocol):
    """The node each placeholder's pod is bound to (a watch-fed cache)."""

    def node(self, namespace: str, placeholder: str) -> str | None:
        """None: not bound, terminating, or not known (yet)."""
        ...
