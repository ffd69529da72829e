"""The public names of the design (labels, annotations): one place, read by every layer."""

from __future__ import annotations

# Labels users and the MutatingWebhookConfiguration see.
LABEL_ENABLED = "coschedule.dev/enabled"  # namespace toggle (namespaceSelector)
LABEL_MODE = "coschedule.dev/mode"  # per-namespace or per-run override
LABEL_GROUP = "coschedule.dev/group"  # opt any pod into a run
LABEL_PLACEHOLDER = "coschedule.dev/placeholder"  # the mark: which placeholder a pod joins
LABEL_SKIP = "coschedule.dev/skip"  # on a claim: never group or rewrite it

# Labels of the placeholder (Tekton's names, so Tekton users' dashboards keep working).
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
COMPONENT_AFFINITY_ASSISTANT = "affinity-assistant"
MANAGED_BY = "coschedule"
PLACEHOLDER_PREFIX = "affinity-assistant-"

# Annotations the webhook writes on a marked pod for the reconciler.
ANNOTATION_MODE = "coschedule.dev/mode"  # the effective mode of the pod's group
ANNOTATION_RUN = "coschedule.dev/run"  # the run identity value
ANNOTATION_RUN_LABEL = "coschedule.dev/run-label"  # which group label gave it
ANNOTATION_CLAIMS = "coschedule.dev/claims"  # claims the placeholder mounts (comma-separated)
ANNOTATION_TOPOLOGY_KEY = "coschedule.dev/topology-key"
ANNOTATION_CLAIM_TEMPLATES = "coschedule.dev/claim-templates"  # rewritten claim -> template

TOPOLOGY_HOSTNAME = "kubernetes.io/hostname"
