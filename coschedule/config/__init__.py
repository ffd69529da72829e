"""The cluster configuration: ``Settings`` and the parsers of its keys (``settings``), the
scheduling-defaults rules and the hardening policy (``scheduling_defaults``, ``policy``),
and hot reload (``store``). Below the decisions: they import it, it imports none of them."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that must not be used. The message names the keys involved."""
