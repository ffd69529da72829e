"""Probes (``/livez``, ``/healthz``, ``/readyz``) and ``/metrics``: one app both processes
serve. Not hot, so FastAPI."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from coschedule.wire.review import error_body

# A readiness check answers (ready, detail). Detail is shown even when ready, e.g. a refused
# config reload: the last good config still serves, so the pod stays ready.
ReadinessCheck = Callable[[], tuple[bool, str | None]]


@dataclass(slots=True)
class Probes:
    checks: dict[str, ReadinessCheck] = field(default_factory=dict)

    def readiness(self) -> tuple[bool, dict[str, object]]:
        results: dict[str, object] = {}
        ready = True
        for name, check in self.checks.items():
            ok, detail = check()
            ready = ready and ok
            results[name] = {"ok": ok, **({"detail": detail} if detail else {})}
        return ready, {"status": "ok" if ready else "not ready", "checks": results}


def cache_stale_gauge(registry: CollectorRegistry) -> Gauge:
    """Both processes: per cache, seconds without word from the API server while its watch
    is down (0 while watching); each cache sets its child with ``set_function``."""
    return Gauge(
        "coschedule_cache_stale_seconds",
        "Seconds a watch-fed cache has not heard from the API server while its watch is "
        "down (0 while the watch is established), by cache.",
        ["cache"],
        registry=registry,
    )


def probes_app(probes: Probes, registry: CollectorRegistry | None) -> FastAPI:
    """Probes; with a registry, ``/metrics`` too (the plain HTTP port only)."""
    app = FastAPI(title="coschedule", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # The project's one error shape, {"error": ...}, not FastAPI's {"detail": ...}.
        path = request.url.path
        message = {
            404: f"{path}: not found",
            405: f"{path}: method {request.method} not allowed",
        }.get(exc.status_code, str(exc.detail))
        return Response(
            error_body(message),
            status_code=exc.status_code,
            headers=exc.headers,
            media_type="application/json",
        )

    @app.get("/livez")
    @app.get("/healthz")
    async def livez() -> Response:
        # Liveness checks nothing external: a restart would not fix a missing cluster.
        return _json({"status": "ok"}, 200)

    @app.get("/readyz")
    async def readyz() -> Response:
        ready, body = probes.readiness()
        return _json(body, 200 if ready else 503)

    if registry is not None:

        @app.get("/metrics")
        async def prometheus() -> PlainTextResponse:
            return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _json(body: object, status: int) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")
