"""The serving TLS context, reloaded in place when cert-manager rotates the files.

``SSLContext.load_cert_chain`` on the live context swaps the certificate for every new
handshake; connections already open keep theirs, so a rotation fails no request.
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from coschedule.certs import CERT_FILE, KEY_FILE, not_after
from coschedule.server.webhook_metrics import WebhookMetrics

log = logging.getLogger("coschedule.tls")


def _signature(path: Path) -> tuple[int, int, int, int]:
    # stat follows the ..data symlink of a mounted Secret, so a swap changes inode and mtime.
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns, st.st_size, st.st_dev


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
            expiry = not_after(self.cert_path.read_bytes())
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise CertificateUnusable(
                f"cannot serve with {self.cert_path} and {self.key_path}: {_why(exc)}"
            ) from None
        self.state.loaded = True
        self.state.error = None
        self.state.signature = signature
        self.metrics.cert_not_after.set(expiry.timestamp())

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
            expiry = not_after(self.cert_path.read_bytes())
        except (OSError, ssl.SSLError, ValueError) as exc:
            # A rotation writes two files: between them the pair does not match. Retry on the
            # next poll instead of marking the signature seen.
            self._failed(f"new certificate not loaded, still serving the old one: {exc}")
            return False
        self.state.signature = signature
        self.state.error = None
        self.metrics.cert_not_after.set(expiry.timestamp())
        self.metrics.cert_reloads.labels("success").inc()
        log.info("serving certificate reloaded", extra={"not_after": expiry.isoformat()})
        return True

    def _failed(self, message: str) -> None:
        if self.state.error != message:
            log.warning(message)
            self.metrics.cert_reloads.labels("error").inc()
        self.state.error = message
