"""Well-known labels and values of the Kubernetes API, spelled once."""

from __future__ import annotations

HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"
# The current label first, then the deprecated one some PVs and nodes still carry.
ZONE_KEYS = (ZONE, "failure-domain.beta.kubernetes.io/zone")
REGION_KEYS = (REGION, "failure-domain.beta.kubernetes.io/region")

# The hard and the soft half of node, pod and pod anti-affinity.
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"

# A pod in one of these phases has ended (its resources are free, it never runs again).
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
