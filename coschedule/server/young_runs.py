"""The PipelineRuns this webhook admitted a moment ago (``/mutate-runs``), for the pod
endpoint: a run's first pod may come before the reconciler has made the run's placeholder,
and a run admitted a moment ago is a placeholder on its way (``mutate.bind_wait``).

Bounded in time and memory: an entry counts for ``bind_wait.ON_ITS_WAY_SECONDS`` and goes
with the next record after that; at most ``MAX_RUNS`` are kept (the oldest go first). A run
created with ``generateName`` has no name at admission: it is kept by its prefix, and a
pod's run is looked up by its name and by its name less the 5 generated characters. Only
this replica's admissions are known: with several webhook replicas a run's CREATE may have
reached another one (its first pod is then gated as before).
"""

from __future__ import annotations

from collections import OrderedDict

from coschedule.mutate.bind_wait import (
    GENERATE_PREFIX_MAX,
    ON_ITS_WAY_SECONDS,
    generated_prefix,
)

MAX_RUNS = 4096  # runs admitted within ON_ITS_WAY_SECONDS: far more than any cluster makes


class YoungRuns:
    def __init__(self, young: float = ON_ITS_WAY_SECONDS, limit: int = MAX_RUNS) -> None:
        self.young = young
        self.limit = limit
        # (namespace, name or "prefix*") -> when admitted (seconds since the epoch), oldest
        # first (records come in time order).
        self._runs: OrderedDict[tuple[str, str], float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._runs)

    def record(self, namespace: str, name: str, generate_name: str, now: float) -> None:
        """A run admitted now: by its name, or, without one, by its ``generateName``."""
        if name:
            key = (namespace, name)
        elif generate_name:
            key = (namespace, generate_name[:GENERATE_PREFIX_MAX] + "*")
        else:
            return
        runs = self._runs
        runs[key] = now
        runs.move_to_end(key)
        while runs:
            oldest_key, oldest = next(iter(runs.items()))
            if now - oldest <= self.young and len(runs) <= self.limit:
                break
            del runs[oldest_key]

    def admitted(self, namespace: str, run: str, now: float) -> float | None:
        """When the run named ``run`` was admitted here, if no longer ago than ``young``."""
        runs = self._runs
        if not runs:
            return None
        at = runs.get((namespace, run))
        if at is None and (prefix := generated_prefix(run)):
            at = runs.get((namespace, prefix + "*"))
        if at is None or now - at > self.young:
            return None
        return at
