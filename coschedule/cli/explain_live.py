"""``coschedule explain --kubeconfig K --run pipelinerun/NAME``: where a run stands in a live
cluster, and why: its state, the groups that hold it, what each group's next look does, and
why it waits (what its ``coschedule.dev/waiting`` annotation says, or should say).

Reads only (GET and LIST): the run, the namespace's ConcurrencyControls, and the runs of the
run's groups (and of their other groups, by the same labels the reconciler watches). The
decisions are the reconciler's own pure ones (``coschedule.concurrency.plan``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from coschedule.concurrency.control import BadControl, Control, parse_control
from coschedule.concurrency.names import API_VERSION as CONTROL_API_VERSION
from coschedule.concurrency.names import PLURAL as CONTROL_PLURAL
from coschedule.concurrency.plan import (
    CancelRun,
    Group,
    GroupKey,
    MarkWaiting,
    StartRun,
    control_status,
    group_keys,
    plan,
    waiting_data,
    waiting_why,
)
from coschedule.concurrency.runs import Run, parse_run
from coschedule.engines import RUN_ENGINES, Kind
from coschedule.kube.client import ApiError, KubeClient, object_path
from coschedule.marks import ANNOTATION_WAITING, LABEL_CONCURRENCY_PREFIX


class NotFound(LookupError):
    """The run (or its kind) is not there (exit code 2)."""


def parse_run_ref(text: str) -> tuple[Kind, str]:
    """``pipelinerun/NAME`` or ``workflow/NAME`` (any case; ``pipelineruns``, ``wf``, ``pr``)."""
    kind_text, sep, name = text.partition("/")
    aliases = {
        "pipelinerun": Kind.PIPELINE_RUN,
        "pipelineruns": Kind.PIPELINE_RUN,
        "pr": Kind.PIPELINE_RUN,
        "workflow": Kind.WORKFLOW,
        "workflows": Kind.WORKFLOW,
        "wf": Kind.WORKFLOW,
    }
    kind = aliases.get(kind_text.lower())
    if not sep or not name or kind is None:
        raise ValueError(f"--run {text!r}: write pipelinerun/NAME or workflow/NAME")
    return kind, name


async def observe_run(
    client: KubeClient, kind: Kind, namespace: str, name: str
) -> tuple[Run, list[Control], dict[GroupKey, Group]]:
    """The run, its namespace's controls, and its groups with every other group their runs
    are in (as the reconciler observes them)."""
    engine = RUN_ENGINES[kind]
    try:
        obj = await client.get(object_path(engine.api_version, engine.plural, namespace, name))
    except ApiError as exc:
        if exc.status == 404:  # the kind is not served
            raise NotFound(f"{kind.value}s are not served by this cluster") from None
        raise
    if obj is None:
        raise NotFound(f"{kind.value} {namespace}/{name} not found")
    run = parse_run(kind, obj)
    controls: dict[str, Control] = {}
    listed = await _list(client, CONTROL_API_VERSION, CONTROL_PLURAL, namespace, None)
    for item in listed:
        try:
            control = parse_control(item, namespace)
        except BadControl:
            continue  # the reconciler skips it too
        controls[control.name] = control
    groups: dict[GroupKey, Group] = {}
    todo = group_keys(run)
    while todo:
        key = todo.pop()
        if key in groups:
            continue
        runs: list[Run] = []
        selector = f"{LABEL_CONCURRENCY_PREFIX}{key.control}={key.value}"
        for member_kind, member_engine in RUN_ENGINES.items():
            for item in await _list(
                client, member_engine.api_version, member_engine.plural, namespace, selector
            ):
                runs.append(parse_run(member_kind, item))
        runs.sort(key=lambda r: r.ident)
        groups[key] = Group(key, controls.get(key.control), tuple(runs))
        if key in group_keys(run):  # one level out: the other groups of its group's runs
            todo += [k for r in runs for k in group_keys(r) if k not in groups]
    return run, sorted(controls.values(), key=lambda c: c.name), groups


async def _list(
    client: KubeClient, api_version: str, plural: str, namespace: str, selector: str | None
) -> list[dict[str, Any]]:
    params = {"labelSelector": selector} if selector else None
    try:
        found = await client.list(object_path(api_version, plural, namespace), params)
    except ApiError as exc:
        if exc.status == 404:  # a run kind (or the control CRD) that is not installed
            return []
        raise
    return [i for i in found.get("items") or () if isinstance(i, dict)]


def live_report(
    run: Run,
    controls: Sequence[Control],
    groups: Mapping[GroupKey, Group],
    now: float | None = None,
) -> dict[str, Any]:
    """``now``: the reconciler's clock (epoch seconds) for ``maxWaitSeconds``."""
    rows: list[dict[str, Any]] = []
    for key in group_keys(run):
        group = groups[key]
        row: dict[str, Any] = {"control": key.control, "key": run.key_of(key.control)}
        control = group.control
        if control is None:
            row["control_state"] = "gone: its runs pending by us start"
        else:
            row.update(strategy=control.strategy.value, maxRunning=control.max_running)
            row.update(control_status(control, [group]))
            if not control.holds(run.kind, run.labels):
                row["control_state"] = "no longer selects the run: it starts"
        row["next"] = [_action_text(a) for a in plan(key, groups, now)]
        rows.append(row)
    why = waiting_why(run, groups, now)
    data = waiting_data(run, groups, now)
    report: dict[str, Any] = {
        "kind": run.kind.value,
        "namespace": run.namespace,
        "name": run.name,
        "state": run.state.value,
        "groups": rows,
        "waiting": why,
        "annotation": run.annotations.get(ANNOTATION_WAITING),
        # The same as data, as the annotation coschedule.dev/waiting-data holds it.
        "waitingData": data,
    }
    others = [c.name for c in controls if c.name not in run.groups()]
    if others:
        report["otherControls"] = others
    return report


def _action_text(action: CancelRun | StartRun | MarkWaiting) -> str:
    name = action.run.name
    if isinstance(action, StartRun):
        return f"start {name}: {action.why}"
    if isinstance(action, CancelRun):
        return f"cancel {name} ({action.value}): {action.why}"
    return f"tell {name} why it waits"


def render_live_text(report: Mapping[str, Any]) -> str:
    lines = [
        f"run:      {report['kind']} {report['namespace']}/{report['name']}",
        f"state:    {report['state']}",
    ]
    if report["waiting"]:
        lines.append(f"why:      {report['waiting']}")
        if report["annotation"] != report["waiting"]:
            lines.append(
                "          (not on the run yet: the reconciler writes it on its next look)"
            )
    lines.append("groups:" if report["groups"] else "groups:   none (no control grouped it)")
    for row in report["groups"]:
        head = f"  - {row['control']}, key {row['key']}"
        if "strategy" in row:
            head += (
                f" ({row['strategy']}, maxRunning {row['maxRunning']}): "
                f"{row['running']} running, {row['pending']} pending"
            )
        lines.append(head)
        if "control_state" in row:
            lines.append(f"      control: {row['control_state']}")
        lines.append(f"      next look: {'; '.join(row['next']) or 'nothing to do'}")
    for name in report.get("otherControls", ()):
        lines.append(f"  (ConcurrencyControl {name} does not group it)")
    return "\n".join(lines)
