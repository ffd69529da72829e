"""The certificate keeper's pure decision: when to renew, and what to write, in which order.

The last test runs the decision against a simulated cluster for ninety minutes of certificates that
live minutes, with the kubelet's Secret sync lagging, and holds the one property that
matters: at every instant the certificate the webhook serves is valid and signed by a CA
that every caBundle trusts (no admission refused)."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest
from cryptography import x509

from coschedule import certs
from coschedule.certs import KeyPair
from coschedule.reconcile.cert_plan import (
    CertObserved,
    RotationPolicy,
    StepKind,
    decide,
    describe,
    fingerprint,
    pem_certificates,
)

NAMES = ("coschedule-webhook.coschedule-system.svc", "coschedule-webhook")
T0 = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)
MIN = dt.timedelta(minutes=1)
# Certificates made to live minutes, as the real-tier scenario runs them.
POLICY = RotationPolicy(
    names=NAMES,
    validity=4 * MIN,
    renew_before=2 * MIN,
    ca_validity=12 * MIN,
    ca_renew_before=5 * MIN,
    settle=dt.timedelta(seconds=10),
)


def ca_at(now: dt.datetime, validity: dt.timedelta = POLICY.ca_validity) -> KeyPair:
    return certs.generate_ca(validity, now=now)


def serving_of(ca: KeyPair, now: dt.datetime, names: tuple[str, ...] = NAMES) -> KeyPair:
    return certs.issue_serving(ca, list(names), POLICY.validity, now=now)


def steady(now: dt.datetime = T0) -> CertObserved:
    """A CA, its serving certificate, the bundle stored and published long ago."""
    ca = ca_at(now)
    return CertObserved(
        ca=ca,
        stored_trust=ca.cert_pem,
        serving_exists=True,
        serving=serving_of(ca, now),
        serving_trust=ca.cert_pem,
        published=(ca.cert_pem, ca.cert_pem),
        published_since=now - dt.timedelta(hours=1),
    )


def prints(pems: tuple[bytes, ...] | bytes) -> set[str]:
    data = b"".join(pems) if isinstance(pems, tuple) else pems
    return {fingerprint(c) for c in pem_certificates(data)}


def test_a_steady_certificate_waits_until_its_renewal_is_due() -> None:
    observed = steady()
    lazy = replace(POLICY, recheck=dt.timedelta(hours=1))
    step = decide(observed, lazy, T0 + dt.timedelta(seconds=30))
    assert step.kind is StepKind.WAIT
    # renewal due at notAfter - renew_before = T0 + 2 min: 90 s from now
    assert step.after == pytest.approx(90, abs=1)
    # and never later than the recheck (a Secret edited by hand is seen)
    assert decide(observed, POLICY, T0 + dt.timedelta(seconds=30)).after == 60


def test_the_serving_certificate_is_renewed_within_renew_before() -> None:
    observed = steady()
    step = decide(observed, POLICY, T0 + 2 * MIN + dt.timedelta(seconds=1))
    assert step.kind is StepKind.ISSUE
    assert "expires at 2026-11-26T12:04:00Z" in step.why
    assert prints(step.trust) == prints(observed.stored_trust)


def test_the_jobs_first_certificate_gets_a_ca_of_our_own_and_stays_trusted() -> None:
    """Upgrade and fresh install: the certs Job made a CA without keeping its key."""
    job = certs.generate(list(NAMES), days=90, now=T0)
    observed = CertObserved(
        ca=None,
        stored_trust=b"",
        serving_exists=True,
        serving=KeyPair(job.cert_pem, job.key_pem),
        serving_trust=job.ca_pem,
        published=(job.ca_pem,),
        published_since=T0,
    )
    step = decide(observed, POLICY, T0)
    assert step.kind is StepKind.NEW_CA
    assert prints(step.trust) == prints(job.ca_pem)  # the Job's CA is kept
    ours = ca_at(T0)
    observed = replace(observed, ca=ours, stored_trust=ours.cert_pem + job.ca_pem)
    step = decide(observed, POLICY, T0)
    assert step.kind is StepKind.PUBLISH
    assert prints(step.trust) == prints(ours.cert_pem + job.ca_pem)
    observed = replace(observed, published=(b"".join(step.trust),), published_since=T0)
    step = decide(observed, POLICY, T0 + dt.timedelta(seconds=3))
    assert step.kind is StepKind.WAIT, "no certificate of the new CA before the bundle settled"
    assert step.after == pytest.approx(7)
    step = decide(observed, POLICY, T0 + dt.timedelta(seconds=10))
    assert step.kind is StepKind.ISSUE
    assert "not signed by the current CA" in step.why


def test_an_emptied_ca_bundle_is_repaired() -> None:
    observed = replace(steady(), published=(b"", steady().stored_trust))
    step = decide(observed, POLICY, T0 + dt.timedelta(seconds=30))
    assert step.kind is StepKind.PUBLISH
    assert prints(step.trust) == prints(observed.stored_trust)


def test_a_ca_near_its_end_is_replaced_and_kept_trusted_until_it_expires() -> None:
    observed = steady()
    old = observed.ca
    assert old is not None
    now = T0 + POLICY.ca_validity - POLICY.ca_renew_before + dt.timedelta(seconds=1)
    step = decide(observed, POLICY, now)
    assert step.kind is StepKind.NEW_CA
    assert prints(step.trust) == prints(old.cert_pem)
    new = ca_at(now)
    stored = new.cert_pem + b"".join(step.trust)
    observed = replace(observed, ca=new, stored_trust=stored)
    assert decide(observed, POLICY, now).kind is StepKind.PUBLISH
    # Once the old CA expired, the stored bundle drops it, then the caBundles do.
    later = T0 + POLICY.ca_validity + dt.timedelta(seconds=1)
    observed = replace(
        observed,
        published=(stored,),
        serving=serving_of(new, now),
        serving_trust=stored,
        published_since=now,
    )
    step = decide(observed, POLICY, later)
    assert step.kind is StepKind.STORE_TRUST
    assert prints(step.trust) == prints(new.cert_pem)


def test_a_certificate_for_other_names_is_replaced() -> None:
    observed = steady()
    assert observed.ca is not None
    observed = replace(observed, serving=serving_of(observed.ca, T0, ("elsewhere.example",)))
    step = decide(observed, POLICY, T0 + dt.timedelta(seconds=30))
    assert step.kind is StepKind.ISSUE
    assert "does not cover" in step.why


def test_a_mismatched_key_is_replaced() -> None:
    observed = steady()
    assert observed.ca is not None
    assert observed.serving is not None
    other = serving_of(observed.ca, T0)
    observed = replace(observed, serving=KeyPair(observed.serving.cert_pem, other.key_pem))
    step = decide(observed, POLICY, T0 + dt.timedelta(seconds=30))
    assert step.kind is StepKind.ISSUE
    assert "no usable certificate" in step.why


def test_without_the_serving_secret_nothing_is_written() -> None:
    observed = replace(steady(), serving_exists=False, serving=None)
    assert decide(observed, POLICY, T0).kind is StepKind.WAIT


def test_without_a_webhook_configuration_nothing_is_issued() -> None:
    observed = replace(steady(), published=())
    assert decide(observed, POLICY, T0 + MIN).kind is StepKind.WAIT


def test_readyz_detail_says_what_is_in_use() -> None:
    text = describe(steady(), POLICY, T0)
    assert "serving certificate valid until 2026-11-26T12:04:00Z" in text
    assert "renewed from 2026-11-26T12:02:00Z" in text
    assert "CA valid until" in text
    assert describe(steady(), POLICY, T0 + 5 * MIN).startswith("EXPIRED")


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"renew_before": dt.timedelta(seconds=30)}, "60s or more"),
        ({"validity": 2 * MIN}, "validity must be longer"),
        ({"ca_validity": 5 * MIN}, "CA's validity"),
        ({"ca_renew_before": 2 * MIN, "ca_validity": 10 * MIN}, "CA's renew-before"),
    ],
)
def test_lifetimes_that_cannot_work_are_refused(change: dict[str, object], says: str) -> None:
    problem = replace(POLICY, **change).problem()  # type: ignore[arg-type]
    assert problem is not None
    assert says in problem
    assert POLICY.problem() is None


def _trusted(served: KeyPair, bundles: tuple[bytes, ...], now: dt.datetime) -> bool:
    """What the API server checks: the served certificate is valid now and one CA of every
    caBundle signed it."""
    cert = x509.load_pem_x509_certificate(served.cert_pem)
    if not cert.not_valid_before_utc <= now < cert.not_valid_after_utc:
        return False
    for bundle in bundles:
        ok = False
        for ca in pem_certificates(bundle):
            try:
                cert.verify_directly_issued_by(ca)
            except Exception:
                continue
            ok = ca.not_valid_before_utc <= now < ca.not_valid_after_utc
            if ok:
                break
        if not ok:
            return False
    return True


@pytest.mark.parametrize("lag", [0, 45, 90])
def test_hours_of_minute_certificates_never_leave_the_webhook_untrusted(lag: int) -> None:
    """Simulated: the keeper looks every 5 s (and right after each write); the webhook
    serves the Secret as the kubelet synced it ``lag`` seconds ago; the API servers trust
    the caBundle at once. Ninety minutes: many serving renewals and CA rotations."""
    job = certs.generate(list(NAMES), days=1, now=T0)
    ca_secret: dict[str, bytes] = {}
    serving_secret = {"tls.crt": job.cert_pem, "tls.key": job.key_pem, "ca.crt": job.ca_pem}
    published = (job.ca_pem, job.ca_pem)
    published_since = T0
    first = KeyPair(job.cert_pem, job.key_pem)
    history: list[tuple[dt.datetime, KeyPair]] = [(T0 - dt.timedelta(hours=1), first)]
    counts = dict.fromkeys(StepKind, 0)
    now = T0
    end = T0 + dt.timedelta(minutes=90)
    while now < end:
        for _ in range(8):
            observed = CertObserved(
                ca=KeyPair(ca_secret["tls.crt"], ca_secret["tls.key"]) if ca_secret else None,
                stored_trust=ca_secret.get("ca.crt", b""),
                serving_exists=True,
                serving=KeyPair(serving_secret["tls.crt"], serving_secret["tls.key"]),
                serving_trust=serving_secret["ca.crt"],
                published=published,
                published_since=published_since,
            )
            step = decide(observed, POLICY, now)
            counts[step.kind] += 1
            if step.kind is StepKind.WAIT:
                break
            if step.kind is StepKind.NEW_CA:
                ca = certs.generate_ca(POLICY.ca_validity, now=now)
                ca_secret = {
                    "tls.crt": ca.cert_pem,
                    "tls.key": ca.key_pem,
                    "ca.crt": ca.cert_pem + b"".join(step.trust),
                }
            elif step.kind is StepKind.STORE_TRUST:
                ca_secret["ca.crt"] = b"".join(step.trust)
            elif step.kind is StepKind.PUBLISH:
                published = (b"".join(step.trust),) * 2
                published_since = now
            elif step.kind is StepKind.ISSUE:
                pair = certs.issue_serving(
                    KeyPair(ca_secret["tls.crt"], ca_secret["tls.key"]),
                    list(NAMES),
                    POLICY.validity,
                    now=now,
                )
                serving_secret = {
                    "tls.crt": pair.cert_pem,
                    "tls.key": pair.key_pem,
                    "ca.crt": b"".join(step.trust),
                }
                history.append((now, pair))
        else:
            pytest.fail(f"not steady at {now}: {step}")
        served = [pair for written, pair in history if written <= now - dt.timedelta(seconds=lag)]
        assert _trusted(served[-1], published, now), f"refused at {now - T0} (lag {lag}s)"
        now += dt.timedelta(seconds=5)
    assert counts[StepKind.ISSUE] >= 40  # about one every 2 minutes
    assert counts[StepKind.NEW_CA] >= 10  # about one every 7 minutes
