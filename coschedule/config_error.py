"""``ConfigError`` on its own, so that the key parsers in ``coschedule.decide`` can raise it
without importing ``coschedule.settings`` (which imports them). ``coschedule.settings`` re-exports
it: ``from coschedule.settings import ConfigError`` is the usual spelling."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that must not be used. The message names the keys involved."""
