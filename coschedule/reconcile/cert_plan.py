"""When the webhook's certificate is renewed, and what is written: a pure decision over the
two Secrets and the caBundles as observed (no I/O, no clock, no randomness).

The CA lives long in its own Secret; the serving certificate it signs is renewed often. The
trust bundle (the caBundle of every webhook) is the current CA plus every earlier CA that is
still valid, so a serving certificate the webhook still serves while the kubelet syncs the
new Secret (about a minute) stays trusted. Order of a rotation, one step per look:

1. a new CA when there is none (or it expires within ``ca_renew_before``), keeping the
   earlier CAs in the stored trust bundle;
2. the stored bundle brought up to date (expired CAs dropped, the serving Secret's CAs added);
3. every caBundle set to the stored bundle (this also repairs one a ``kubectl apply`` or a
   ``helm upgrade --force`` emptied);
4. only once every caBundle has held it for ``settle``: a serving certificate from the
   current CA, when the one in the Secret is missing, is not this CA's, does not cover the
   names or expires within ``renew_before``.
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from coschedule.certs import KeyPair

MIN_RENEW_BEFORE = dt.timedelta(seconds=60)  # the kubelet's Secret sync must fit before expiry


@dataclass(frozen=True, slots=True)
class RotationPolicy:
    """What the reconciler keeps: names, lifetimes, margins (flags of ``reconcile``)."""

    names: tuple[str, ...]
    validity: dt.timedelta = dt.timedelta(days=90)
    renew_before: dt.timedelta = dt.timedelta(days=30)
    ca_validity: dt.timedelta = dt.timedelta(days=5 * 365)
    ca_renew_before: dt.timedelta = dt.timedelta(days=365)
    # A new CA is trusted by every caBundle this long before a certificate it signed is
    # written (the API servers pick up a webhook configuration within about a second).
    settle: dt.timedelta = dt.timedelta(seconds=10)
    recheck: dt.timedelta = dt.timedelta(seconds=60)  # look again at least this often

    def problem(self) -> str | None:
        """Why these lifetimes cannot work (None: they can)."""
        if self.renew_before < MIN_RENEW_BEFORE:
            return "renew-before must be 60s or more (the kubelet syncs a Secret in about 1 min)"
        if self.validity <= self.renew_before:
            return "the certificate's validity must be longer than its renew-before"
        if self.ca_validity <= self.ca_renew_before:
            return "the CA's validity must be longer than its renew-before"
        if self.ca_renew_before <= self.renew_before:
            # Else a certificate issued by a CA close to its renewal would be due at once.
            return "the CA's renew-before must be longer than the certificate's"
        return None


@dataclass(frozen=True, slots=True)
class CertObserved:
    """The two Secrets and the published caBundles, as read (PEM bytes; b"" when absent)."""

    ca: KeyPair | None  # the CA Secret's tls.crt and tls.key
    stored_trust: bytes  # the CA Secret's ca.crt: the trust bundle
    serving_exists: bool
    serving: KeyPair | None  # the serving Secret's tls.crt and tls.key
    serving_trust: bytes  # the serving Secret's ca.crt
    published: tuple[bytes, ...]  # every webhook's caBundle, decoded; () when no config found
    published_since: dt.datetime | None  # since when ``published`` has not changed


class StepKind(enum.Enum):
    WAIT = "wait"
    NEW_CA = "new-ca"
    STORE_TRUST = "store-trust"
    PUBLISH = "publish"
    ISSUE = "issue"


@dataclass(frozen=True, slots=True)
class Step:
    kind: StepKind
    why: str
    trust: tuple[bytes, ...] = ()  # PEM certificates: the bundle to store/publish, or to keep
    after: float = 0.0  # WAIT: seconds until the next look


def pem_certificates(data: bytes) -> list[x509.Certificate]:
    """Every certificate of a PEM bundle; garbage yields none."""
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError:
        return []


def fingerprint(cert: x509.Certificate) -> str:
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _pair(pair: KeyPair | None) -> x509.Certificate | None:
    """The certificate when its key is the one beside it (else None)."""
    if pair is None:
        return None
    try:
        cert = x509.load_pem_x509_certificate(pair.cert_pem)
        key = serialization.load_pem_private_key(pair.key_pem, password=None)
    except (ValueError, TypeError):
        return None
    same = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) == cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return cert if same else None


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _covers(cert: x509.Certificate, names: tuple[str, ...]) -> bool:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    covered = {str(n) for n in san.get_values_for_type(x509.DNSName)}
    covered |= {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    return set(names) <= covered


def _iso(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def trust_bundle(
    current: x509.Certificate | None, observed: CertObserved, now: dt.datetime
) -> list[x509.Certificate]:
    """The current CA first, then every other CA still valid that the Secrets name, the
    longest-lived first."""
    seen: set[str] = set()
    others: list[x509.Certificate] = []
    for cert in pem_certificates(observed.stored_trust) + pem_certificates(observed.serving_trust):
        key = fingerprint(cert)
        if key in seen or not _is_ca(cert) or cert.not_valid_after_utc <= now:
            continue
        seen.add(key)
        if current is None or key != fingerprint(current):
            others.append(cert)
    others.sort(key=lambda c: c.not_valid_after_utc, reverse=True)
    return ([current] if current is not None else []) + others


def _fingerprints(data: bytes) -> frozenset[str]:
    return frozenset(fingerprint(c) for c in pem_certificates(data))


def serving_problem(
    serving: x509.Certificate | None,
    ca: x509.Certificate,
    policy: RotationPolicy,
    now: dt.datetime,
) -> str | None:
    """Why the serving certificate must be replaced (None: it is good)."""
    if serving is None:
        return "the serving Secret holds no usable certificate and key"
    if not _signed_by(serving, ca):
        return "the serving certificate is not signed by the current CA"
    if not _covers(serving, policy.names):
        return f"the serving certificate does not cover {', '.join(policy.names)}"
    if serving.not_valid_after_utc - now <= policy.renew_before:
        return f"the serving certificate expires at {_iso(serving.not_valid_after_utc)}"
    return None


def decide(observed: CertObserved, policy: RotationPolicy, now: dt.datetime) -> Step:
    """The next step (one per look; the caller looks again after acting)."""
    recheck = policy.recheck.total_seconds()
    if not observed.serving_exists:
        return Step(StepKind.WAIT, "the serving Secret does not exist yet", after=10.0)
    ca = _pair(observed.ca)
    if ca is None or not _is_ca(ca):
        why = "no CA yet" if observed.ca is None else "the CA Secret holds no usable CA"
        keep = trust_bundle(None, observed, now)
        return Step(StepKind.NEW_CA, why, tuple(pem(c) for c in keep))
    if ca.not_valid_after_utc - now <= policy.ca_renew_before:
        keep = trust_bundle(ca, observed, now)
        why = f"the CA expires at {_iso(ca.not_valid_after_utc)}"
        return Step(StepKind.NEW_CA, why, tuple(pem(c) for c in keep))
    bundle = trust_bundle(ca, observed, now)
    wanted = frozenset(fingerprint(c) for c in bundle)
    as_pem = tuple(pem(c) for c in bundle)
    if _fingerprints(observed.stored_trust) != wanted:
        return Step(StepKind.STORE_TRUST, "the stored trust bundle is out of date", as_pem)
    if not observed.published:
        return Step(StepKind.WAIT, "no webhook configuration to publish the CA in", after=10.0)
    if any(_fingerprints(b) != wanted for b in observed.published):
        return Step(StepKind.PUBLISH, "a caBundle differs from the trust bundle", as_pem)
    serving = _pair(observed.serving)
    problem = serving_problem(serving, ca, policy, now)
    if problem is not None:
        since = observed.published_since
        waited = (now - since).total_seconds() if since is not None else 0.0
        left = policy.settle.total_seconds() - waited
        if left > 0:
            why = f"{problem}; the caBundles trust the CA, waiting for the API servers"
            return Step(StepKind.WAIT, why, after=left)
        return Step(StepKind.ISSUE, problem, as_pem)
    assert serving is not None
    due = [
        serving.not_valid_after_utc - policy.renew_before,
        ca.not_valid_after_utc - policy.ca_renew_before,
        *(c.not_valid_after_utc for c in bundle[1:]),  # an older CA leaves when it expires
    ]
    after = min([recheck, *((d - now).total_seconds() for d in due)])
    return Step(StepKind.WAIT, "certificates good", after=max(1.0, after))


def describe(observed: CertObserved, policy: RotationPolicy, now: dt.datetime) -> str:
    """One line for ``/readyz``: what is in use and when it is renewed."""
    ca = _pair(observed.ca)
    serving = _pair(observed.serving)
    parts = []
    if serving is not None:
        renew = serving.not_valid_after_utc - policy.renew_before
        parts.append(
            f"serving certificate valid until {_iso(serving.not_valid_after_utc)}, "
            f"renewed from {_iso(renew)}"
        )
    else:
        parts.append("no serving certificate yet")
    if ca is not None:
        parts.append(f"CA valid until {_iso(ca.not_valid_after_utc)}")
    if serving is not None and serving.not_valid_after_utc <= now:
        parts.insert(0, "EXPIRED")
    return "; ".join(parts)
