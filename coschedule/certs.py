"""A CA and a serving certificate for the webhook, written as a ``kubernetes.io/tls`` folder.

``tls.crt``, ``tls.key`` and ``ca.crt`` are the key names of a TLS Secret, so a mounted
Secret is a cert folder as it is, and ``certs --out DIR`` output can become one.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
CA_FILE = "ca.crt"

LOCAL_NAMES: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True, slots=True)
class CertBundle:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    @property
    def ca_bundle(self) -> str:
        """The MutatingWebhookConfiguration's ``caBundle``: base64 of the CA PEM."""
        return base64.b64encode(self.ca_pem).decode("ascii")


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names kube-apiserver may dial a Service by."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """Digital signatures (the TLS handshake's ECDSA); a CA also signs certificates and CRLs."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


# A DNS name a certificate may carry: RFC 1123 labels of at most 63 characters, 253 in all;
# the first label may be a wildcard.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", re.IGNORECASE)
COMMON_NAME_MAX = 64  # X.509's upper bound on a common name (RFC 5280)


def check_names(names: list[str]) -> None:
    """Raise ValueError, saying which and why, unless every name is a DNS name or an IP
    address and the first (the certificate's common name) fits in 64 characters."""
    if not names:
        raise ValueError("at least one DNS name or IP address is needed")
    for name in names:
        if not name:
            raise ValueError("an empty name; give a DNS name or an IP address")
        try:
            ipaddress.ip_address(name)
            continue
        except ValueError:
            pass
        labels = name.split(".")
        if labels[0] == "*" and len(labels) > 1:
            labels = labels[1:]
        if len(name) > 253 or not all(_DNS_LABEL.match(label) for label in labels):
            raise ValueError(f"{name[:100]!r} is neither a DNS name nor an IP address")
    if len(names[0]) > COMMON_NAME_MAX:
        raise ValueError(
            f"{names[0][:100]!r} has {len(names[0])} characters: the first name is the "
            f"certificate's common name, at most {COMMON_NAME_MAX}; give a shorter name first"
        )


def _san(names: list[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


SKEW = dt.timedelta(minutes=5)  # notBefore this far back: clocks of other machines


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A certificate and its private key, PEM."""

    cert_pem: bytes
    key_pem: bytes


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def generate_ca(validity: dt.timedelta, *, now: dt.datetime | None = None) -> KeyPair:
    """A CA (P-256) valid from now for ``validity``, that signs serving certificates."""
    now = now or dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "coschedule-ca")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - SKEW)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            _key_usage(signs_certificates=True),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(ca_cert.public_bytes(serialization.Encoding.PEM), _pem_key(ca_key))


def issue_serving(
    ca: KeyPair, dns_names: list[str], validity: dt.timedelta, *, now: dt.datetime | None = None
) -> KeyPair:
    """A serving certificate for ``dns_names`` signed by ``ca``; it never outlives the CA."""
    check_names(dns_names)
    now = now or dt.datetime.now(dt.UTC)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an EC key")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(max(now - SKEW, ca_cert.not_valid_before_utc))
        .not_valid_after(min(now + validity, ca_cert.not_valid_after_utc))
        .add_extension(_san(dns_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            _key_usage(signs_certificates=False),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def generate(
    dns_names: list[str], *, days: int = 365, now: dt.datetime | None = None
) -> CertBundle:
    """A fresh CA (P-256, valid twice as long) and a serving certificate it signs."""
    check_names(dns_names)
    now = now or dt.datetime.now(dt.UTC)
    ca = generate_ca(dt.timedelta(days=days * 2), now=now)
    serving = issue_serving(ca, dns_names, dt.timedelta(days=days), now=now)
    return CertBundle(ca_pem=ca.cert_pem, cert_pem=serving.cert_pem, key_pem=serving.key_pem)


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def write_bundle(bundle: CertBundle, out: Path) -> None:
    """Write the folder; the key last, and each file by rename, so a reader polling the
    folder never sees a half-written file."""
    out.mkdir(parents=True, exist_ok=True)
    _write_atomic(out / CA_FILE, bundle.ca_pem, 0o644)
    _write_atomic(out / CERT_FILE, bundle.cert_pem, 0o644)
    _write_atomic(out / KEY_FILE, bundle.key_pem, 0o600)


def ensure_self_signed(cert_dir: Path) -> bool:
    """Make a local certificate when the folder has none; True when one was made."""
    if (cert_dir / CERT_FILE).exists() and (cert_dir / KEY_FILE).exists():
        return False
    write_bundle(generate(list(LOCAL_NAMES)), cert_dir)
    return True
