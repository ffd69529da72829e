"""The ConcurrencyControls of every namespace, parsed, fed by a watch (for the webhook's
run admissions and the reconciler's group plans: no API call per decision)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from coschedule.concurrency.control import BadControl, Control, parse_control
from coschedule.concurrency.names import API_VERSION, PLURAL
from coschedule.kube.client import KubeClient
from coschedule.kube.discovery import RETRY_SECONDS, wait_served
from coschedule.kube.informer import Informer, Obj, object_key

log = logging.getLogger("coschedule.controls")

PATH = f"/apis/{API_VERSION}/{PLURAL}"


class ControlCache:
    def __init__(self, client: KubeClient, *, discovery_retry: float = RETRY_SECONDS) -> None:
        self.client = client
        self.discovery_retry = discovery_retry
        self.informer = Informer(client, PATH, name="concurrencycontrols")
        self.informer.add_handler(self._on_event)
        self.by_namespace: dict[str, dict[str, Control]] = {}
        self.absent = False  # discovery said the CRD is not installed (yet)
        self.discovered = asyncio.Event()  # discovery answered once, either way
        self.listeners: list[Callable[[str, str, Control | None], None]] = []

    def controls(self, namespace: str) -> list[Control]:
        return list((self.by_namespace.get(namespace) or {}).values())

    def get(self, namespace: str, name: str) -> Control | None:
        return (self.by_namespace.get(namespace) or {}).get(name)

    def stored(self, namespace: str, name: str) -> Obj | None:
        """The control as the API server stores it (its status and generation)."""
        return self.informer.store.get(f"{namespace}/{name}")

    @property
    def synced(self) -> bool:
        return self.informer.synced.is_set()

    def readiness(self) -> tuple[bool, str | None]:
        if self.synced:
            return True, None
        if self.absent:
            # Not installed (yet): runs are left untouched, which is right without controls.
            return True, "ConcurrencyControl CRD not served: run concurrency control is off"
        why = self.client.reachability.waiting_detail()
        detail = "ConcurrencyControl cache not synced yet"
        return False, f"{detail}; {why}" if why else detail

    def _on_event(self, event: str, obj: Obj, old: Obj | None = None) -> None:
        key = object_key(obj)
        namespace, _, name = key.partition("/")
        known = self.by_namespace.setdefault(namespace, {})
        previous = known.get(name)
        control: Control | None = None
        if event != "DELETED":
            try:
                control = parse_control(obj)
            except BadControl as exc:
                # The CRD's validation makes this rare (an older CRD, a bypassed check):
                # treat the control as absent, and say so.
                log.error(
                    "ignoring an invalid ConcurrencyControl",
                    extra={"control": key, "why": str(exc)},
                )
        if control is None:
            known.pop(name, None)
        else:
            known[name] = control
        if not known:
            self.by_namespace.pop(namespace, None)
        if control is not None and control == previous:
            return  # only the status or metadata changed: nothing a decision reads
        for listener in self.listeners:
            listener(namespace, name, control)

    async def run(self) -> None:
        def absent() -> None:
            self.absent = True
            self.discovered.set()

        await wait_served(
            self.client, API_VERSION, PLURAL, retry=self.discovery_retry, on_absent=absent
        )
        self.absent = False
        self.discovered.set()
        await self.informer.run()

    async def wait_synced(self) -> None:
        await self.discovered.wait()
        if not self.absent:
            await self.informer.synced.wait()
