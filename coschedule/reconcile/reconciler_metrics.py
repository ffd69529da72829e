"""The reconciler's Prometheus instruments, on a registry of its own (no globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics

from coschedule.config.store import last_reload_gauge, reload_errors_counter
from coschedule.k8s.scheduler_messages import Cause
from coschedule.probes import cache_stale_gauge


class ReconcileMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # No ``<name>_created`` series beside each counter and histogram: a sample per label
        # set that only says when the process started. prometheus_client's switch is
        # process-wide; every registry of the process is built here.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry if registry is not None else CollectorRegistry()
        self.reconciles = Counter(
            "coschedule_reconcile_total",
            "Reconciles of one key (by the leader), by controller (placeholder, concurrency).",
            ["controller"],
            registry=self.registry,
        )
        self.errors = Counter(
            "coschedule_reconcile_errors_total",
            "Reconciles that failed and were retried with backoff, by controller and HTTP "
            "status (0: other; owner: the run's owner could not be looked up).",
            ["controller", "code"],
            registry=self.registry,
        )
        self.placeholders = Gauge(
            "coschedule_placeholders",
            "Placeholder StatefulSets that exist (managed by coschedule).",
            registry=self.registry,
        )
        self.evictions = Counter(
            "coschedule_placeholder_evictions_total",
            "Placeholder pods deleted off a node that stopped accepting them, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.pinned_placeholders = Gauge(
            "coschedule_pinned_placeholders",
            "Placeholder pods left on a cordoned or tainted node because their volumes can be "
            "used there only (explained by a PlaceholderPinned Event).",
            registry=self.registry,
        )
        self.cache_stale = cache_stale_gauge(self.registry)
        self.relists = Counter(
            "coschedule_watch_relists_total",
            "Full relists after a watch expired (410 Gone), by resource.",
            ["resource"],
            registry=self.registry,
        )
        self.nodes_missing_topology = Gauge(
            "coschedule_nodes_missing_topology_key",
            "Nodes without the configured topology-key label: anti-affinity misbehaves there.",
            registry=self.registry,
        )
        self.config_reload_errors = reload_errors_counter(self.registry)
        self.config_last_reload_success = last_reload_gauge(self.registry)
        self.leader = Gauge(
            "coschedule_reconciler_leader",
            "1 while this replica holds the leader Lease and acts, else 0.",
            registry=self.registry,
        )
        self.relocations = Counter(
            "coschedule_relocations_total",
            "Placeholders moved because their node could not take the run's next pod, by "
            "the cause on that node.",
            ["reason"],
            registry=self.registry,
        )
        self.stuck_groups = Gauge(
            "coschedule_stuck_groups",
            "Groups with a pod stuck because of the group's node that coschedule cannot "
            "move (explained in Events on the pod and the run).",
            registry=self.registry,
        )
        self.stranded_pods = Counter(
            "coschedule_stranded_pods_deleted",
            "Pending pods pinned by node name to a node their run left, deleted so that their "
            "engine recreates them where the run is (placement auto).",
            registry=self.registry,
        )
        self.assistant_conflicts = Counter(
            "coschedule_tekton_assistant_conflicts",
            "Pods found pinned both to a coschedule placeholder and to Tekton's own Affinity "
            "Assistant (each pod once; explained by TektonAffinityAssistantConflict Events): "
            "set coschedule: disabled in Tekton's feature-flags.",
            registry=self.registry,
        )
        self.gated_pods = Gauge(
            "coschedule_gated_pods",
            "Marked pods still behind the coschedule.dev/placeholder scheduling gate (only "
            "the reconciler's leader lifts it), from this replica's pod cache.",
            registry=self.registry,
        )
        self.gated_pod_oldest = Gauge(
            "coschedule_gated_pod_oldest_seconds",
            "How long the oldest marked pod still behind the coschedule.dev/placeholder "
            "scheduling gate has existed (0: none waits).",
            registry=self.registry,
        )
        for reason in ("cordoned", "tainted"):
            self.evictions.labels(reason)
        for cause in (Cause.RESOURCES, Cause.PODS, Cause.TAINT, Cause.VOLUME):
            self.relocations.labels(cause.value)
