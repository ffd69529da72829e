"""``coschedule explain -f run.yaml --controls controls.yaml``: what run concurrency control
would do to a new PipelineRun or Workflow, offline, and why."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from coschedule.cli import manifests
from coschedule.cli.explain import namespace_text
from coschedule.concurrency.admission import admit_run
from coschedule.concurrency.control import BadControl, Control, parse_control
from coschedule.concurrency.names import KIND as CONTROL_KIND
from coschedule.concurrency.runs import engine_labels
from coschedule.engines import RUN_ENGINES, Kind, Order, Overflow, Strategy, run_kind_of

RUN_KINDS = tuple(k.value for k in Kind)
# What a run file may be: "tekton.dev/v1, argoproj.io/v1alpha1".
RUN_API_VERSIONS = ", ".join(engine.api_version for engine in RUN_ENGINES.values())


class UnreadableInput(ValueError):
    """The run or the controls cannot be used (exit code 2)."""


def run_kind(doc: Mapping[str, Any]) -> Kind | None:
    api_version = str(doc.get("apiVersion") or "")
    group = api_version.rpartition("/")[0]
    return run_kind_of(group, str(doc.get("kind") or ""))


def read_controls(text: str, namespace: str) -> list[Control]:
    """ConcurrencyControls from YAML documents or a List (``kubectl get ccontrol -o yaml``);
    an invalid one is refused as the API server would, naming the field."""
    try:
        docs = manifests.documents(text)
    except manifests.Unreadable as exc:
        raise UnreadableInput(f"controls file: {exc}") from None
    items: list[Any] = []
    for doc in docs:
        if isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List"):
            items += list(doc.get("items") or ())
        else:
            items.append(doc)
    if not items:
        raise UnreadableInput(f"no {CONTROL_KIND} in it (an empty file)")
    controls = []
    for number, item in enumerate(items, 1):
        if not isinstance(item, dict):
            raise UnreadableInput(
                f"item {number} is a {type(item).__name__}, not a {CONTROL_KIND} mapping"
            )
        if item.get("kind") != CONTROL_KIND:
            kind = item.get("kind") or "document without a kind"
            name = (
                (item.get("metadata") or {}).get("name")
                if isinstance(item.get("metadata"), dict)
                else None
            )
            raise UnreadableInput(
                f"item {number} is a {str(kind)[:60]}{f' ({str(name)[:60]})' if name else ''},"
                f" not a {CONTROL_KIND}"
            )
        try:
            controls.append(parse_control(item, namespace))
        except BadControl as exc:
            name = (item.get("metadata") or {}).get("name", "?")
            raise UnreadableInput(f"ConcurrencyControl {name}: {exc}") from None
    return controls


def explain_run(
    run: Mapping[str, Any], kind: Kind, controls: Sequence[Control], namespace: str
) -> dict[str, Any]:
    in_namespace = [c for c in controls if c.namespace == namespace]
    decision = admit_run(kind, run, namespace, in_namespace)
    matched = {m.control.name: m for m in decision.matches}
    rows: list[dict[str, Any]] = []
    for control in sorted(in_namespace, key=lambda c: c.name):
        row: dict[str, Any] = {"control": control.name, "strategy": control.strategy.value}
        match = matched.get(control.name)
        if match is None:
            row["matches"] = False
            row["why"] = (
                f"kinds {sorted(k.value for k in control.kinds)} exclude {kind.value}"
                if kind not in control.kinds
                else "its selector does not match the run's labels"
            )
        else:
            row.update(
                matches=True,
                key=match.key,
                labelValue=match.value,
                hashed=match.hashed,
                then=_then(control, match.key),
            )
        rows.append(row)
    skipped = sorted({c.ref for c in controls if c.namespace != namespace})
    report: dict[str, Any] = {
        "kind": kind.value,
        "namespace": namespace,
        "outcome": decision.outcome.value,
        "controls": rows,
        "patch": decision.ops,
    }
    meta = run.get("metadata")
    own = meta.get("labels") if isinstance(meta, Mapping) else None
    added = {
        k: v
        for k, v in engine_labels(kind, run).items()
        if not (isinstance(own, Mapping) and k in own)
    }
    if added:
        report["engineLabels"] = added
    if skipped:
        report["otherNamespaces"] = skipped
    return report


def _then(control: Control, key: str) -> str:
    if control.strategy is Strategy.QUEUE:
        first = "newest" if control.order is Order.NEWEST_FIRST else "oldest"
        return (
            f"starts when fewer than {control.max_running} run(s) of key {key!r} are running, "
            f"{first} first" + _bounds(control)
        )
    if control.strategy is Strategy.REPLACE:
        return (
            f"starts when fewer than {control.max_running} run(s) of key {key!r} are running, "
            "oldest first; while it waits, a newer run of that key replaces it (it is "
            "cancelled); running runs are never cancelled" + _bounds(control)
        )
    if control.max_running > 1:
        n = control.max_running
        return (
            f"starts if it is one of the {n} newest runs of key {key!r}; older unfinished runs "
            f"of that key are cancelled ({control.strategy.value}), and it is cancelled when "
            f"{n} newer ones have arrived"
        )
    return (
        f"starts if it is the newest run of key {key!r}; older unfinished runs of that key are "
        f"cancelled ({control.strategy.value}), and it is cancelled when a newer one arrives"
    )


def _bounds(control: Control) -> str:
    said = ""
    if control.max_pending is not None:
        said += (
            f"; at most {control.max_pending} wait, past that the "
            f"{'newest' if control.overflow is Overflow.CANCEL_NEWEST else 'oldest'} waiting "
            "run is cancelled"
        )
    if control.max_wait_seconds is not None:
        said += f"; cancelled if still waiting {control.max_wait_seconds} s after its creation"
    return said


def render_run_text(report: Mapping[str, Any]) -> str:
    lines = [
        f"run:      {report['kind']} in namespace {namespace_text(report)}",
        f"outcome:  {report['outcome']}",
        "controls:"
        if report["controls"]
        else "controls: none in this namespace"
        if report.get("controlsGiven", True)
        else "controls: none given (--controls FILE, e.g. from kubectl get concurrencycontrols"
        " -A -o yaml): the run is admitted as it is",
    ]
    for key, value in report.get("engineLabels", {}).items():
        lines.insert(2, f"label:    {key}={value} (its engine adds it; controls see it)")
    for row in report["controls"]:
        if row["matches"]:
            hashed = " (not a valid label value: hashed)" if row["hashed"] else ""
            lines += [
                f"  - {row['control']} ({row['strategy']}): matches",
                f"      key:   {row['key']!r}",
                f"      label: concurrency.coschedule.dev/{row['control']}={row['labelValue']}"
                + hashed,
                f"      then:  {row['then']}",
            ]
        else:
            lines.append(f"  - {row['control']} ({row['strategy']}): no match: {row['why']}")
    for ref in report.get("otherNamespaces", ()):
        lines.append(f"  (ignored: {ref} is in another namespace)")
    if report["patch"]:
        lines.append("patch (JSONPatch):")
        lines += [f"  {orjson.dumps(op).decode()}" for op in report["patch"]]
    return "\n".join(lines)


__all__ = [
    "RUN_API_VERSIONS",
    "RUN_KINDS",
    "UnreadableInput",
    "explain_run",
    "read_controls",
    "render_run_text",
]
