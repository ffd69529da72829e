"""The ``coschedule`` command: serve, reconcile, certs, explain."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coschedule.cli import options
from coschedule.config import folder

if TYPE_CHECKING:
    from coschedule import certs as certs_types

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def cmd_serve(args: argparse.Namespace) -> int:
    from coschedule.server.main import run_webhook

    return run_webhook(args)


def cmd_certs(args: argparse.Namespace) -> int:
    from coschedule import certs

    names: list[str] = list(args.dns_name or [])
    if args.service:
        names += certs.service_dns_names(args.service, args.namespace)
    if not names:
        print("coschedule certs: give at least one --dns-name (or --service)", file=sys.stderr)
        return EXIT_USAGE
    try:
        certs.check_names(names)
    except ValueError as exc:
        print(f"coschedule certs: --dns-name/--service: {exc}", file=sys.stderr)
        return EXIT_USAGE
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        # Checked before anything is made or sent to a cluster.
        print(f"coschedule certs: --out {out} is a file, not a folder", file=sys.stderr)
        return EXIT_USAGE
    if args.apply_to_secret or args.patch_webhook:
        result = _certs_in_cluster(args, names)
        if isinstance(result, int):
            return result
        bundle, fresh = result
    else:
        bundle, fresh = certs.generate(names, days=args.days), True
    try:
        certs.write_bundle(bundle, out)
    except OSError as exc:
        why = "is not a folder" if out.exists() and not out.is_dir() else exc.strerror or exc
        print(f"coschedule certs: cannot write to --out {out}: {why}", file=sys.stderr)
        return EXIT_USAGE
    made = "wrote" if fresh else "kept the certificate of the Secret; wrote"
    print(
        f"{made} {out / certs.CA_FILE}, {out / certs.CERT_FILE}, {out / certs.KEY_FILE} "
        f"for {', '.join(names)}",
        file=sys.stderr,
    )
    print("caBundle (paste into the MutatingWebhookConfiguration's clientConfig):", file=sys.stderr)
    print(bundle.ca_bundle)
    return EXIT_OK


def _certs_in_cluster(
    args: argparse.Namespace, names: list[str]
) -> tuple[certs_types.CertBundle, bool] | int:
    """``--apply-to-secret`` / ``--patch-webhook``: install the certificate via the API."""
    import datetime as dt

    from coschedule import certs
    from coschedule.cli.certs_apply import ApplyError, apply_in_cluster, parse_secret_ref
    from coschedule.kube.client import KubeClient, KubeConfigError, require

    try:
        secret = parse_secret_ref(args.apply_to_secret) if args.apply_to_secret else None
    except ValueError as exc:
        print(f"coschedule certs: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        creds = require(args.kubeconfig, os.environ, "--apply-to-secret/--patch-webhook")
    except KubeConfigError as exc:
        print(f"coschedule certs: {exc}", file=sys.stderr)
        return EXIT_USAGE

    async def run() -> tuple[certs_types.CertBundle, bool]:
        client = KubeClient(creds, user_agent="coschedule-certs")
        try:
            return await apply_in_cluster(
                client,
                names,
                secret=secret,
                webhook_config=args.patch_webhook,
                generate=lambda n: certs.generate(n, days=args.days),
                renew_before=dt.timedelta(days=args.renew_before_days),
            )
        finally:
            await client.aclose()

    try:
        result = asyncio.run(run())
    except ApplyError as exc:
        print(f"coschedule certs: {exc}", file=sys.stderr)
        return EXIT_FAILED
    what = []
    if secret is not None:
        what.append(f"Secret {secret[0]}/{secret[1]} {'written' if result[1] else 'kept'}")
    if args.patch_webhook:
        what.append(f"caBundle of MutatingWebhookConfiguration {args.patch_webhook} set")
    print(f"coschedule certs: {'; '.join(what)}", file=sys.stderr)
    return result


def cmd_explain(args: argparse.Namespace) -> int:
    import orjson

    from coschedule.cli.explain import UnreadablePod, explain, read_pod, render_text, static_claims
    from coschedule.config.settings import ConfigError, load_settings
    from coschedule.marks import MODE_CHOICES, Mode
    from coschedule.wire.pod_fields import MalformedPod

    if args.run is not None or args.file is None:
        return _explain_live(args)
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text("utf-8")
        run = _read_run(text)
        if run is not None or args.controls:
            return _explain_run(args, text, run)
        pod = read_pod(text)
    except (OSError, UnicodeDecodeError, UnreadablePod) as exc:
        print(f"coschedule explain: cannot read {args.file}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    mode = Mode.parse(args.mode) if args.mode is not None else None
    if args.mode is not None and mode is None:
        print(
            f"coschedule explain: --mode {args.mode!r} is not one of {MODE_CHOICES}",
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
        meta = pod.get("metadata")
        namespace = args.namespace or (meta.get("namespace") if isinstance(meta, dict) else None)
        try:
            claims = static_claims(Path(args.claims).read_text("utf-8"), namespace or "default")
        except (OSError, UnicodeDecodeError, UnreadablePod) as exc:
            print(f"coschedule explain: cannot read {args.claims}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    try:
        _, report = explain(
            pod,
            settings,
            mode=mode,
            namespace_mode=args.namespace_mode,
            namespace=args.namespace,
            claims=claims,
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
    import orjson

    from coschedule.cli.explain_live import (
        NotFound,
        live_report,
        observe_run,
        parse_run_ref,
        render_live_text,
    )
    from coschedule.kube.client import ApiError, KubeClient, KubeConfigError, require

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
            return live_report(*await observe_run(client, kind, namespace, name))
        finally:
            await client.aclose()

    try:
        report = asyncio.run(look())
    except NotFound as exc:
        print(f"coschedule explain: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (ApiError, OSError) as exc:
        print(f"coschedule explain: cannot read the cluster: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.output == "json":
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    else:
        print(render_live_text(report))
    return EXIT_OK


def _read_run(text: str) -> dict[str, Any] | None:
    """The document when it is a PipelineRun or Workflow (else None: explain a pod)."""
    import yaml

    from coschedule.cli.explain_runs import run_kind

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return None  # read_pod says what is wrong
    if isinstance(doc, dict) and run_kind(doc) is not None:
        return doc
    return None


def _explain_run(args: argparse.Namespace, text: str, run: dict[str, Any] | None) -> int:
    import orjson

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
    meta = run.get("metadata")
    namespace = args.namespace or (meta.get("namespace") if isinstance(meta, dict) else None)
    namespace = namespace or "default"
    controls = []
    if args.controls:
        try:
            controls = read_controls(Path(args.controls).read_text("utf-8"), namespace)
        except (OSError, UnicodeDecodeError, UnreadableInput) as exc:
            print(f"coschedule explain: cannot use {args.controls}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    report = explain_run(run, kind, controls, namespace)
    report["controlsGiven"] = bool(args.controls)
    if args.output == "json":
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    else:
        print(render_run_text(report))
    return EXIT_OK


def cmd_reconcile(args: argparse.Namespace) -> int:
    from coschedule.reconcile.main import run_reconciler

    return run_reconciler(args)


def _log_format_flag(parser: argparse.ArgumentParser) -> None:
    from coschedule.logs import FORMATS

    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default="text",
        help="text (key=value, for a terminal; the default) or json (one object per line; "
        "what the manifests set)",
    )


class _DefaultsHelp(argparse.HelpFormatter):
    """Every flag's help says its default (unless it already says it in words)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default is None
            or default is argparse.SUPPRESS
            or (isinstance(default, bool) and action.nargs == 0 and not default)
        ):
            return text
        shown = ("--" if default else "--no-") + action.dest.replace("_", "-")
        value = shown if isinstance(default, bool) else "%(default)s"
        return f"{text} (default: {value})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="coschedule",
        description="Keep the pods of one workflow run on one node.",
    )
    parser.add_argument("--version", action="version", version=options.version())
    sub = parser.add_subparsers(dest="command", required=True)
    config_help = (
        f"the coschedule-config ConfigMap as a folder, one file per key (default: "
        f"{folder.DEFAULT_CONFIG_DIR}; when that is absent, built-in defaults and "
        "COSCHEDULE_* variables)"
    )
    kubeconfig_help = "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster)"
    log_help = f"log level: {', '.join(options.LOG_LEVELS)}"

    serve = sub.add_parser(
        "serve", formatter_class=_DefaultsHelp, help="serve the admission webhook over HTTPS"
    )
    serve.add_argument(
        "--host", default="0.0.0.0", help="address to listen on (make run: 127.0.0.1)"
    )
    serve.add_argument(
        "--port", type=options.port, default=8443, help="HTTPS port: /mutate and probes"
    )
    serve.add_argument(
        "--health-port",
        type=options.port,
        default=8080,
        help="plain HTTP port: probes and /metrics",
    )
    serve.add_argument(
        "--cert-dir",
        default=None,
        help="folder with tls.crt and tls.key (default: certs/, made if absent)",
    )
    serve.add_argument("--config-dir", default=None, help=config_help)
    serve.add_argument("--kubeconfig", default=None, help=kubeconfig_help)
    serve.add_argument(
        "--no-cluster",
        action="store_true",
        help="run on the cluster-wide settings alone, even if a cluster is found",
    )
    serve.add_argument("--log-level", type=options.log_level, default="info", help=log_help)
    _log_format_flag(serve)
    serve.set_defaults(func=cmd_serve)

    rec = sub.add_parser(
        "reconcile", formatter_class=_DefaultsHelp, help="run the placeholder reconciler"
    )
    rec.add_argument("--kubeconfig", default=None, help=kubeconfig_help)
    rec.add_argument("--config-dir", default=None, help=config_help)
    rec.add_argument(
        "--health-port",
        type=options.port,
        default=8081,
        help="plain HTTP port: probes and /metrics",
    )
    rec.add_argument(
        "--namespace", default=None, help="namespace of the Lease (default: the pod's own)"
    )
    rec.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="act only while holding the coschedule-reconciler Lease (run 2+ replicas)",
    )
    rec.add_argument("--log-level", type=options.log_level, default="info", help=log_help)
    _log_format_flag(rec)
    rec.set_defaults(func=cmd_reconcile)

    certs = sub.add_parser(
        "certs", formatter_class=_DefaultsHelp, help="make a CA and a serving certificate"
    )
    certs.add_argument("--dns-name", action="append", help="a SAN (repeatable)")
    certs.add_argument("--service", help="add the DNS names of this Service")
    certs.add_argument(
        "--namespace", default="coschedule-system", help="the namespace of --service"
    )
    certs.add_argument(
        "--out", default="certs", help="folder to write ca.crt, tls.crt and tls.key into"
    )
    certs.add_argument(
        "--days",
        type=options.positive_days,
        default=365,
        help="validity of the new certificates, in days (1 or more)",
    )
    certs.add_argument(
        "--apply-to-secret",
        metavar="NAMESPACE/NAME",
        help="also write the certificate to this kubernetes.io/tls Secret (kept while it "
        "is still valid for --renew-before-days and covers the names)",
    )
    certs.add_argument(
        "--patch-webhook",
        metavar="NAME",
        help="also set the caBundle of this MutatingWebhookConfiguration (only this one)",
    )
    certs.add_argument(
        "--renew-before-days",
        type=options.days_or_zero,
        default=30,
        help="replace the Secret's certificate when it expires within this many days",
    )
    certs.add_argument("--kubeconfig", default=None, help=kubeconfig_help)
    certs.set_defaults(func=cmd_certs)

    exp = sub.add_parser(
        "explain",
        formatter_class=_DefaultsHelp,
        help="show what the webhook would do to a pod or a run, and why",
    )
    exp.add_argument(
        "-f",
        "--file",
        help="pod, PipelineRun or Workflow manifest (YAML or JSON), - for stdin",
    )
    exp.add_argument(
        "--run",
        metavar="KIND/NAME",
        help="a live run instead of -f (pipelinerun/NAME or workflow/NAME, in --namespace): "
        "its state, its groups, what the reconciler's next look does and why it waits",
    )
    exp.add_argument("--kubeconfig", default=None, help=kubeconfig_help + "; with --run")
    exp.add_argument(
        "--mode", help="the cluster mode to assume (default: the config's coschedule key)"
    )
    exp.add_argument("--namespace-mode", help="the namespace's coschedule.dev/mode label")
    exp.add_argument(
        "--namespace", help="the namespace (default: the pod's; with --run, the kubeconfig's)"
    )
    exp.add_argument(
        "--config-dir",
        default=None,
        help="read the cluster config from this folder (default: built-in defaults)",
    )
    exp.add_argument(
        "-c",
        "--claims",
        help="PVCs (and placeholder StatefulSets) as the cluster has them, YAML or JSON "
        "(e.g. kubectl get pvc -o yaml): shows the claim rewrite as the webhook would do it",
    )
    exp.add_argument(
        "--controls",
        help="ConcurrencyControls, YAML or JSON (e.g. kubectl get concurrencycontrols -o yaml): "
        "with a PipelineRun or Workflow as -f, shows which match, the key and the outcome",
    )
    exp.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="report format"
    )
    exp.set_defaults(func=cmd_explain)
    for command in sub.choices.values():
        command.set_defaults(command_parser=command)
    return parser


def main(argv: list[str] | None = None) -> int:
    args, extra = build_parser().parse_known_args(argv)
    if extra:
        # After the command, a flag it does not know: its usage, not the top level's.
        args.command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
