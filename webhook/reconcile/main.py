"""``coschedule reconcile``: the placeholder reconciler (entry point)."""

from __future__ import annotations

import argparse
import sys


def run_reconciler(args: argparse.Namespace) -> int:
    print("coschedule reconcile: not built yet", file=sys.stderr)
    return 1
