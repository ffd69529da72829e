"""The serving TLS context, reloaded in place when cert-manager rotates the files.

``SSLContext.load_cert_chain`` on the live context swaps the certificate for every new
handshake; connections already open keep theirs, so a rotation fails no request.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from coschedule.certs import CERT_FILE, KEY_FILE
from coschedule.server.webhook_metrics import WebhookMetrics

log = logging.getLogger("coschedule.tls")


def _signature(path: Path) -> tuple[int, int, int, int]:
    # stat follows the ..data symlink of a mounted Secret, so a swap changes inode and mtime.
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns, st.st_size, st.st_dev


def _validity(cert_pem: bytes) -> tuple[dt.datetime, dt.datetime]:
    cert = x509.load_pem_x509_certificate(cert_pem)
    return cert.not_valid_before_utc, cert.not_valid_after_utc


class CertificateUnusable(Exception):
    """The certificate files at start cannot be served with; the message says why."""


def _why(exc: Exception) -> str:
    if isinstance(exc, ssl.SSLError):
        if exc.reason == "KEY_VALUES_MISMATCH":
            return "the key is not the certificate's (a mismatched pair)"
        return f"not a PEM certificate and its PEM private key ({exc.reason or exc})"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)


@dataclass(slots=True)
class CertState:
    loaded: bool = False
    error: str | None = None
    signature: tuple[object, ...] | None = None
    not_before: dt.datetime | None = None
    not_after: dt.datetime | None = None
    warned_for: dt.datetime | None = None  # the notAfter the expiry warning was logged for


WARN_BEFORE_MAX = dt.timedelta(days=14)


def expiry_warning(not_before: dt.datetime, not_after: dt.datetime, now: dt.datetime) -> str | None:
    """A warning once less than a fifth of the certificate's life (at most 14 days) is
    left: by then whatever renews it (the reconciler and cert-manager renew a third ahead)
    should have."""
    left = not_after - now
    if left > min((not_after - not_before) / 5, WARN_BEFORE_MAX):
        return None
    when = not_after.strftime("%Y-%m-%dT%H:%M:%SZ")
    if left <= dt.timedelta(0):
        return f"the serving certificate EXPIRED at {when}: the API server refuses it"
    return (
        f"the serving certificate expires at {when} ({_span(left)} left) and has not been "
        "renewed: check what renews it (the reconciler's certificate keeper, cert-manager)"
    )


def _span(left: dt.timedelta) -> str:
    seconds = int(left.total_seconds())
    if seconds >= 86400:
        return f"{seconds // 86400}d {seconds % 86400 // 3600}h"
    if seconds >= 3600:
        return f"{seconds // 3600}h {seconds % 3600 // 60}m"
    return f"{seconds // 60}m {seconds % 60}s"


class ServingCertificate:
    """Owns the SSLContext of the HTTPS listener and keeps it in step with the files."""

    def __init__(self, cert_dir: Path, metrics: WebhookMetrics) -> None:
        self.cert_path = cert_dir / CERT_FILE
        self.key_path = cert_dir / KEY_FILE
        self.metrics = metrics
        self.state = CertState()
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.context.options |= ssl.OP_NO_COMPRESSION
        self.context.set_ciphers("ECDHE+AESGCM:ECDHE+CHACHA20")  # TLS 1.2 suites; 1.3 default

    def load(self) -> None:
        """Load the files now; raise CertificateUnusable, saying why, on failure (used at
        start: no certificate, no serving)."""
        try:
            signature = (_signature(self.cert_path), _signature(self.key_path))
            self.context.load_cert_chain(self.cert_path, self.key_path)
            validity = _validity(self.cert_path.read_bytes())
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise CertificateUnusable(
                f"cannot serve with {self.cert_path} and {self.key_path}: {_why(exc)}"
            ) from None
        self.state.loaded = True
        self.state.error = None
        self.state.signature = signature
        self._in_use(*validity)

    def maybe_reload(self) -> bool:
        """Reload when the files changed; keep the old certificate if the new pair is bad.
        Returns True when a new certificate went into use."""
        try:
            signature = (_signature(self.cert_path), _signature(self.key_path))
        except OSError as exc:
            self._failed(f"cannot read the certificate files: {exc}")
            return False
        if signature == self.state.signature:
            return False
        try:
            self.context.load_cert_chain(self.cert_path, self.key_path)
            validity = _validity(self.cert_path.read_bytes())
        except (OSError, ssl.SSLError, ValueError) as exc:
            # A rotation writes two files: between them the pair does not match. Retry on the
            # next poll instead of marking the signature seen.
            self._failed(f"new certificate not loaded, still serving the old one: {exc}")
            return False
        self.state.signature = signature
        self.state.error = None
        self._in_use(*validity)
        self.metrics.cert_reloads.labels("success").inc()
        log.info("serving certificate reloaded", extra={"not_after": validity[1].isoformat()})
        return True

    def _in_use(self, not_before: dt.datetime, not_after: dt.datetime) -> None:
        self.state.not_before, self.state.not_after = not_before, not_after
        self.metrics.cert_not_after.set(not_after.timestamp())

    def warning(self, now: dt.datetime | None = None) -> str | None:
        """The expiry warning for ``/readyz``; logged once per certificate."""
        state = self.state
        if state.not_before is None or state.not_after is None:
            return None
        message = expiry_warning(state.not_before, state.not_after, now or dt.datetime.now(dt.UTC))
        if message is not None and state.warned_for != state.not_after:
            state.warned_for = state.not_after
            log.warning(message, extra={"not_after": state.not_after.isoformat()})
        return message

    def _failed(self, message: str) -> None:
        if self.state.error != message:
            log.warning(message)
            self.metrics.cert_reloads.labels("error").inc()
        self.state.error = message
