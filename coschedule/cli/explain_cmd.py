"""``coschedule explain``: a pod or a run explained offline (``-f FILE``), or a live run
(``--run KIND/NAME``); the reports are built in ``explain``, ``explain_runs`` and
``explain_live``, this module reads the flags and prints."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

from coschedule.cli.options import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from coschedule.config import folder


def cmd_explain(args: argparse.Namespace) -> int:
    import orjson

    from coschedule.cli import manifests
    from coschedule.cli.explain import (
        UnreadablePod,
        explain,
        namespace_of,
        read_pod,
        render_text,
        static_claims,
    )
    from coschedule.cli.explain_runs import run_kind
    from coschedule.config.settings import ConfigError, load_settings
    from coschedule.marks import MODE_CHOICES, PLACEMENT_CHOICES, Mode, Placement
    from coschedule.wire.pod_fields import MalformedPod

    if getattr(args, "pod", None) is not None:
        return _explain_pod(args)
    if args.run is not None or args.file is None:
        return _explain_live(args)
    try:
        doc = manifests.one_document(manifests.read_input(args.file))
        run = doc if isinstance(doc, dict) and run_kind(doc) is not None else None
        if run is not None or args.controls:
            return _explain_run(args, run)
        pod = read_pod(doc)
    except (manifests.Unreadable, UnreadablePod) as exc:
        print(f"coschedule explain: cannot read {args.file}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    mode = Mode.parse(args.mode) if args.mode is not None else None
    if args.mode is not None and mode is None:
        print(
            f"coschedule explain: --mode {args.mode!r} is not one of {MODE_CHOICES}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    placement = Placement.parse(args.placement) if args.placement is not None else None
    if args.placement is not None and placement is None:
        print(
            f"coschedule explain: --placement {args.placement!r} is not one of {PLACEMENT_CHOICES}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        config_dir = None
        if args.config_dir is not None:  # given: as serve and reconcile read it
            config_dir, _ = folder.resolve_config_dir(args.config_dir)
        settings = load_settings(config_dir)
    except (ConfigError, folder.MissingConfigDir) as exc:
        print(f"coschedule explain: {exc}", file=sys.stderr)
        return EXIT_USAGE
    claims = None
    if args.claims:
        try:
            text = manifests.read_input(args.claims)
            claims = static_claims(text, namespace_of(pod, args.namespace)[0])
        except (manifests.Unreadable, UnreadablePod) as exc:
            print(f"coschedule explain: cannot read {args.claims}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    namespace_labels: dict[str, str] = {}
    for item in args.namespace_label:
        key, equals, value = item.partition("=")
        if not equals or not key:
            print(
                f"coschedule explain: --namespace-label {item!r} is not KEY=VALUE",
                file=sys.stderr,
            )
            return EXIT_USAGE
        namespace_labels[key] = value
    try:
        _, report = explain(
            pod,
            settings,
            mode=mode,
            namespace_mode=args.namespace_mode,
            namespace_labels=namespace_labels,
            namespace=args.namespace,
            claims=claims,
            placement=placement,
            placeholder_node=args.placeholder_node,
        )
    except MalformedPod as exc:
        print(f"coschedule explain: unreadable pod: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.output == "json":
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    else:
        print(render_text(report))
    return EXIT_OK


def _explain_live(args: argparse.Namespace) -> int:
    """``--run KIND/NAME``: where the run stands in the cluster, and why."""
    import logging

    import httpx
    import orjson

    from coschedule.cli.explain_live import (
        NotFound,
        live_report,
        observe_run,
        parse_run_ref,
        render_live_text,
    )
    from coschedule.kube.client import ApiError, KubeClient, KubeConfigError, require
    from coschedule.kube.reachability import describe

    if args.run is None or args.file is not None:
        print("coschedule explain: give -f FILE, or --run KIND/NAME (a live run)", file=sys.stderr)
        return EXIT_USAGE
    try:
        kind, name = parse_run_ref(args.run)
        creds = require(args.kubeconfig, os.environ, "--run")
    except (ValueError, KubeConfigError) as exc:
        print(f"coschedule explain: {exc}", file=sys.stderr)
        return EXIT_USAGE
    namespace = args.namespace or creds.namespace

    async def look() -> dict[str, Any]:
        client = KubeClient(creds, user_agent="coschedule-explain")
        try:
            return live_report(*await observe_run(client, kind, namespace, name), time.time())
        finally:
            await client.aclose()

    # As release-held: a command does not wait for an unreachable API server, the one line
    # below says it (the processes' "waiting ... retrying" log line would mislead).
    logging.getLogger("coschedule.apiserver").setLevel(logging.ERROR)
    try:
        report = asyncio.run(look())
    except NotFound as exc:
        print(f"coschedule explain: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (ApiError, OSError, httpx.TransportError) as exc:
        why = describe(exc) if isinstance(exc, httpx.TransportError) else str(exc)
        print(f"coschedule explain: cannot read the cluster: {why}", file=sys.stderr)
        return EXIT_FAILED
    if args.output == "json":
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    else:
        print(render_live_text(report))
    return EXIT_OK


def _explain_pod(args: argparse.Namespace) -> int:
    """``--pod NAME``: the live pod's gate, how long it has waited, whether anything leads."""
    import orjson

    from coschedule.cli.explain_gate import gate_report, lease_path
    from coschedule.kube.client import ApiError, KubeClient, KubeConfigError, object_path, require

    if args.file is not None or args.run is not None:
        print(
            "coschedule explain: give one of -f FILE, --run KIND/NAME, --pod NAME", file=sys.stderr
        )
        return EXIT_USAGE
    try:
        creds = require(args.kubeconfig, os.environ, "--pod")
    except KubeConfigError as exc:
        print(f"coschedule explain: {exc}", file=sys.stderr)
        return EXIT_USAGE
    namespace = args.namespace or creds.namespace

    async def look() -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        client = KubeClient(creds, user_agent="coschedule-explain")
        try:
            pod = await client.get(object_path("v1", "pods", namespace, args.pod))
            try:
                lease = await client.get(lease_path(args.system_namespace))
            except ApiError as exc:
                if exc.status != 403:
                    raise
                lease = None  # not allowed to read it: said as "no Lease"
            return pod, lease
        finally:
            await client.aclose()

    try:
        pod, lease = asyncio.run(look())
    except (ApiError, OSError) as exc:
        print(f"coschedule explain: cannot read the cluster: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if pod is None:
        print(f"coschedule explain: pod {namespace}/{args.pod} not found", file=sys.stderr)
        return EXIT_USAGE
    report = gate_report(pod, lease, time.time())
    if args.output == "json":
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    else:
        print(f"pod {report['pod']}")
        for line in report["lines"]:
            print(f"  {line}")
    return EXIT_OK


def _explain_run(args: argparse.Namespace, run: dict[str, Any] | None) -> int:
    import orjson

    from coschedule.cli import manifests
    from coschedule.cli.explain import namespace_of
    from coschedule.cli.explain_runs import (
        RUN_API_VERSIONS,
        RUN_KINDS,
        UnreadableInput,
        explain_run,
        read_controls,
        render_run_text,
        run_kind,
    )

    kind = run_kind(run) if run is not None else None
    if run is None or kind is None:
        print(
            f"coschedule explain: with --controls, {args.file} must be a {' or a '.join(RUN_KINDS)}"
            f" ({RUN_API_VERSIONS})",
            file=sys.stderr,
        )
        return EXIT_USAGE
    namespace, namespace_from = namespace_of(run, args.namespace)
    controls = []
    if args.controls:
        try:
            controls = read_controls(manifests.read_input(args.controls), namespace)
        except (manifests.Unreadable, UnreadableInput) as exc:
            print(f"coschedule explain: cannot use {args.controls}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    report = explain_run(run, kind, controls, namespace)
    report["namespaceFrom"] = namespace_from
    report["controlsGiven"] = bool(args.controls)
    if args.output == "json":
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    else:
        print(render_run_text(report))
    return EXIT_OK
