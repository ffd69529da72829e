"""The API writes of run concurrency control, as the ``Executor`` carries out its actions:
a run started (``start_run``: the one start path, which ``coschedule release-held`` shares),
cancelled, marked waiting, or admitted without the webhook; a control's status. Each write
is conditional on the version it was planned from (a stale one is 409 or 422); each run
write is followed by its log line and Event.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from coschedule.concurrency.names import API_VERSION, PLURAL
from coschedule.concurrency.plan import CancelRun, MarkWaiting
from coschedule.concurrency.runs import Run, cancel_patch, start_patch, waiting_patch
from coschedule.engines import RUN_ENGINES
from coschedule.kube.client import JSON_PATCH, ApiError, KubeClient, object_path
from coschedule.kube.events import record_event
from coschedule.marks import ANNOTATION_WAITING
from coschedule.reconcile.model import AdmitHeldRun, WriteControlStatus
from coschedule.reconcile.reconciler_metrics import ConcurrencyMetrics

log = logging.getLogger("coschedule.concurrency")


def run_path(run: Run) -> str:
    engine = RUN_ENGINES[run.kind]
    return object_path(engine.api_version, engine.plural, run.namespace, run.name)


async def start_run(
    client: KubeClient,
    run: Run,
    why: str,
    *,
    started: Callable[[Run], None] | None = None,
    now: float | None = None,
) -> None:
    """Let a run held pending by coschedule start: its engine's start patch, only if the run
    is unchanged since ``run`` was read (a stale one is 409), then ``started`` (the
    reconciler's metrics), a log line and a ``Started`` Event. The one start path: the
    reconciler's plans and ``coschedule release-held``. With ``now`` (the reconciler, which
    seeds the run's placeholder then) a seedable run is stamped with it; not from
    ``release-held``, which starts runs for a reconciler that is gone."""
    await client.patch(run_path(run), start_patch(run, now))
    if started is not None:
        started(run)
    message = f"started by coschedule: {why}"
    log.info(
        "started run",
        extra={"run": f"{run.namespace}/{run.name}", "kind": run.kind.value, "why": message},
    )
    await run_event(client, run, "Started", message)


async def cancel_run(client: KubeClient, action: CancelRun, metrics: ConcurrencyMetrics) -> None:
    """The engine's cancel patch with the strategy's value; counted, logged, an Event."""
    run = action.run
    await client.patch(run_path(run), cancel_patch(run, action.value))
    metrics.cancellations.labels(action.strategy.value).inc()
    message = f"cancelled by ConcurrencyControl {action.control}: {action.why}, key {action.key}"
    log.info(
        "cancelled run",
        extra={"run": f"{run.namespace}/{run.name}", "kind": run.kind.value, "why": message},
    )
    await run_event(client, run, "Cancelled", message)


async def mark_waiting(client: KubeClient, action: MarkWaiting) -> None:
    """Write why the run still waits; a ``Waiting`` Event when the text changed (the plan
    writes only a change, so one Event per change, and nothing when a look changes
    nothing)."""
    run = action.run
    await client.patch(run_path(run), waiting_patch(run, action.why, action.data))
    if action.why != run.annotations.get(ANNOTATION_WAITING):
        await run_event(client, run, "Waiting", action.why)


async def write_control_status(client: KubeClient, action: WriteControlStatus) -> None:
    path = object_path(API_VERSION, PLURAL, action.namespace, action.name) + "/status"
    try:
        await client.patch(path, {"status": dict(action.status)})
    except ApiError as exc:
        if exc.status != 404:  # a control deleted meanwhile has no status to write
            raise


async def admit_held_run(client: KubeClient, action: AdmitHeldRun) -> None:
    run = action.run
    await client.patch(run_path(run), [dict(op) for op in action.ops], content_type=JSON_PATCH)
    log.info(
        "run admitted without the webhook decided",
        extra={"run": f"{run.namespace}/{run.name}", "kind": run.kind.value, "why": action.message},
    )
    await run_event(client, run, "AdmittedWithoutWebhook", action.message)


async def run_event(
    client: KubeClient, run: Run, reason: str, message: str, kind: str = "Normal"
) -> None:
    involved = {
        "apiVersion": RUN_ENGINES[run.kind].api_version,
        "kind": run.kind.value,
        "name": run.name,
        "uid": run.uid,
    }
    await record_event(client, run.namespace, involved, reason, message, kind)
