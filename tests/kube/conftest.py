"""The API layer's fixtures (the kmock-based emulator) are shared with the reconciler's tests."""

from __future__ import annotations

from tests.reconcile.conftest import api, client

__all__ = ["api", "client"]
