"""``ConfigError`` on its own, so that the key parsers in ``webhook.decide`` can raise it
without importing ``webhook.settings`` (which imports them). ``webhook.settings`` re-exports
it: ``from webhook.settings import ConfigError`` is the usual spelling."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that must not be used. The message names the keys involved."""
