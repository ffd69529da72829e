"""``coschedule certs``: a self-signed CA and serving certificate, written to a folder or
installed in a cluster (``--apply-to-secret``, ``--patch-webhook``)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from coschedule.cli.options import EXIT_FAILED, EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:
    from coschedule import certs as certs_types


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
