"""The kmock-based emulator is shared with the API layer's tests (``serve`` with a cluster)."""

from __future__ import annotations

from tests.reconcile.conftest import api

__all__ = ["api"]
