"""Certificates and keys for a throwaway control plane, made with ``cryptography`` alone."""

from __future__ import annotations

import datetime as dt
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

APISERVER_SANS: tuple[str, ...] = (
    "127.0.0.1",
    "10.0.0.1",
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True, slots=True)
class Pki:
    """Paths of everything kube-apiserver and its clients need."""

    folder: Path
    ca_crt: Path
    apiserver_crt: Path
    apiserver_key: Path
    sa_key: Path
    sa_pub: Path
    tokens_csv: Path
    admin_token: str


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, mode: int = 0o600) -> Path:
    path.write_bytes(data)
    path.chmod(mode)
    return path


def make_pki(folder: Path) -> Pki:
    """A CA, the apiserver's serving certificate, a ServiceAccount signing key and an admin
    token (``system:masters``) in ``tokens.csv``."""
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    later = now + dt.timedelta(days=2)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "e2e-kubernetes-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(later)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )

    sans: list[x509.GeneralName] = []
    for name in APISERVER_SANS:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(later)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    admin_token = secrets.token_hex(24)
    pem = serialization.Encoding.PEM
    return Pki(
        folder=folder,
        ca_crt=_write(folder / "ca.crt", ca.public_bytes(pem), 0o644),
        apiserver_crt=_write(folder / "apiserver.crt", server.public_bytes(pem), 0o644),
        apiserver_key=_write(folder / "apiserver.key", _pem_key(server_key)),
        sa_key=_write(folder / "sa.key", _pem_key(sa_key)),
        sa_pub=_write(
            folder / "sa.pub",
            sa_key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo),
            0o644,
        ),
        tokens_csv=_write(
            folder / "tokens.csv", f'{admin_token},admin,admin-uid,"system:masters"\n'.encode()
        ),
        admin_token=admin_token,
    )


def write_kubeconfig(path: Path, server: str, ca_file: Path, token: str, user: str) -> Path:
    """A kubeconfig with one cluster, one token user and one current context."""
    import yaml

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "e2e", "cluster": {"server": server, "certificate-authority": str(ca_file)}}
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
        "current-context": "e2e",
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return path
