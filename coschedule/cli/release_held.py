"""``coschedule release-held``: start every run that concurrency control holds pending, and
lift the placeholder's scheduling gate from every pod it holds, before coschedule is removed
(nothing else would ever start them, or let them schedule, once the reconciler is gone).

It lists the runs the webhook grouped (label ``coschedule.dev/concurrency``) of every run
engine, in the namespaces asked for or all of them, and starts those held pending by
coschedule through the reconciler's own start path (``reconcile.run_writes.start_run``: the
engine's start patch with the run's resourceVersion, a log line, a ``Started`` Event). Runs
their authors made pending are left alone, as the reconciler leaves them. A run that changed
meanwhile (409) is read again and started if it is still held. Run twice, the second run
finds nothing to release.

Pods behind the gate ``coschedule.dev/placeholder`` (marked by the webhook, or gated by the
admission policy while the webhook was away) get the gate removed and nothing else: they are
not pinned, and schedule as if coschedule had never seen them (a ``test`` of the gate first,
so a pod whose gates changed meanwhile is read again).
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from coschedule.cli.options import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from coschedule.concurrency.runs import Run, State, parse_run
from coschedule.engines import RUN_ENGINES, Kind
from coschedule.kube.client import JSON_PATCH, ApiError, KubeClient, object_path
from coschedule.kube.informer import Obj
from coschedule.marks import LABEL_CONCURRENCY_GROUPED, LABEL_GATED_BY, LABEL_PLACEHOLDER
from coschedule.placement.node_pin import gate_index, ungate_ops
from coschedule.reconcile.run_writes import run_path, start_run

# A run that keeps changing under us (another writer) is left after this many tries.
ATTEMPTS = 3
PAGE = 500


@dataclass(frozen=True, slots=True)
class Outcome:
    run: Run
    released: bool  # False: dry run, or it was no longer held when started
    note: str  # who held it, or why it was left

    def line(self, dry_run: bool) -> str:
        verb = "would release" if dry_run else "released" if self.released else "left"
        return f"{verb} {self.run.kind.value} {self.run.namespace}/{self.run.name} ({self.note})"


def held_by(run: Run) -> str:
    """The controls that hold the run and its key under each, for a person."""
    parts = [f"ConcurrencyControl {c}, key {run.key_of(c)}" for c in sorted(run.groups())]
    return "; ".join(parts) or "no control named on it"


async def list_grouped(client: KubeClient, kind: Kind, namespace: str | None) -> list[Run] | None:
    """The runs of ``kind`` the webhook grouped (all namespaces when ``namespace`` is None),
    every page; None when the cluster does not serve the kind."""
    engine = RUN_ENGINES[kind]
    where = f"/namespaces/{namespace}" if namespace else ""
    path = f"/apis/{engine.api_version}{where}/{engine.plural}"
    runs: list[Run] = []
    params: dict[str, str | int] = {"labelSelector": LABEL_CONCURRENCY_GROUPED, "limit": PAGE}
    while True:
        try:
            page = await client.list(path, params)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        runs.extend(parse_run(kind, item) for item in page.get("items") or ())
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return runs
        params["continue"] = token


async def release(client: KubeClient, run: Run) -> Outcome:
    """Start one held run; read it again after a 409 and start it if it is still held."""
    why = f"released by coschedule release-held (held by {held_by(run)})"
    for _ in range(ATTEMPTS):
        try:
            await start_run(client, run, why)
        except ApiError as exc:
            if exc.status != 409:
                raise
            fresh = await client.get(run_path(run))
            if fresh is None:
                return Outcome(run, False, "deleted meanwhile")
            run = parse_run(run.kind, fresh)
            if run.state is not State.PENDING_BY_US:
                return Outcome(run, False, f"no longer held: {run.state.value}")
            continue
        return Outcome(run, True, f"held by {held_by(run)}")
    return Outcome(run, False, f"changed {ATTEMPTS} times while being released; run again")


async def release_held(
    client: KubeClient,
    namespaces: Sequence[str] | None,
    *,
    dry_run: bool,
    say: Callable[[str], None],
) -> list[Outcome]:
    """Release (or, ``dry_run``, name) every held run in ``namespaces`` (None: all), saying
    each as it goes; the outcomes, in kind, namespace and creation order."""
    outcomes: list[Outcome] = []
    for kind in RUN_ENGINES:
        found: list[Run] = []
        served = True
        scopes: Sequence[str | None] = namespaces or [None]
        for namespace in scopes:
            runs = await list_grouped(client, kind, namespace)
            if runs is None:
                served = False
                break
            found.extend(runs)
        if not served:
            say(f"{kind.value}s: not served by this cluster (CRD not installed)")
            continue
        held = sorted(
            (r for r in found if r.state is State.PENDING_BY_US),
            key=lambda r: (r.namespace, r.order),
        )
        for run in held:
            if dry_run:
                outcome = Outcome(run, False, f"held by {held_by(run)}")
            else:
                outcome = await release(client, run)
            say(outcome.line(dry_run))
            outcomes.append(outcome)
    return outcomes


@dataclass(frozen=True, slots=True)
class PodOutcome:
    namespace: str
    name: str
    released: bool  # False: dry run, or left
    note: str

    def line(self, dry_run: bool) -> str:
        verb = "would ungate" if dry_run else "ungated" if self.released else "left"
        return f"{verb} Pod {self.namespace}/{self.name} ({self.note})"


def _gated_note(pod: Obj) -> str:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    placeholder = labels.get(LABEL_PLACEHOLDER)
    if placeholder:
        return f"waiting for placeholder {placeholder}"
    return "gated by the admission policy, never marked"


async def list_gated(client: KubeClient, namespace: str | None) -> list[Obj]:
    """Pods behind our gate: those the webhook marked and those the policy gated."""
    found: dict[tuple[str, str], Obj] = {}
    for selector in (LABEL_PLACEHOLDER, LABEL_GATED_BY):
        params: dict[str, str | int] = {"labelSelector": selector, "limit": PAGE}
        while True:
            page = await client.list(object_path("v1", "pods", namespace), params)
            for pod in page.get("items") or ():
                meta = pod.get("metadata") or {}
                if gate_index(pod.get("spec") or {}) is not None:
                    found[(str(meta.get("namespace")), str(meta.get("name")))] = pod
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
            params["continue"] = token
    return [found[key] for key in sorted(found)]


async def ungate(client: KubeClient, pod: Obj) -> PodOutcome:
    """Lift our gate (nothing else); read the pod again when its gates changed meanwhile."""
    meta = pod.get("metadata") or {}
    namespace, name = str(meta.get("namespace")), str(meta.get("name"))
    note = _gated_note(pod)
    path = object_path("v1", "pods", namespace, name)
    for _ in range(ATTEMPTS):
        ops = ungate_ops(pod.get("spec") or {})
        if not ops:
            return PodOutcome(namespace, name, False, "no longer gated")
        try:
            await client.patch(path, ops, content_type=JSON_PATCH)
        except ApiError as exc:
            if exc.status == 404:
                return PodOutcome(namespace, name, False, "deleted meanwhile")
            if exc.status not in (409, 422):
                raise
            fresh = await client.get(path)
            if fresh is None:
                return PodOutcome(namespace, name, False, "deleted meanwhile")
            pod = fresh
            continue
        return PodOutcome(namespace, name, True, note)
    return PodOutcome(namespace, name, False, f"changed {ATTEMPTS} times; run again")


async def release_gated(
    client: KubeClient,
    namespaces: Sequence[str] | None,
    *,
    dry_run: bool,
    say: Callable[[str], None],
) -> list[PodOutcome]:
    """Lift (or, ``dry_run``, name) our gate from every pod in ``namespaces`` (None: all)."""
    outcomes: list[PodOutcome] = []
    scopes: Sequence[str | None] = namespaces or [None]
    for namespace in scopes:
        for pod in await list_gated(client, namespace):
            meta = pod.get("metadata") or {}
            if dry_run:
                outcome = PodOutcome(
                    str(meta.get("namespace")), str(meta.get("name")), False, _gated_note(pod)
                )
            else:
                outcome = await ungate(client, pod)
            say(outcome.line(dry_run))
            outcomes.append(outcome)
    return outcomes


def pods_summary(outcomes: Sequence[PodOutcome], dry_run: bool) -> str:
    if not outcomes:
        return "no pod is held by the coschedule.dev/placeholder gate"
    if dry_run:
        return f"{len(outcomes)} gated pod(s) would be ungated (dry run: nothing changed)"
    released = sum(o.released for o in outcomes)
    left = len(outcomes) - released
    return f"ungated {released} pod(s)" + (f", left {left}" if left else "")


def summary(outcomes: Sequence[Outcome], dry_run: bool) -> str:
    if not outcomes:
        return "no run is held pending by coschedule"
    if dry_run:
        return f"{len(outcomes)} held run(s) would be released (dry run: nothing changed)"
    released = sum(o.released for o in outcomes)
    left = len(outcomes) - released
    return f"released {released} held run(s)" + (f", left {left}" if left else "")


def cmd_release_held(args: argparse.Namespace) -> int:
    """Exit 0 when every held run was released (or none was held), 1 when the cluster could
    not be read or written or a run was left, 2 for an unusable kubeconfig or namespace."""
    import asyncio
    import logging
    import os

    import httpx

    from coschedule.k8s.names import valid_dns_label
    from coschedule.kube.client import KubeConfigError, require
    from coschedule.kube.reachability import describe

    namespaces: list[str] | None = args.namespace or None
    for namespace in namespaces or ():
        if not valid_dns_label(namespace):
            print(
                f"coschedule release-held: {namespace!r} is not a namespace name", file=sys.stderr
            )
            return EXIT_USAGE
    try:
        creds = require(args.kubeconfig, os.environ, "release-held")
    except KubeConfigError as exc:
        print(f"coschedule release-held: {exc}", file=sys.stderr)
        return EXIT_USAGE

    async def go() -> tuple[list[Outcome], list[PodOutcome]]:
        client = KubeClient(creds, user_agent="coschedule-release-held")
        say = functools.partial(print, flush=True)
        try:
            runs = await release_held(client, namespaces, dry_run=args.dry_run, say=say)
            pods = await release_gated(client, namespaces, dry_run=args.dry_run, say=say)
            return runs, pods
        finally:
            await client.aclose()

    # A command does not wait for an unreachable API server: the one line below says it, so
    # the long-running processes' "waiting ... retrying with backoff" would mislead.
    logging.getLogger("coschedule.apiserver").setLevel(logging.ERROR)
    try:
        outcomes, pods = asyncio.run(go())
    except (ApiError, OSError, httpx.TransportError) as exc:
        why = describe(exc) if isinstance(exc, httpx.TransportError) else str(exc)
        print(
            f"coschedule release-held: cannot read or patch the runs or pods: {why}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    print(summary(outcomes, args.dry_run))
    print(pods_summary(pods, args.dry_run))
    notes = [o.note for o in outcomes if not o.released]
    notes += [o.note for o in pods if not o.released]
    left = any(note.startswith("changed") for note in notes)
    return EXIT_FAILED if left else EXIT_OK
