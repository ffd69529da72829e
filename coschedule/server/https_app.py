"""The HTTPS app: ``/mutate`` (pods), ``/mutate-runs`` (runs, concurrency control) + the
probes.

The admission paths are dispatched before FastAPI so that the hot path pays for no routing,
request object or validation layer; the probes, which are not hot, use FastAPI.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI

from coschedule.server.mutate_endpoint import AdmissionHandler, Receive, Scope, Send

AsgiHandler = Callable[[Scope, Receive, Send], Awaitable[None]]


class HttpsApp:
    """Each admission path straight to its handler; everything else to the probes app."""

    def __init__(
        self, handler: AdmissionHandler, probes: FastAPI, runs: AsgiHandler | None = None
    ) -> None:
        self.handler = handler
        self.probes = probes
        self.runs = runs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/mutate":
            await self.handler(scope, receive, send)
        elif scope["type"] == "http" and scope["path"] == "/mutate-runs" and self.runs:
            await self.runs(scope, receive, send)
        else:
            await self.probes(scope, receive, send)
