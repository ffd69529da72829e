"""The ``coschedule`` command: serve, reconcile, certs, explain, release-held."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys

from coschedule.cli import options
from coschedule.cli.options import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from coschedule.config import folder

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "build_parser", "main"]

# What a shell reports for a command killed by SIGPIPE (128 + 13), as `yes | head` gives.
EXIT_BROKEN_PIPE = 141


def cmd_serve(args: argparse.Namespace) -> int:
    from coschedule.server.main import run_webhook

    return run_webhook(args)


def cmd_reconcile(args: argparse.Namespace) -> int:
    from coschedule.reconcile.main import run_reconciler

    return run_reconciler(args)


# Each command's module is imported when it runs: `coschedule certs` never loads the server.
def _run_certs(args: argparse.Namespace) -> int:
    from coschedule.cli.certs_cmd import cmd_certs

    return cmd_certs(args)


def _run_explain(args: argparse.Namespace) -> int:
    from coschedule.cli.explain_cmd import cmd_explain

    return cmd_explain(args)


def _run_release_held(args: argparse.Namespace) -> int:
    from coschedule.cli.release_held import cmd_release_held

    return cmd_release_held(args)


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


def _cert_flags(rec: argparse.ArgumentParser) -> None:
    """The certificate keeper: the leader renews the webhook's self-signed certificate."""
    group = rec.add_argument_group(
        "certificate keeping (the self-signed install; off without --cert-secret)"
    )
    group.add_argument(
        "--cert-secret",
        metavar="NAME",
        help="keep the webhook's serving certificate in this kubernetes.io/tls Secret (in "
        "--namespace): renew it before expiry and keep the caBundles trusting it",
    )
    group.add_argument(
        "--cert-ca-secret",
        metavar="NAME",
        default="coschedule-webhook-ca",
        help="the Secret that holds the CA and the trust bundle (in --namespace)",
    )
    group.add_argument(
        "--cert-webhook-config",
        metavar="NAME",
        action="append",
        help="a MutatingWebhookConfiguration whose caBundle to keep (repeatable)",
    )
    group.add_argument(
        "--cert-service", metavar="NAME", help="the certificate covers this Service's DNS names"
    )
    group.add_argument(
        "--cert-dns-name", metavar="NAME", action="append", help="also this name (repeatable)"
    )
    for flag, default, what in (
        ("--cert-validity", "90d", "lifetime of a serving certificate"),
        ("--cert-renew-before", "30d", "renew a serving certificate this long before it expires"),
        ("--ca-validity", "1825d", "lifetime of a CA"),
        ("--ca-renew-before", "365d", "make a new CA this long before the CA expires"),
    ):
        group.add_argument(
            flag,
            type=options.duration,
            default=options.duration(default),
            help=f"{what}, e.g. 90d, 12h, 10m (default: {default})",
        )


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
        "--host",
        default="::",
        help="address to listen on; :: is every address, IPv6 and IPv4 (0.0.0.0 where the "
        "kernel has no IPv6), 0.0.0.0 every IPv4 one (make run: 127.0.0.1)",
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
    serve.add_argument(
        "--shutdown-delay",
        type=options.duration_or_zero,
        default=dt.timedelta(0),
        metavar="DURATION",
        help="on SIGTERM, keep serving this long, not ready and closing each connection, so "
        "that API servers stop calling the pod before it stops (the Deployment sets 10s; "
        "SIGINT stops at once)",
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
    _cert_flags(rec)
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
        help="validity of the new certificates, in days (1 to 3650; the CA gets twice that)",
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
    certs.set_defaults(func=_run_certs)

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
    exp.add_argument(
        "--pod",
        metavar="NAME",
        help="a live pod instead of -f (in --namespace): why it waits behind coschedule's "
        "scheduling gate, for how long, and whether a reconciler leads to lift it",
    )
    exp.add_argument(
        "--system-namespace",
        default="coschedule-system",
        help="where the reconciler's Lease is (with --pod; default coschedule-system)",
    )
    exp.add_argument("--kubeconfig", default=None, help=kubeconfig_help + "; with --run or --pod")
    exp.add_argument(
        "--mode", help="the cluster mode to assume (default: the config's coschedule key)"
    )
    exp.add_argument("--namespace-mode", help="the namespace's coschedule.dev/mode label")
    exp.add_argument(
        "--namespace-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a label of the namespace (repeatable), e.g. coschedule.dev/isolation-scope=cluster "
        "or the isolation-tenant-label's value",
    )
    exp.add_argument(
        "--placement",
        help="the placement to assume, auto or pod-affinity (default: the config's placement key)",
    )
    exp.add_argument(
        "--placeholder-node",
        metavar="NODE",
        help="explain as if the pod's placeholder were bound to NODE (placement auto pins the "
        "pod there); without it no placeholder is bound, as for a run's first pod",
    )
    exp.add_argument(
        "-n",
        "--namespace",
        help="the namespace (default: the manifest's, else default, said as assumed; with "
        "--run, the kubeconfig's)",
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
    exp.set_defaults(func=_run_explain)

    rel = sub.add_parser(
        "release-held",
        formatter_class=_DefaultsHelp,
        help="start every run concurrency control holds pending (before removing coschedule)",
        description="Start every PipelineRun and Workflow that coschedule's concurrency "
        "control holds pending, through the reconciler's own start path, and print each. "
        "Runs their authors made pending are left alone. Run it before removing coschedule "
        "(after deleting the MutatingWebhookConfiguration, so no new run is held): once the "
        "reconciler is gone, nothing else starts them. Safe to run again.",
    )
    rel.add_argument("--kubeconfig", default=None, help=kubeconfig_help)
    rel.add_argument(
        "-n",
        "--namespace",
        action="append",
        metavar="NAMESPACE",
        help="only this namespace (repeatable; default: every namespace)",
    )
    rel.add_argument(
        "--dry-run",
        action="store_true",
        help="print the runs it would release, change nothing",
    )
    rel.set_defaults(func=_run_release_held)
    for command in sub.choices.values():
        command.set_defaults(command_parser=command)
    return parser


def main(argv: list[str] | None = None) -> int:
    args, extra = build_parser().parse_known_args(argv)
    if extra:
        # After the command, a flag it does not know: its usage, not the top level's.
        args.command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        result: int = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`coschedule explain ... | head`): what it did not read is
        # not wanted. Python's own flush at exit would fail again: stdout goes to devnull.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return result


if __name__ == "__main__":
    sys.exit(main())
