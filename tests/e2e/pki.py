"""Certificates and keys for a throwaway control plane, made with ``cryptography`` alone."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from coschedule import certs

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


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
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
    # The webhook's own certificate maker serves the apiserver too: a CA and a serving
    # certificate for these names (IP addresses become IP SANs).
    bundle = certs.generate(list(APISERVER_SANS), days=2)

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    admin_token = secrets.token_hex(24)
    pem = serialization.Encoding.PEM
    return Pki(
        folder=folder,
        ca_crt=_write(folder / "ca.crt", bundle.ca_pem, 0o644),
        apiserver_crt=_write(folder / "apiserver.crt", bundle.cert_pem, 0o644),
        apiserver_key=_write(folder / "apiserver.key", bundle.key_pem),
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
