"""What a decision returns: ``Decision`` (allowed or denied, the JSONPatch operations, the
warnings, and a sentence per step for ``explain``), and ``deny``, which every step refuses
through. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coschedule import marks
from coschedule.config.policy import Finding
from coschedule.marks import Mode
from coschedule.mutate.defaults import MergedScheduling
from coschedule.mutate.isolation import ScopeChoice
from coschedule.wire.jsonpatch import Op


# init=False: the generated __init__ (every field a parameter, a factory call per list)
# ran on every admission; the one below sets the same defaults, and a test holds the two
# together (tests/mutate/test_outcome.py).
@dataclass(slots=True, init=False)
class Decision:
    allowed: bool
    ops: list[Op] = field(default_factory=list)
    mode: Mode | None = None
    placeholder: str | None = None
    rule: str | None = None  # the rule that denied the pod
    message: str | None = None  # the denial, as kubectl will print it
    # isolate-pipelinerun: the run's isolation scope and why (None in other modes).
    scope: ScopeChoice | None = None
    tenant: str = ""  # the namespace's tenant (isolation-tenant-label), "" when none
    warnings: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # every step, for ``explain``
    # Claims the pod mounts that the claim cache has not seen yet: the caller may wait
    # for the watch to deliver them and decide again (never a guess, never an API call).
    missing_claims: tuple[str, ...] = ()
    # The run's volumeClaimTemplates as decided here (None: the placeholder's rule).
    templates: tuple[marks.ClaimTemplate, ...] | None = None
    # The pod's nodeSelector/tolerations/schedulerName as stored, and which scheduling
    # defaults rule gave what (None: defaults and policy did not apply to this pod, or there
    # was nothing for them to do: no rule configured and nothing a policy rule reads).
    scheduling: MergedScheduling | None = None
    findings: list[Finding] = field(default_factory=list)  # policy rules that fired
    # Placed by node name (pinned, or held behind the placeholder's gate for the reconciler
    # to pin: ``held``).
    by_node_name: bool = False
    held: bool = False
    # Held on a first admission only because the placeholder's pod is not bound yet (it
    # would be pinned were it bound): the webhook may wait for the binding and decide again.
    unbound: bool = False
    trace: bool = True  # the steps write ``reasons`` (the context's ``explain``)

    def __init__(self, allowed: bool, trace: bool = True) -> None:
        self.allowed = allowed
        self.ops = []
        self.mode = None
        self.placeholder = None
        self.rule = None
        self.message = None
        self.scope = None
        self.tenant = ""
        self.warnings = []
        self.reasons = []
        self.missing_claims = ()
        self.templates = None
        self.scheduling = None
        self.findings = []
        self.by_node_name = False
        self.held = False
        self.unbound = False
        self.trace = trace

    @property
    def mode_label(self) -> str:
        return str(self.mode) if self.mode is not None else "none"  # .value is slower


def deny(decision: Decision, rule: str, message: str) -> Decision:
    decision.allowed = False
    decision.rule = rule
    decision.message = f"coschedule: rule {rule}: {message}"
    if decision.trace:
        decision.reasons.append(f"denied by rule {rule}")
    return decision
