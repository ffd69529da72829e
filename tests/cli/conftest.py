"""The kmock-based API emulator's fixtures, for the commands that talk to a cluster."""

from __future__ import annotations

from tests.reconcile.conftest import api, client

__all__ = ["api", "client"]
