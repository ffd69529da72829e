"""The HTTPS app: ``/mutate`` (pods), ``/mutate-runs`` (runs, concurrency control) + the
probes.

The admission paths are dispatched before FastAPI so that the hot path pays for no routing,
request object or validation layer; the probes, which are not hot, use FastAPI.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI

from coschedule.server.admission import Receive, Scope, Send
from coschedule.server.drain import Drain
from coschedule.server.pod_endpoint import PodEndpoint

AsgiHandler = Callable[[Scope, Receive, Send], Awaitable[None]]


class HttpsApp:
    """Each admission path straight to its endpoint; everything else to the probes app."""

    def __init__(
        self,
        pods: PodEndpoint,
        probes: FastAPI,
        runs: AsgiHandler | None = None,
        drain: Drain | None = None,
    ) -> None:
        self.pods = pods
        self.probes = probes
        self.runs = runs
        self.drain = drain or Drain()

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        # The endpoint's own coroutine, with none of ours around it (one frame less per
        # admission). A plain method hides that this is ASGI 3 from uvicorn's guess, so its
        # configurations say ``interface="asgi3"``.
        if scope["type"] == "http":
            if self.drain.since is not None:
                send = self.drain.closing(send)
            path = scope["path"]
            if path == "/mutate":
                return self.pods(scope, receive, send)
            if path == "/mutate-runs" and self.runs:
                return self.runs(scope, receive, send)
        return self.probes(scope, receive, send)
