"""Whether the API server answers, said once: not a warning per informer per retry, forever.

Every request of a ``KubeClient`` reports here. The first connection failure logs what the
process waits for; while it keeps failing, a reminder at most every ``remind_every`` seconds;
the first answer after that logs the recovery. Readiness reads ``waiting_detail``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import httpx

log = logging.getLogger("coschedule.apiserver")

REMIND_EVERY_SECONDS = 60.0


def is_unreachable(exc: BaseException) -> bool:
    """A failure to connect at all, as opposed to an answer or a cut stream."""
    return isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)


def describe(exc: BaseException) -> str:
    """The error as an operator reads it: "connection refused", not httpx's "All connection
    attempts failed" (the errno is a few causes down the chain)."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, OSError) and cause.errno is not None and cause.strerror:
            return cause.strerror.lower()
        cause = cause.__cause__ or cause.__context__
    text = str(exc).strip()
    return text or type(exc).__name__


class ApiReachability:
    def __init__(
        self,
        server: str,
        *,
        remind_every: float = REMIND_EVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.server = server
        self.remind_every = remind_every
        self.clock = clock
        self.waiting_since: float | None = None
        self.last_error: str | None = None
        self.failures = 0
        self._next_reminder = 0.0

    @property
    def waiting(self) -> bool:
        return self.waiting_since is not None

    def failed(self, exc: BaseException) -> None:
        now = self.clock()
        self.last_error = describe(exc)
        self.failures += 1
        fields = {"server": self.server, "error": self.last_error}
        if self.waiting_since is None:
            self.waiting_since = now
            self._next_reminder = now + self.remind_every
            log.warning(
                f"waiting for the API server at {self.server}: {self.last_error}; "
                f"retrying with backoff (a reminder every {self.remind_every:.0f} s)",
                extra=fields,
            )
        elif now >= self._next_reminder:
            self._next_reminder = now + self.remind_every
            log.warning(
                f"still waiting for the API server at {self.server} after "
                f"{now - self.waiting_since:.0f} s ({self.failures} attempts): {self.last_error}",
                extra=fields,
            )
        else:
            log.debug("API server unreachable", extra=fields)

    def answered(self) -> None:
        if self.waiting_since is None:
            return
        waited = self.clock() - self.waiting_since
        log.info(
            f"the API server at {self.server} answers again after {waited:.0f} s",
            extra={"server": self.server},
        )
        self.waiting_since = None
        self.last_error = None
        self.failures = 0

    def waiting_detail(self) -> str | None:
        """For readyz: what the process waits for, and the last error; None when it answers."""
        if self.waiting_since is None:
            return None
        waited = self.clock() - self.waiting_since
        return f"waiting for the API server at {self.server} for {waited:.0f} s: {self.last_error}"
