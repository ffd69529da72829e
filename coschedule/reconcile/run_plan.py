"""The concurrency controller's pure planners: what it observed of one key in, a ``Plan``
out, carried out by the one ``Executor`` as every controller's.

- ``plan_group``: one group's starts, cancels and waiting marks (``concurrency.plan.plan``)
  and, while a run of it waits towards ``maxWaitSeconds``, a look again when it reaches it;
- ``plan_status``: a ConcurrencyControl's counts written to its status when they changed;
- ``plan_admit``: the run webhook's own decision (``concurrency.admission.admit_run``) on a
  run the admission policy held while no webhook answered.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from coschedule.concurrency.admission import Outcome, admit_run, policy_held
from coschedule.concurrency.control import Control
from coschedule.concurrency.plan import Group, GroupKey, control_status, next_deadline, plan
from coschedule.concurrency.runs import parse_run
from coschedule.engines import Kind
from coschedule.k8s.timefmt import micro_time
from coschedule.marks import ANNOTATION_PENDING_BY, ANNOTATION_RUN_ADMITTED, PENDING_BY_CONCURRENCY
from coschedule.reconcile.model import AdmitHeldRun, Plan, Requeue, WriteControlStatus
from coschedule.wire import jsonpatch

# A look again at a run's maxWaitSeconds comes a second after it, so that clock skew with
# the API server's creation time cannot make it early.
DEADLINE_SLACK_SECONDS = 1.0


def plan_group(key: GroupKey, observed: Mapping[GroupKey, Group], now: float) -> Plan:
    """Group ``key``'s actions (``observed`` holds it and every other group its runs are in)
    and, when a run it keeps waiting reaches ``maxWaitSeconds`` later, a look again then."""
    deadline = next_deadline(observed[key])
    requeue = None
    if deadline is not None and deadline > now:
        requeue = Requeue(
            deadline - now + DEADLINE_SLACK_SECONDS, "a waiting run reaches maxWaitSeconds"
        )
    return Plan(tuple(plan(key, observed, now)), requeue)


def plan_status(
    namespace: str,
    name: str,
    control: Control | None,
    stored: Mapping[str, Any] | None,
    groups: Sequence[Group],
) -> Plan:
    """Write the control's counts (over ``groups``, its groups that hold a run) and the
    generation they were counted for, unless its status says so already; nothing for a
    control that is gone."""
    if control is None or stored is None:
        return Plan()
    status: dict[str, Any] = control_status(control, groups)
    generation = (stored.get("metadata") or {}).get("generation")
    if isinstance(generation, int):
        status["observedGeneration"] = generation
    current = stored.get("status") or {}
    if all(current.get(k) == v for k, v in status.items()):
        return Plan()
    return Plan((WriteControlStatus(namespace, name, status),))


def plan_admit(
    kind: Kind,
    namespace: str,
    stored: Mapping[str, Any] | None,
    controls: Iterable[Control],
    now: float | None = None,
) -> Plan:
    """What the run webhook would have done to a run the admission policy held while no
    webhook answered: its own decision on the run as stored (``stored``, the whole run: its
    params make the key) with the controls of its namespace, in one patch conditional on
    what the decision read (``read_tests``). Labelled, the run joins its groups (and is
    started when they let it: ``start_patch`` stamps it then); selected by no control, it is
    started as its author submitted it, and a seedable run is stamped with ``now`` as a
    start by the reconciler is, so that its placeholder is seeded from now and its first pod
    waits for it. Nothing for a run that is gone or decided already."""
    if stored is None or not policy_held(stored):
        return Plan()
    decision = admit_run(kind, stored, namespace, controls)
    run = parse_run(kind, stored)
    ops = (*read_tests(stored), *decision.ops)
    if (
        now is not None
        and run.seedable
        and decision.outcome is Outcome.RELEASED
        # started by this patch: the policy's pending state goes (an author's stays)
        and run.annotations.get(ANNOTATION_PENDING_BY) == PENDING_BY_CONCURRENCY
    ):
        # A policy-held run has annotations (the policy's marks), so the map is there.
        ops += (jsonpatch.add(_ADMITTED_PATH, micro_time(now)),)
    names = ", ".join(m.control.name for m in decision.matches) or "none"
    message = (
        f"created while the coschedule webhook was unreachable and held by the admission "
        f"policy; decided by the reconciler: {decision.outcome.value} "
        f"(ConcurrencyControls: {names})"
    )
    return Plan((AdmitHeldRun(run, ops, message),))


_ADMITTED_PATH = jsonpatch.pointer("metadata", "annotations", ANNOTATION_RUN_ADMITTED)


def read_tests(stored: Mapping[str, Any]) -> list[jsonpatch.Op]:
    """``test`` ops that hold a patch to what a run decision read: the run (its uid), its
    labels and its annotations, each as read, and its spec by its ``generation`` (which only
    a spec change moves). Not the resourceVersion: the engine writes a new run at once
    (Tekton writes a pending run's status), which changes none of these, and a test of the
    version failed the first admit of a held run with 422 whenever the engine wrote between
    the GET and the patch. Not the spec compared whole: kube-apiserver compared a real
    Tekton run's spec, as read, unequal to itself (its ``taskSpec.spec: null`` entries), so
    that admit failed every time. A part the run lacks cannot be tested as absent
    (kube-apiserver's ``test`` of a missing path is not RFC 6902's): then the version is
    tested too."""
    meta = stored.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    ops = [jsonpatch.test("/metadata/uid", str(meta.get("uid") or ""))]
    complete = True
    for path, key in (("/metadata/labels", "labels"), ("/metadata/annotations", "annotations")):
        value = meta.get(key)
        if isinstance(value, Mapping):
            ops.append(jsonpatch.test(path, dict(value)))
        else:
            complete = False
    generation = meta.get("generation")
    if isinstance(generation, int) and not isinstance(generation, bool):
        ops.append(jsonpatch.test("/metadata/generation", generation))
    else:
        complete = False
    if not complete:
        version = str(meta.get("resourceVersion") or "")
        ops.append(jsonpatch.test("/metadata/resourceVersion", version))
    return ops
