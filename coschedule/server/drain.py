"""A graceful stop on SIGTERM: keep serving while the API servers learn that the pod goes.

A deleted pod leaves the Service's endpoints within a second or two, but an API server that
has already picked it, or holds a kept-alive connection to it, still sends it reviews for a
while. A process that closes at once fails those calls, and under ``failurePolicy: Ignore``
the pods they were for are admitted without coschedule (a rolling upgrade did exactly that).
So for ``--shutdown-delay`` the process stays up: ``/readyz`` answers 503 and every response
closes its connection, so no API server keeps one to a pod that is about to stop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from coschedule.server.admission import Message, Send

CLOSE = (b"connection", b"close")


@dataclass(slots=True)
class Drain:
    delay: float = 0.0  # seconds; 0: stop at once
    since: float | None = None  # monotonic time the drain began

    @property
    def active(self) -> bool:
        return self.since is not None

    def begin(self) -> bool:
        """Start draining; False when there is nothing to wait for (no delay, or already)."""
        if self.delay <= 0 or self.since is not None:
            return False
        self.since = time.monotonic()
        return True

    def readiness(self) -> tuple[bool, str | None]:
        if self.since is None:
            return True, None
        left = max(0.0, self.delay - (time.monotonic() - self.since))
        return False, f"shutting down: serving {left:.0f}s more while endpoints drop this pod"

    def closing(self, send: Send) -> Send:
        """``send`` with ``Connection: close`` added to the response's headers."""

        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), CLOSE]}
            await send(message)

        return wrapped
