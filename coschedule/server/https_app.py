"""The HTTPS app: ``/mutate`` + the probes.

``/mutate`` is dispatched before FastAPI so that the hot path pays for no routing,
request object or validation layer; the probes, which are not hot, use FastAPI.
"""

from __future__ import annotations

from fastapi import FastAPI

from coschedule.server.mutate_endpoint import AdmissionHandler, Receive, Scope, Send


class HttpsApp:
    """``/mutate`` straight to the handler; everything else to the probes app."""

    def __init__(self, handler: AdmissionHandler, probes: FastAPI) -> None:
        self.handler = handler
        self.probes = probes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/mutate":
            await self.handler(scope, receive, send)
        else:
            await self.probes(scope, receive, send)
