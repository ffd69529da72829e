"""Finding a run's root owner and asking it whether the run is done (the I/O half of
``owners``). Roots are cached per placeholder: owners do not change; only their status does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import httpx

from coschedule.kube.client import ApiError, KubeClient, object_path
from coschedule.reconcile import owners
from coschedule.reconcile.model import MarkedPod, OwnerRef, OwnerState, OwnerStatus
from coschedule.reconcile.placeholder import first_pod

log = logging.getLogger("coschedule.reconcile")

MAX_DEPTH = 3  # Pod -> TaskRun -> PipelineRun is the longest walk we make


class OwnerLookupFailed(Exception):
    """A transient failure (429, 5xx, network): try again later; decide nothing yet."""


class OwnerResolver:
    def __init__(self, client: KubeClient, clock: Callable[[], float]) -> None:
        self.client = client
        self.clock = clock
        self.states: dict[str, OwnerState] = {}
        self.gets = 0  # API calls made, for the benchmark's calls-per-run figure

    def forget(self, key: str) -> None:
        self.states.pop(key, None)

    def done(self, key: str, why: str) -> None:
        """The run is done, as a watch of its kind said: no need to ask the API server."""
        self.states[key] = replace(
            self.states[key], status=OwnerStatus.DONE, checked_at=self.clock(), detail=why
        )

    async def _get(self, namespace: str, ref: OwnerRef) -> dict[str, Any] | None:
        self.gets += 1
        path = object_path(ref.api_version, owners.PLURALS[ref.kind], namespace, ref.name)
        try:
            return await self.client.get(path)
        except ApiError as exc:
            if exc.status == 403:
                raise
            raise OwnerLookupFailed(str(exc)) from exc
        except httpx.HTTPError as exc:
            raise OwnerLookupFailed(repr(exc)) from exc

    async def resolve(
        self,
        key: str,
        namespace: str,
        pods: Sequence[MarkedPod],
        from_statefulset: OwnerRef | None,
    ) -> OwnerState:
        """The cached state, or walk the owner chain once (raises OwnerLookupFailed)."""
        state = self.states.get(key)
        if state is not None:
            return state
        if from_statefulset is not None:
            state = OwnerState(from_statefulset)
            self.states[key] = state
            return state
        with_owner = [p for p in pods if p.owner is not None]
        if not with_owner:
            state = OwnerState(None, detail="no pod has a controller owner")
            self.states[key] = state
            return state
        ref = first_pod(with_owner).owner
        assert ref is not None
        if not owners.known(ref):
            state = OwnerState(None, detail=f"owner kind {ref.kind} is not a run kind")
            self.states[key] = state
            return state
        try:
            state = await self._walk(namespace, ref)
        except ApiError as exc:  # 403: we may not read that kind; fall back to idle grace
            log.error(
                "cannot read the run's owner; the placeholder will go after the idle grace",
                extra={"placeholder": key, "owner": f"{ref.kind}/{ref.name}", "error": str(exc)},
            )
            state = OwnerState(None, detail=f"owner not readable: {exc}")
        self.states[key] = state
        return state

    async def _walk(self, namespace: str, ref: OwnerRef) -> OwnerState:
        for _ in range(MAX_DEPTH):
            obj = await self._get(namespace, ref)
            parent = owners.parent_to_follow(ref, obj) if obj is not None else None
            if parent is None:
                return self._state(ref, obj)
            ref = parent
        return self._state(ref, await self._get(namespace, ref))

    def _state(self, root: OwnerRef, obj: dict[str, Any] | None) -> OwnerState:
        why = owners.completion(root, obj)
        status = OwnerStatus.DONE if why else OwnerStatus.RUNNING
        return OwnerState(root, status, self.clock(), why or "")

    async def check(self, key: str, namespace: str) -> OwnerState:
        """Ask the root again (a quiet run's owner, every re-check period)."""
        state = self.states[key]
        root = state.root
        assert root is not None
        try:
            obj = await self._get(namespace, root)
        except (ApiError, OwnerLookupFailed) as exc:
            log.warning(
                "owner check failed; will retry",
                extra={"placeholder": key, "error": str(exc)},
            )
            state = replace(state, status=OwnerStatus.UNKNOWN, checked_at=self.clock())
        else:
            state = self._state(root, obj)
        self.states[key] = state
        return state
