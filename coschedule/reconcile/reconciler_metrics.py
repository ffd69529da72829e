"""The reconciler's Prometheus instruments, on a registry of its own (no globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from coschedule.config.store import last_reload_gauge, reload_errors_counter
from coschedule.engines import Strategy
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
            "Nodes without the configured topology-key label: placeholders avoid them,"
            " pod affinity cannot reach them.",
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
        self.concurrency = ConcurrencyMetrics(self.registry)
        for reason in ("cordoned", "tainted"):
            self.evictions.labels(reason)
        for cause in (Cause.RESOURCES, Cause.PODS, Cause.TAINT, Cause.VOLUME):
            self.relocations.labels(cause.value)


class ConcurrencyMetrics:
    """Run concurrency control's instruments (the concurrency controller's and its actions'),
    on the reconciler's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.cancellations = Counter(
            "coschedule_concurrency_cancellations_total",
            "Runs cancelled by concurrency control (superseded, or past maxPending or "
            "maxWaitSeconds), by strategy.",
            ["strategy"],
            registry=registry,
        )
        self.pending = Gauge(
            "coschedule_concurrency_pending_runs",
            "Runs held pending by coschedule, waiting for their group to let them start.",
            registry=registry,
        )
        self.start_delay = Histogram(
            "coschedule_concurrency_start_delay_seconds",
            "From a run's creation to coschedule starting it.",
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400),
            registry=registry,
        )
        self.starts = Counter(
            "coschedule_concurrency_starts_total",
            "Runs started by coschedule.",
            registry=registry,
        )
        for strategy in Strategy:  # Queue too: maxPending and maxWaitSeconds cancel
            self.cancellations.labels(strategy.value)
