"""Hot reload of the config folder: the settings in force, swapped whole, never half-applied.

A refused reload keeps the last good settings and reports why (log, metric, readyz detail).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from coschedule.config.folder import config_dir_or_exit
from coschedule.config.settings import ConfigError, Settings, parse_settings, read_raw_config

log = logging.getLogger("coschedule.config")


class ReloadMetrics(Protocol):
    """The two config instruments both processes export."""

    @property
    def config_reload_errors(self) -> Counter: ...
    @property
    def config_last_reload_success(self) -> Gauge: ...


def metric_hooks(metrics: ReloadMetrics) -> tuple[Callable[[], None], Callable[[], None]]:
    """``(on_error, on_loaded)`` that keep the reload counter and gauge true."""

    def refused() -> None:
        metrics.config_reload_errors.inc()
        metrics.config_last_reload_success.set(0)

    def loaded() -> None:
        metrics.config_last_reload_success.set(1)

    return refused, loaded


def open_store_or_exit(
    command: str, given_dir: str | None, environ: Mapping[str, str], metrics: ReloadMetrics
) -> SettingsStore:
    """A process's settings at start: the config folder (as ``config_dir_or_exit`` finds
    it) and the environment, the reload metrics kept true; an invalid configuration is a
    message naming the key(s) and exit 2 (the process refuses to start)."""
    config_dir, note = config_dir_or_exit(command, given_dir)
    on_error, on_loaded = metric_hooks(metrics)
    try:
        return SettingsStore(config_dir, environ, on_error=on_error, on_loaded=on_loaded, note=note)
    except ConfigError as exc:
        print(f"coschedule {command}: refusing to start: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def reload_errors_counter(registry: CollectorRegistry) -> Counter:
    """``coschedule_config_reload_errors_total``: both processes count refused reloads."""
    return Counter(
        "coschedule_config_reload_errors_total",
        "Config folder reloads refused; the last good config stays in force.",
        registry=registry,
    )


def last_reload_gauge(registry: CollectorRegistry) -> Gauge:
    """``coschedule_config_last_reload_successful``, for both processes."""
    return Gauge(
        "coschedule_config_last_reload_successful",
        "1 when the config in force is the one in the folder, 0 after a refused reload.",
        registry=registry,
    )


async def reload_loop(interval: float, reload: Callable[[], object], what: str) -> None:
    """Call ``reload`` every ``interval`` seconds, forever; a failure is logged, never fatal."""
    while True:
        await asyncio.sleep(interval)
        try:
            reload()
        except Exception:  # the loop must outlive any one bad reload
            log.exception(f"{what} failed")


class SettingsStore:
    def __init__(
        self,
        config_dir: Path | None,
        environ: Mapping[str, str],
        *,
        on_error: Callable[[], None] | None = None,
        on_loaded: Callable[[], None] | None = None,
        adjust: Callable[[Settings], Settings] | None = None,
        note: str | None = None,
    ) -> None:
        """Load once; raise ConfigError at start (the process must refuse to start)."""
        self.config_dir = config_dir
        self.environ = dict(environ)
        self.on_error = on_error
        self.on_loaded = on_loaded
        # Shown on readyz even when all is well, e.g. "no config folder: defaults in force".
        self.note = note
        self.adjust = adjust or (lambda s: s)
        self._raw = read_raw_config(config_dir, self.environ)
        self.current: Settings = self.adjust(parse_settings(self._raw))
        self.error: str | None = None
        if on_loaded is not None:
            on_loaded()

    def detail(self) -> str | None:
        """The readyz detail: a refused reload first, else the note."""
        return self.error or self.note

    def maybe_reload(self) -> bool:
        """Re-read the folder; swap settings when it changed and is valid. True on a swap."""
        try:
            raw = read_raw_config(self.config_dir, self.environ)
        except OSError as exc:
            self._refuse(f"cannot read config folder {self.config_dir}: {exc}", None)
            return False
        if raw == self._raw:
            return False
        try:
            settings = self.adjust(parse_settings(raw))
        except ConfigError as exc:
            self._refuse(str(exc), raw)
            return False
        self._raw = raw
        self.current = settings
        self.error = None
        if self.on_loaded is not None:
            self.on_loaded()
        log.info("config reloaded", extra={"mode": settings.mode.value})
        return True

    def _refuse(self, message: str, raw: dict[str, str] | None) -> None:
        if raw is not None:
            self._raw = raw  # report a bad folder once, not on every poll
        self.error = f"config reload refused, last good config kept: {message}"
        log.error(self.error)
        if self.on_error is not None:
            self.on_error()
