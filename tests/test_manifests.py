"""The shipped manifests: rendered with kustomize, valid against the Kubernetes schemas
(offline), and faithful to the design's policy (webhook registration, RBAC, Pod Security).

Each overlay is rendered with ``kubectl kustomize`` (or a standalone ``kustomize``); every
built-in object is validated by ``kubernetes-validate`` against the bundled JSON schemas of
the oldest Kubernetes we support (1.30: ``matchConditions`` went GA) and of the one the
project is accepted on (1.36), in strict mode (unknown fields are errors). cert-manager's
objects have no bundled schema: they are checked structurally here.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import io
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from coschedule import certs, marks
from coschedule.cli.main import build_parser
from coschedule.config.settings import KNOWN_KEYS, Settings, parse_settings
from tests.chart import render_chart
from tests.fixtures import load_pod

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "manifests"
BASE = "base"
CERT_MANAGER = "overlays/cert-manager"
SELF_SIGNED = "overlays/self-signed"
CRDS = "crds"  # applied on its own, before an overlay
# The Helm chart with its defaults, for each certificate source: every check below holds
# for it as for the kustomize overlays (tests/test_chart.py has the chart's own).
CHART_SELF_SIGNED = "chart:self-signed"
CHART_CERT_MANAGER = "chart:cert-manager"
TARGETS = (BASE, CERT_MANAGER, SELF_SIGNED, CHART_SELF_SIGNED, CHART_CERT_MANAGER)
OVERLAYS = (CERT_MANAGER, SELF_SIGNED, CHART_SELF_SIGNED, CHART_CERT_MANAGER)
# Those that render the Namespace (the chart's is the release's: helm --create-namespace).
KUSTOMIZE_TARGETS = (BASE, CERT_MANAGER, SELF_SIGNED)

K8S_VERSIONS = ("1.30", "1.36")
NAMESPACE = "coschedule-system"
SERVICE = "coschedule-webhook"
TLS_SECRET = "coschedule-webhook-tls"
CA_SECRET = "coschedule-webhook-ca"
CONFIGMAP = "coschedule-config"
WEBHOOK_CONFIG = "coschedule"
WEBHOOK_NAME = "pods.coschedule.dev"
RUNS_WEBHOOK_NAME = "runs.coschedule.dev"
IMAGE = "ghcr.io/coschedule/coschedule"
UID = 65532
CONFIG_DIR = "/etc/coschedule/config"
CERT_DIR = "/etc/coschedule/tls"

Obj = dict[str, Any]


# ---- rendering -------------------------------------------------------------------------


def _kustomize_command() -> list[str] | None:
    for kubectl in (shutil.which("kubectl"), "/usr/bin/kubectl"):
        if kubectl and Path(kubectl).is_file():
            return [kubectl, "kustomize"]
    standalone = shutil.which("kustomize")
    return [standalone, "build"] if standalone else None


@functools.cache
def _render_text(target: str) -> str:
    command = _kustomize_command()
    if command is None:
        pytest.skip("neither kubectl nor kustomize is installed: cannot render manifests/")
    done = subprocess.run(
        [*command, str(MANIFESTS / target)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"kustomize {target} failed:\n{done.stderr}")
    return done.stdout


def render(target: str) -> list[Obj]:
    """The objects of one kustomization (or of the chart: ``chart:SOURCE``), fresh copies
    (tests may not share mutations)."""
    if target.startswith("chart:"):
        source = target.removeprefix("chart:")
        return render_chart({"certificates": {"source": source}})
    docs = [doc for doc in yaml.safe_load_all(_render_text(target)) if doc]
    assert all(isinstance(doc, dict) for doc in docs)
    return copy.deepcopy(docs)


def objects(docs: list[Obj], kind: str) -> list[Obj]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: list[Obj], kind: str, name: str) -> Obj:
    found = [doc for doc in objects(docs, kind) if doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected exactly one {kind} {name}, found {len(found)}"
    return found[0]


def ident(obj: Obj) -> str:
    meta = obj["metadata"]
    ns = meta.get("namespace")
    return f"{obj['kind']} {ns + '/' if ns else ''}{meta['name']}"


def pod_templates(docs: list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    """(owner, pod template) for every workload."""
    for doc in docs:
        if doc["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            yield doc, doc["spec"]["template"]


def containers(pod: Obj) -> list[Obj]:
    spec = pod["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def mount_path(pod: Obj, container: Obj, *, secret: str = "", config_map: str = "") -> str:
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if secret and volume.get("secret", {}).get("secretName") == secret:
            return str(mount["mountPath"])
        if config_map and volume.get("configMap", {}).get("name") == config_map:
            return str(mount["mountPath"])
    raise AssertionError(f"container {container['name']} mounts no {secret or config_map}")


def container_port(container: Obj, port: int | str) -> int:
    if isinstance(port, int):
        return port
    for declared in container.get("ports", []):
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise AssertionError(f"container {container['name']} has no port named {port}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse like ``coschedule``; fail with argparse's own message on a bad flag."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"coschedule {' '.join(argv)}: {stderr.getvalue().strip()}")


@pytest.fixture(scope="module", params=TARGETS)
def rendered(request: pytest.FixtureRequest) -> list[Obj]:
    return render(str(request.param))


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> list[Obj]:
    return render(str(request.param))


# ---- schemas ---------------------------------------------------------------------------

_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DURATION = re.compile(r"^(\d+(\.\d+)?(h|m|s|ms))+$")


def _check_cert_manager(obj: Obj, docs: list[Obj]) -> list[str]:
    """cert-manager.io/v1 Issuer and Certificate: the fields we use, as its CRDs define them."""
    problems: list[str] = []
    allowed_top = {"apiVersion", "kind", "metadata", "spec"}
    if extra := set(obj) - allowed_top:
        problems.append(f"unknown top-level fields {sorted(extra)}")
    meta, spec = obj.get("metadata", {}), obj.get("spec")
    if not _DNS_NAME.match(str(meta.get("name", ""))):
        problems.append("metadata.name is not a DNS name")
    if meta.get("namespace") != NAMESPACE:
        problems.append(f"metadata.namespace is not {NAMESPACE}")
    if obj["apiVersion"] != "cert-manager.io/v1":
        problems.append("apiVersion must be cert-manager.io/v1")
    if not isinstance(spec, dict):
        return [*problems, "spec must be a mapping"]
    if obj["kind"] == "Issuer":
        kinds = [k for k in ("selfSigned", "ca", "acme", "vault", "venafi") if k in spec]
        if len(kinds) != 1 or set(spec) != set(kinds):
            problems.append("an Issuer's spec has exactly one issuer type")
        if "ca" in spec and not isinstance(spec["ca"].get("secretName"), str):
            problems.append("spec.ca.secretName is required")
        if "selfSigned" in spec and spec["selfSigned"] not in ({},):
            problems.append("spec.selfSigned takes no options here")
        return problems
    if obj["kind"] != "Certificate":
        return [*problems, f"no structural check for cert-manager kind {obj['kind']}"]
    known = {
        "secretName",
        "issuerRef",
        "commonName",
        "dnsNames",
        "isCA",
        "duration",
        "renewBefore",
        "privateKey",
        "usages",
    }
    if extra := set(spec) - known:
        problems.append(f"unexpected spec fields {sorted(extra)}")
    if not _DNS_NAME.match(str(spec.get("secretName", ""))):
        problems.append("spec.secretName is required and must be a DNS name")
    ref = spec.get("issuerRef", {})
    if ref.get("group") != "cert-manager.io" or ref.get("kind") != "Issuer":
        problems.append("spec.issuerRef must name a cert-manager.io Issuer")
    issuers = {d["metadata"]["name"] for d in objects(docs, "Issuer")}
    if ref.get("name") not in issuers:
        problems.append(f"spec.issuerRef.name {ref.get('name')!r} is not an Issuer rendered here")
    for key in ("duration", "renewBefore"):
        if key in spec and not _DURATION.match(str(spec[key])):
            problems.append(f"spec.{key} is not a Go duration")
    if "isCA" in spec and not isinstance(spec["isCA"], bool):
        problems.append("spec.isCA must be a boolean")
    names = spec.get("dnsNames", [])
    if not isinstance(names, list) or not all(_DNS_NAME.match(str(n)) for n in names):
        problems.append("spec.dnsNames must be a list of DNS names")
    if not names and not spec.get("commonName"):
        problems.append("a Certificate needs dnsNames or a commonName")
    key = spec.get("privateKey", {})
    if key.get("algorithm") not in (None, "RSA", "ECDSA", "Ed25519"):
        problems.append("spec.privateKey.algorithm must be RSA, ECDSA or Ed25519")
    if key.get("rotationPolicy") not in (None, "Never", "Always"):
        problems.append("spec.privateKey.rotationPolicy must be Never or Always")
    valid_usages = {"server auth", "client auth", "digital signature", "key encipherment"}
    if not set(spec.get("usages", [])) <= valid_usages:
        problems.append("spec.usages has an unexpected usage")
    return problems


# Objects that exist only from a Kubernetes version on: validated against the schemas of
# that version and newer. The admission policy (MutatingAdmissionPolicy v1, GA in 1.36) is
# left out of an older install (the chart's admissionPolicy.enabled, docs/deploy.md).
NEWER_KINDS = {
    ("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicy"): (1, 36),
    ("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicyBinding"): (1, 36),
}


def _check_monitoring(obj: Obj) -> list[str]:
    """The Prometheus Operator's kinds, structurally (their CRDs are not Kubernetes')."""
    spec = obj.get("spec") or {}
    if obj["kind"] == "ServiceMonitor":
        ok = spec.get("selector", {}).get("matchLabels") and all(
            e.get("port") for e in spec.get("endpoints") or [{}]
        )
        return [] if ok else ["a ServiceMonitor needs selector.matchLabels and endpoint ports"]
    if obj["kind"] == "PrometheusRule":
        problems = []
        for group in spec.get("groups") or [{}]:
            for rule in group.get("rules") or [{}]:
                if not (rule.get("alert") and isinstance(rule.get("expr"), str)):
                    problems.append(f"group {group.get('name')}: a rule without alert or expr")
        return problems
    return [f"unknown kind {obj['kind']}"]


def schema_problems(docs: list[Obj], version: str) -> list[str]:
    """Every object through kubernetes-validate (strict); cert-manager's structurally."""
    kv = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate (dev dependency) is not installed"
    )
    problems: list[str] = []
    numeric = tuple(int(part) for part in version.split("."))
    for obj in docs:
        since = NEWER_KINDS.get((obj["apiVersion"], obj["kind"]))
        if since is not None and numeric < since:
            continue
        if obj["apiVersion"].startswith("cert-manager.io/"):
            problems += [f"{ident(obj)}: {p}" for p in _check_cert_manager(obj, docs)]
            continue
        if obj["apiVersion"] == "monitoring.coreos.com/v1":
            problems += [f"{ident(obj)}: {p}" for p in _check_monitoring(obj)]
            continue
        try:
            kv.validate(obj, version, strict=True)
        except kv.ValidationError as exc:
            path = ".".join(str(part) for part in exc.path)
            problems.append(f"{ident(obj)}: {path}: {exc.message}")
        except kv.SchemaNotFoundError as exc:
            problems.append(f"{ident(obj)}: {exc.message}")
    return problems


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_is_valid_against_the_kubernetes_schemas(
    rendered: list[Obj], version: str
) -> None:
    problems = schema_problems(rendered, version)
    assert not problems, f"invalid against Kubernetes {version}:\n" + "\n".join(problems)


# The one Role and binding outside our namespace: a silent node's Lease, read by name.
NODE_LEASE_RBAC = {
    "Role kube-node-lease/coschedule-reconciler-node-leases",
    "RoleBinding kube-node-lease/coschedule-reconciler-node-leases",
}


def test_every_object_has_a_name_and_the_right_scope(rendered: list[Obj]) -> None:
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    cluster_scoped |= {"MutatingWebhookConfiguration", "CustomResourceDefinition"}
    cluster_scoped |= {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}
    seen: set[str] = set()
    for obj in rendered:
        meta = obj["metadata"]
        if obj["kind"] in cluster_scoped:
            assert "namespace" not in meta, ident(obj)
        elif ident(obj) in NODE_LEASE_RBAC:
            pass  # the kubelets' Leases live there
        else:
            assert meta.get("namespace") == NAMESPACE, f"{ident(obj)} is not in {NAMESPACE}"
        assert ident(obj) not in seen, f"{ident(obj)} rendered twice"
        seen.add(ident(obj))
        assert meta["labels"]["app.kubernetes.io/part-of"] == "coschedule", ident(obj)
        # Our own objects must never look like placeholders to the reconciler.
        assert meta["labels"].get(marks.LABEL_MANAGED_BY) != marks.MANAGED_BY, ident(obj)
        assert meta["labels"].get(marks.LABEL_COMPONENT) != (marks.COMPONENT_AFFINITY_ASSISTANT), (
            ident(obj)
        )


def test_base_has_the_expected_objects() -> None:
    docs = render(BASE)
    kinds = sorted(ident(obj) for obj in docs)
    assert kinds == sorted(
        [
            f"Namespace {NAMESPACE}",
            f"ServiceAccount {NAMESPACE}/coschedule-webhook",
            f"ServiceAccount {NAMESPACE}/coschedule-reconciler",
            "ClusterRole coschedule-webhook",
            "ClusterRoleBinding coschedule-webhook",
            "ClusterRole coschedule-reconciler",
            "ClusterRoleBinding coschedule-reconciler",
            f"Role {NAMESPACE}/coschedule-reconciler-leader-election",
            f"RoleBinding {NAMESPACE}/coschedule-reconciler-leader-election",
            "Role kube-node-lease/coschedule-reconciler-node-leases",
            "RoleBinding kube-node-lease/coschedule-reconciler-node-leases",
            f"ConfigMap {NAMESPACE}/{CONFIGMAP}",
            f"Deployment {NAMESPACE}/coschedule-webhook",
            f"PodDisruptionBudget {NAMESPACE}/coschedule-webhook",
            f"Service {NAMESPACE}/{SERVICE}",
            f"Service {NAMESPACE}/coschedule-webhook-metrics",
            f"Deployment {NAMESPACE}/coschedule-reconciler",
            f"Service {NAMESPACE}/coschedule-reconciler-metrics",
            f"PodDisruptionBudget {NAMESPACE}/coschedule-reconciler",
            f"MutatingWebhookConfiguration {WEBHOOK_CONFIG}",
            "MutatingAdmissionPolicy coschedule-gate-pods",
            "MutatingAdmissionPolicyBinding coschedule-gate-pods",
            "MutatingAdmissionPolicy coschedule-hold-runs",
            "MutatingAdmissionPolicyBinding coschedule-hold-runs",
        ]
    )


@pytest.mark.parametrize("target", [BASE, CERT_MANAGER, SELF_SIGNED])
def test_the_crd_is_in_its_own_kustomization(target: str) -> None:
    """``kubectl delete -k`` of an overlay deletes what it renders: no CRD there, so removing
    coschedule never deletes every ConcurrencyControl. ``manifests/crds`` has it alone,
    valid, labelled, and equal to the chart's crds/ (which Helm never deletes)."""
    assert not objects(render(target), "CustomResourceDefinition")
    crds = render(CRDS)
    assert [ident(obj) for obj in crds] == [
        "CustomResourceDefinition concurrencycontrols.coschedule.dev"
    ]
    for version in K8S_VERSIONS:
        assert schema_problems(crds, version) == []
    assert crds[0]["metadata"]["labels"]["app.kubernetes.io/part-of"] == "coschedule"
    assert "namespace" not in crds[0]["metadata"]
    chart = objects(render(CHART_SELF_SIGNED), "CustomResourceDefinition")
    assert chart == crds


# ---- the webhook registration ----------------------------------------------------------


def _webhook(docs: list[Obj], name: str = WEBHOOK_NAME) -> Obj:
    config = one(docs, "MutatingWebhookConfiguration", WEBHOOK_CONFIG)
    assert [h["name"] for h in config["webhooks"]] == [WEBHOOK_NAME, RUNS_WEBHOOK_NAME]
    (hook,) = [h for h in config["webhooks"] if h["name"] == name]
    return dict(hook)


def test_run_webhook_registration(rendered: list[Obj]) -> None:
    pods, runs = _webhook(rendered), _webhook(rendered, RUNS_WEBHOOK_NAME)
    assert runs["clientConfig"]["service"] == {
        **pods["clientConfig"]["service"],
        "path": "/mutate-runs",
    }
    assert runs["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": ["tekton.dev"],
            "apiVersions": ["v1"],
            "resources": ["pipelineruns"],
            "scope": "Namespaced",
        },
        {
            "operations": ["CREATE"],
            "apiGroups": ["argoproj.io"],
            "apiVersions": ["v1alpha1"],
            "resources": ["workflows"],
            "scope": "Namespaced",
        },
    ]
    # Same namespaces as the pod webhook; fail open: the admission policy holds the runs of
    # namespaces with a control (docs/deploy.md says why).
    assert runs["namespaceSelector"] == pods["namespaceSelector"]
    assert runs["failurePolicy"] == "Ignore"
    assert runs["sideEffects"] == "None"
    assert runs["admissionReviewVersions"] == ["v1"]
    assert 1 <= runs["timeoutSeconds"] <= 5
    assert "objectSelector" not in runs


def test_webhook_registration_follows_the_design(rendered: list[Obj]) -> None:
    hook = _webhook(rendered)
    assert hook["name"] == WEBHOOK_NAME
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["sideEffects"] == "None"
    assert 1 <= hook["timeoutSeconds"] <= 5
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["matchPolicy"] == "Equivalent"
    # Fail open: a refused pod fails its TaskRun; the admission policy holds a TaskRun's
    # pod behind the gate for the reconciler instead (test_admission_policy_*).
    assert hook["failurePolicy"] == "Ignore"
    assert hook["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert "objectSelector" not in hook
    assert "url" not in hook["clientConfig"]


def test_namespace_selector_needs_the_label_and_excludes_system_namespaces(
    rendered: list[Obj],
) -> None:
    selector = _webhook(rendered)["namespaceSelector"]
    assert selector["matchLabels"] == {marks.LABEL_ENABLED: "true"}
    excluded = [
        expr
        for expr in selector["matchExpressions"]
        if expr["key"] == "kubernetes.io/metadata.name" and expr["operator"] == "NotIn"
    ]
    assert len(excluded) == 1
    assert {"kube-system", NAMESPACE} <= set(excluded[0]["values"])


@pytest.mark.parametrize("target", KUSTOMIZE_TARGETS)
def test_the_overlays_namespace_is_disabled_by_label(target: str) -> None:
    """The project's namespace could not match anyway: it is not enabled. (The chart's
    namespace is the release's, made by ``helm --create-namespace``: excluded by name only.)"""
    namespace = one(render(target), "Namespace", NAMESPACE)
    assert namespace["metadata"]["labels"].get(marks.LABEL_ENABLED) != "true"
    assert namespace["metadata"]["labels"].get(marks.LABEL_MODE) == "disabled"


def test_webhook_client_config_points_at_the_service(rendered: list[Obj]) -> None:
    service_ref = _webhook(rendered)["clientConfig"]["service"]
    assert service_ref == {"name": SERVICE, "namespace": NAMESPACE, "path": "/mutate", "port": 443}
    service = one(rendered, "Service", SERVICE)
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == service_ref["port"]]
    deployment = one(rendered, "Deployment", "coschedule-webhook")
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    args = parse_args(container["args"])
    assert container_port(container, port["targetPort"]) == args.port == 8443


# The label keys and values the matchConditions must spare, from the marks.
_SPARED_POD_LABELS = (
    {marks.LABEL_COMPONENT: marks.COMPONENT_AFFINITY_ASSISTANT},
    {marks.LABEL_MODE: "disabled"},
)


def _balanced(expression: str) -> bool:
    depth, quote = 0, ""
    for char in expression:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0 and not quote


def test_match_conditions_are_plausible_cel(rendered: list[Obj]) -> None:
    conditions = _webhook(rendered)["matchConditions"]
    assert 1 <= len(conditions) <= 64
    assert len({c["name"] for c in conditions}) == len(conditions)
    for condition in conditions:
        expression = condition["expression"]
        assert _balanced(expression), condition["name"]
        # Only the admitted object is looked at, and a missing labels map is guarded.
        assert "object.metadata.labels" in expression
        assert "has(object.metadata.labels)" in expression
        assert "oldObject" not in expression
    text = " ".join(c["expression"] for c in conditions)
    for labels in _SPARED_POD_LABELS:
        for key, value in labels.items():
            assert f"'{key}'" in text
            assert f"'{value}'" in text


def _pod_with_labels(labels: Mapping[str, str] | None) -> Obj:
    pod = load_pod("tekton-taskrun")
    if labels is None:
        pod["metadata"].pop("labels", None)
    else:
        pod["metadata"]["labels"] = {**pod["metadata"].get("labels", {}), **labels}
    return pod


def test_match_conditions_skip_exactly_placeholders_and_disabled_pods(
    rendered: list[Obj],
) -> None:
    cel = pytest.importorskip(
        "cel", reason="common-expression-language (dev dependency) is not installed"
    )
    programs = [cel.compile(c["expression"]) for c in _webhook(rendered)["matchConditions"]]

    def sent_to_webhook(pod: Obj) -> bool:
        return all(program.execute({"object": pod}) is True for program in programs)

    assert sent_to_webhook(_pod_with_labels({}))
    assert sent_to_webhook(_pod_with_labels(None))
    assert sent_to_webhook(load_pod("argo-workflow-pod"))
    assert sent_to_webhook(_pod_with_labels({marks.LABEL_MODE: "pipelineruns"}))
    assert sent_to_webhook(_pod_with_labels({marks.LABEL_COMPONENT: "webhook"}))
    for labels in _SPARED_POD_LABELS:
        assert not sent_to_webhook(_pod_with_labels(labels)), labels
    assert not sent_to_webhook(load_pod("placeholder-pod"))


def test_base_leaves_the_ca_bundle_to_the_overlays() -> None:
    config = one(render(BASE), "MutatingWebhookConfiguration", WEBHOOK_CONFIG)
    assert "caBundle" not in config["webhooks"][0]["clientConfig"]
    assert "cert-manager.io/inject-ca-from" not in config["metadata"].get("annotations", {})


# ---- workloads -------------------------------------------------------------------------


def test_every_pod_is_pod_security_restricted(rendered: list[Obj]) -> None:
    for owner, pod in pod_templates(rendered):
        spec, where = pod["spec"], ident(owner)
        for forbidden in ("hostNetwork", "hostPID", "hostIPC", "hostUsers"):
            assert not spec.get(forbidden), f"{where}: {forbidden}"
        assert not any("hostPath" in v for v in spec.get("volumes", [])), where
        pod_sc = spec["securityContext"]
        assert pod_sc["runAsNonRoot"] is True, where
        assert pod_sc["runAsUser"] == UID, where
        assert pod_sc["runAsGroup"] == UID, where
        assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert spec["enableServiceLinks"] is False, where
        assert spec["automountServiceAccountToken"] is True, f"{where} calls the API"
        assert "priorityClassName" not in spec, f"{where}: see docs/deploy.md"
        for container in containers(pod):
            sc, name = container["securityContext"], f"{where} {container['name']}"
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["runAsNonRoot"] is True, name
            assert sc.get("runAsUser", UID) == UID, name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert not sc.get("privileged"), name
            assert sc.get("seccompProfile", {"type": "RuntimeDefault"}) == {
                "type": "RuntimeDefault"
            }, name
            assert not any("hostPort" in p for p in container.get("ports", [])), name
            # Read-only root: /tmp is the one writable place, an emptyDir.
            (tmp,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
            volumes = {v["name"]: v for v in spec["volumes"]}
            assert "emptyDir" in volumes[tmp["name"]], name
            for mount in container["volumeMounts"]:
                assert "subPath" not in mount, f"{name}: subPath mounts never update"


def test_every_container_has_resources_and_a_pinned_image(rendered: list[Obj]) -> None:
    for owner, pod in pod_templates(rendered):
        for container in containers(pod):
            name = f"{ident(owner)} {container['name']}"
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), name
            assert "memory" in resources["limits"], name
            image = container["image"]
            assert image.startswith(IMAGE + ":") or image.startswith(IMAGE + "@"), name
            assert not image.endswith(":latest"), name
            assert container["imagePullPolicy"] == "IfNotPresent", name
            assert container["command"] == ["coschedule"], name


def test_service_accounts_mount_no_token_by_default(rendered: list[Obj]) -> None:
    for account in objects(rendered, "ServiceAccount"):
        assert account["automountServiceAccountToken"] is False, ident(account)
    accounts = {a["metadata"]["name"] for a in objects(rendered, "ServiceAccount")}
    for owner, pod in pod_templates(rendered):
        assert pod["spec"]["serviceAccountName"] in accounts, ident(owner)


def test_the_entry_point_is_the_packaged_command() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    assert project["project"]["scripts"]["coschedule"] == "coschedule.cli.main:main"


@pytest.mark.parametrize(
    ("name", "command", "health_port"),
    [("coschedule-webhook", "serve", 8080), ("coschedule-reconciler", "reconcile", 8081)],
)
def test_deployments_run_the_design_commands(
    rendered: list[Obj], name: str, command: str, health_port: int
) -> None:
    deployment = one(rendered, "Deployment", name)
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    args = parse_args(container["args"])
    assert args.command == command
    assert args.health_port == health_port
    assert args.config_dir == CONFIG_DIR == mount_path(pod, container, config_map=CONFIGMAP)
    if command == "serve":
        assert args.cert_dir == CERT_DIR == mount_path(pod, container, secret=TLS_SECRET)
        assert not args.no_cluster
    else:
        assert args.leader_elect is True
    probes = (
        ("startupProbe", "/livez"),
        ("livenessProbe", "/livez"),
        ("readinessProbe", "/readyz"),
    )
    for probe_name, path in probes:
        probe = container[probe_name]["httpGet"]
        assert probe["path"] == path
        assert probe.get("scheme", "HTTP") == "HTTP", "probes use the plain health port"
        assert container_port(container, probe["port"]) == health_port


@pytest.mark.parametrize(
    ("name", "component"),
    [("coschedule-webhook", "webhook"), ("coschedule-reconciler", "reconciler")],
)
def test_deployments_are_highly_available(rendered: list[Obj], name: str, component: str) -> None:
    deployment = one(rendered, "Deployment", name)
    spec = deployment["spec"]
    pod_labels = spec["template"]["metadata"]["labels"]
    assert pod_labels[marks.LABEL_COMPONENT] == component
    assert spec["replicas"] == 2
    assert spec["selector"]["matchLabels"].items() <= pod_labels.items()
    assert spec["template"]["spec"]["serviceAccountName"] == f"coschedule-{component}"
    (spread,) = spec["template"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert spread["maxSkew"] == 1
    assert spread["labelSelector"]["matchLabels"].items() <= pod_labels.items()
    budgets = [
        pdb
        for pdb in objects(rendered, "PodDisruptionBudget")
        if pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    ]
    assert len(budgets) == 1, f"{name}: one PodDisruptionBudget"
    assert budgets[0]["spec"]["minAvailable"] == 1


def test_webhook_rollout_never_drops_below_its_replicas(rendered: list[Obj]) -> None:
    strategy = one(rendered, "Deployment", "coschedule-webhook")["spec"]["strategy"]
    assert strategy["rollingUpdate"]["maxUnavailable"] == 0


@pytest.mark.parametrize("target", KUSTOMIZE_TARGETS)
def test_the_namespace_enforces_restricted_pod_security(target: str) -> None:
    # The chart's namespace is the release's (docs/deploy.md says how to label it the same).
    labels = one(render(target), "Namespace", NAMESPACE)["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"


# ---- configuration ---------------------------------------------------------------------


def _config_data(docs: list[Obj]) -> dict[str, str]:
    data = one(docs, "ConfigMap", CONFIGMAP)["data"]
    assert all(isinstance(v, str) for v in data.values())
    return dict(data)


def test_configmap_parses_and_states_the_defaults(rendered: list[Obj]) -> None:
    data = _config_data(rendered)
    assert "disable-affinity-assistant" not in data, "deprecated: not for new installations"
    missing = KNOWN_KEYS - {"disable-affinity-assistant"} - set(data)
    assert not missing, (
        f"add {sorted(missing)} with their defaults and a comment to "
        "manifests/base/configmap.yaml: the shipped ConfigMap documents every key"
    )
    settings = parse_settings(data)
    defaults = parse_settings({})
    for field in Settings.__dataclass_fields__:
        if field in ("mode_reason", "extensions"):
            continue
        assert getattr(settings, field) == getattr(defaults, field), (
            f"{field}: the ConfigMap documents the defaults"
        )


def test_configmap_is_mounted_under_its_exact_name(rendered: list[Obj]) -> None:
    # No configMapGenerator hash suffix: the design names the ConfigMap.
    assert one(rendered, "ConfigMap", CONFIGMAP)["metadata"]["name"] == CONFIGMAP


# ---- RBAC ------------------------------------------------------------------------------

Permission = tuple[str, str, str, str]  # (apiGroup, resource, verb, resourceName or "")


def _permissions(role: Obj) -> set[Permission]:
    found: set[Permission] = set()
    for rule in role.get("rules", []):
        assert "nonResourceURLs" not in rule, ident(role)
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames") or [""]:
                        found.add((group, resource, verb, name))
    return found


def _grant(groups: str, resources: str, verbs: str, name: str = "") -> set[Permission]:
    return {
        (group if group != "core" else "", resource, verb, name)
        for group in groups.split()
        for resource in resources.split()
        for verb in verbs.split()
    }


EXPECTED_PERMISSIONS: dict[str, set[Permission]] = {
    "ClusterRole coschedule-webhook": _grant(
        "core", "namespaces persistentvolumeclaims", "get list watch"
    )
    | _grant("core", "pods persistentvolumes", "list watch")
    | _grant("apps", "statefulsets", "get list watch")
    | _grant("coschedule.dev", "concurrencycontrols", "list watch"),
    "ClusterRole coschedule-reconciler": _grant("core", "pods", "get list watch patch delete")
    | _grant("core", "nodes", "get list watch")
    | _grant("core", "namespaces", "get list watch")
    | _grant("apps", "statefulsets", "get list watch create update patch delete")
    | _grant("core", "persistentvolumeclaims", "get list watch delete patch")
    | _grant("core", "persistentvolumes", "get")
    | _grant("tekton.dev", "taskruns", "get")
    | _grant("tekton.dev", "pipelineruns", "get list watch patch")
    | _grant("argoproj.io", "workflows", "get list watch patch")
    | _grant("coschedule.dev", "concurrencycontrols", "get list watch")
    | _grant("coschedule.dev", "concurrencycontrols/status", "patch")
    | _grant("shipwright.io", "buildruns", "get")
    | _grant("batch", "jobs", "get")
    | _grant("core events.k8s.io", "events", "create patch"),
    f"Role {NAMESPACE}/coschedule-reconciler-leader-election": _grant(
        "coordination.k8s.io", "leases", "get create update"
    ),
    "Role kube-node-lease/coschedule-reconciler-node-leases": _grant(
        "coordination.k8s.io", "leases", "get"
    ),
    f"Role {NAMESPACE}/coschedule-certs": _grant("core", "secrets", "get patch", TLS_SECRET)
    | _grant("core", "secrets", "create"),
    "ClusterRole coschedule-certs": _grant(
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
        "get patch",
        WEBHOOK_CONFIG,
    ),
    # The self-signed install's certificate keeper (the reconciler's leader): by name only.
    f"Role {NAMESPACE}/coschedule-reconciler-certs": _grant(
        "core", "secrets", "get patch", TLS_SECRET
    )
    | _grant("core", "secrets", "get patch", CA_SECRET),
    "ClusterRole coschedule-reconciler-certs": _grant(
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
        "get list watch patch",
        WEBHOOK_CONFIG,
    ),
}
# Roles only the self-signed install has (the cert-manager one has no certificate keeper).
SELF_SIGNED_ONLY = {
    "coschedule-reconciler": {
        f"Role {NAMESPACE}/coschedule-reconciler-certs",
        "ClusterRole coschedule-reconciler-certs",
    }
}
# Which account holds which roles (the split per process).
EXPECTED_BINDINGS: dict[str, set[str]] = {
    "coschedule-webhook": {"ClusterRole coschedule-webhook"},
    "coschedule-reconciler": {
        "ClusterRole coschedule-reconciler",
        f"Role {NAMESPACE}/coschedule-reconciler-leader-election",
        "Role kube-node-lease/coschedule-reconciler-node-leases",
    },
    "coschedule-certs": {f"Role {NAMESPACE}/coschedule-certs", "ClusterRole coschedule-certs"},
}


def test_rbac_has_no_wildcards_and_no_dangerous_verbs(rendered: list[Obj]) -> None:
    for role in objects(rendered, "ClusterRole") + objects(rendered, "Role"):
        assert "aggregationRule" not in role, ident(role)
        for group, resource, verb, name in _permissions(role):
            assert "*" not in (group, resource, verb, name), ident(role)
            assert verb not in ("escalate", "bind", "impersonate", "deletecollection"), ident(role)
            assert not (resource == "secrets" and verb in ("list", "watch")), ident(role)
            if resource == "secrets" and verb != "create":
                assert name, f"{ident(role)}: {verb} on secrets by name only"


def test_rbac_grants_exactly_the_expected_permissions(rendered: list[Obj]) -> None:
    roles = objects(rendered, "ClusterRole") + objects(rendered, "Role")
    assert roles
    for role in roles:
        assert ident(role) in EXPECTED_PERMISSIONS, f"unexpected {ident(role)}"
        assert _permissions(role) == EXPECTED_PERMISSIONS[ident(role)], ident(role)


def test_every_binding_gives_one_of_our_roles_to_one_of_our_accounts(rendered: list[Obj]) -> None:
    roles = {ident(r) for r in objects(rendered, "ClusterRole") + objects(rendered, "Role")}
    accounts = {a["metadata"]["name"] for a in objects(rendered, "ServiceAccount")}
    held: dict[str, set[str]] = {}
    for binding in objects(rendered, "ClusterRoleBinding") + objects(rendered, "RoleBinding"):
        ref = binding["roleRef"]
        assert ref["name"] not in ("cluster-admin", "admin", "edit"), ident(binding)
        assert ref["apiGroup"] == "rbac.authorization.k8s.io"
        ns = binding["metadata"].get("namespace")
        role = f"{ref['kind']} {ns + '/' if ref['kind'] == 'Role' else ''}{ref['name']}"
        assert role in roles, f"{ident(binding)} refers to {role}, not rendered"
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount", ident(binding)
            assert subject["namespace"] == NAMESPACE, ident(binding)
            assert subject["name"] in accounts, ident(binding)
            held.setdefault(subject["name"], set()).add(role)
    certs_job = bool(objects(rendered, "Job"))  # the self-signed install
    expected = {
        a: EXPECTED_BINDINGS[a] | (SELF_SIGNED_ONLY.get(a, set()) if certs_job else set())
        for a in accounts
    }
    assert held == expected


# ---- overlays --------------------------------------------------------------------------


def test_overlays_provide_the_secret_the_webhook_mounts(overlay: list[Obj]) -> None:
    certificates = [
        c for c in objects(overlay, "Certificate") if c["spec"]["secretName"] == TLS_SECRET
    ]
    jobs = objects(overlay, "Job")
    assert len(certificates) + len(jobs) == 1, "exactly one source of the serving certificate"


def test_cert_manager_overlay_issues_and_injects_the_certificate() -> None:
    docs = render(CERT_MANAGER)
    assert not objects(docs, "Job")
    config = one(docs, "MutatingWebhookConfiguration", WEBHOOK_CONFIG)
    annotation = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    ns, name = annotation.split("/")
    serving = one(docs, "Certificate", name)
    assert ns == serving["metadata"]["namespace"] == NAMESPACE
    spec = serving["spec"]
    assert spec["secretName"] == TLS_SECRET
    assert spec["dnsNames"] == certs.service_dns_names(SERVICE, NAMESPACE)
    assert not spec.get("isCA", False)
    assert "server auth" in spec["usages"]
    # Signed by a CA that outlives it, so renewals leave the caBundle unchanged.
    issuer = one(docs, "Issuer", spec["issuerRef"]["name"])
    ca = one(docs, "Certificate", "coschedule-ca")
    assert issuer["spec"] == {"ca": {"secretName": ca["spec"]["secretName"]}}
    assert ca["spec"]["isCA"] is True
    assert one(docs, "Issuer", ca["spec"]["issuerRef"]["name"])["spec"] == {"selfSigned": {}}


def _certs_job() -> tuple[list[Obj], Obj]:
    docs = render(SELF_SIGNED)
    assert not objects(docs, "Certificate")
    assert not objects(docs, "Issuer")
    (job,) = objects(docs, "Job")
    return docs, job


def test_self_signed_job_is_wired_to_the_one_secret_and_configuration() -> None:
    docs, job = _certs_job()
    (container,) = job["spec"]["template"]["spec"]["containers"]
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in container["args"][1:])
    assert container["args"][0] == "certs"
    assert flags["service"] == SERVICE
    assert flags["namespace"] == NAMESPACE
    assert flags["out"].startswith("/tmp/")
    assert flags["apply-to-secret"] == f"{NAMESPACE}/{TLS_SECRET}"
    assert flags["patch-webhook"] == WEBHOOK_CONFIG
    one(docs, "MutatingWebhookConfiguration", flags["patch-webhook"])
    spec = job["spec"]
    assert spec["template"]["spec"]["restartPolicy"] in ("Never", "OnFailure")
    assert spec["template"]["spec"]["serviceAccountName"] == "coschedule-certs"
    assert spec["backoffLimit"] >= 1
    assert spec["activeDeadlineSeconds"] > 0


def _certs_has_apply_flags() -> bool:
    probe = ["certs", "--apply-to-secret=ns/name", "--patch-webhook=name"]
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            build_parser().parse_args(probe)
    except SystemExit:
        return False
    return True


@pytest.mark.xfail(
    not _certs_has_apply_flags(),
    reason="coschedule certs has no --apply-to-secret/--patch-webhook yet (docs/deploy.md)",
    strict=True,
)
def test_self_signed_job_command_parses() -> None:
    _, job = _certs_job()
    (container,) = job["spec"]["template"]["spec"]["containers"]
    args = parse_args(container["args"])
    assert args.command == "certs"


def _policy(rendered: list[Obj], kind: str) -> Obj:
    return next(o for o in rendered if o["kind"] == kind and o["metadata"]["name"] == GATE_POLICY)


GATE_POLICY = "coschedule-gate-pods"


def test_admission_policy_serves_the_webhooks_namespaces_and_refuses_nothing(
    rendered: list[Obj],
) -> None:
    policy = _policy(rendered, "MutatingAdmissionPolicy")["spec"]
    binding = _policy(rendered, "MutatingAdmissionPolicyBinding")["spec"]
    assert binding["policyName"] == GATE_POLICY
    selector = binding["matchResources"]["namespaceSelector"]
    hook = _webhook(rendered)["namespaceSelector"]
    # The webhook's namespaces, less those whose label turns coscheduling off.
    assert selector["matchLabels"] == hook["matchLabels"]
    assert selector["matchExpressions"] == [
        *hook["matchExpressions"],
        {"key": "coschedule.dev/mode", "operator": "NotIn", "values": ["disabled"]},
    ]
    assert policy["failurePolicy"] == "Ignore"  # a CEL error never refuses a pod
    assert policy["reinvocationPolicy"] == "Never"
    assert policy["matchConstraints"]["resourceRules"] == [
        {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
    ]
    # The webhook's own conditions are among the policy's (same pods spared).
    names = {c["name"] for c in policy["matchConditions"]}
    assert {c["name"] for c in _webhook(rendered)["matchConditions"]} <= names


def test_admission_policy_conditions_pick_unmarked_taskrun_pods() -> None:
    cel = pytest.importorskip(
        "cel", reason="common-expression-language (dev dependency) is not installed"
    )
    policy = _policy(render(BASE), "MutatingAdmissionPolicy")["spec"]
    programs = [cel.compile(c["expression"]) for c in policy["matchConditions"]]

    def gated(pod: Obj) -> bool:
        pod.setdefault("spec", {})
        return all(p.execute({"object": pod}) for p in programs)

    taskrun = load_pod("tekton-taskrun")
    assert gated(copy.deepcopy(taskrun))
    assert gated(load_pod("shipwright-buildrun-pod"))  # a BuildRun runs as a TaskRun
    for name in ("argo-workflow-pod", "job-pod", "placeholder-pod", "deployment-pod"):
        assert not gated(load_pod(name)), name
    marked = copy.deepcopy(taskrun)
    marked["metadata"]["labels"][marks.LABEL_PLACEHOLDER] = "affinity-assistant-0123456789"
    assert not gated(marked)
    held = copy.deepcopy(taskrun)
    held["spec"]["schedulingGates"] = [{"name": marks.GATE_PLACEHOLDER}]
    assert not gated(held)
    disabled = copy.deepcopy(taskrun)
    disabled["metadata"]["labels"][marks.LABEL_MODE] = "disabled"
    assert not gated(disabled)
    # A pod created on its node is never scheduled: the API refuses a gate beside nodeName.
    bound = copy.deepcopy(taskrun)
    bound["spec"]["nodeName"] = "node-a"
    assert not gated(bound)


def test_run_admission_policy_holds_only_where_a_control_exists(rendered: list[Obj]) -> None:
    def named(kind: str) -> Obj:
        return next(
            o for o in rendered if o["kind"] == kind and o["metadata"]["name"] == HOLD_POLICY
        )

    policy, binding = named("MutatingAdmissionPolicy"), named("MutatingAdmissionPolicyBinding")
    runs = _webhook(rendered, RUNS_WEBHOOK_NAME)
    # One evaluation per ConcurrencyControl of the run's namespace; none: nothing done.
    assert policy["spec"]["paramKind"] == {
        "apiVersion": "coschedule.dev/v1alpha1",
        "kind": "ConcurrencyControl",
    }
    assert binding["spec"]["paramRef"] == {"selector": {}, "parameterNotFoundAction": "Allow"}
    assert binding["spec"]["matchResources"]["namespaceSelector"] == runs["namespaceSelector"]
    assert policy["spec"]["failurePolicy"] == "Ignore"
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert [(r["apiGroups"], r["resources"]) for r in rules] == [
        (rule["apiGroups"], rule["resources"]) for rule in runs["rules"]
    ]


HOLD_POLICY = "coschedule-hold-runs"


def _reconciler_args(docs: list[Obj]) -> argparse.Namespace:
    deployment = one(docs, "Deployment", "coschedule-reconciler")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return parse_args(container["args"])


@pytest.mark.parametrize("target", [SELF_SIGNED, CHART_SELF_SIGNED])
def test_self_signed_install_has_the_reconciler_keep_the_certificate(target: str) -> None:
    """The leader renews the Job's certificate: the flags name the Secret the webhook mounts,
    a CA Secret the install ships empty, our one webhook configuration and the Service; the
    lifetimes are ones the keeper accepts."""
    from coschedule.reconcile.main import certificate_keeping

    docs = render(target)
    args = _reconciler_args(docs)
    keeping = certificate_keeping(args, NAMESPACE)
    assert keeping is not None
    targets, policy = keeping
    assert targets.secret == TLS_SECRET
    assert targets.webhook_configs == (WEBHOOK_CONFIG,)
    one(docs, "MutatingWebhookConfiguration", WEBHOOK_CONFIG)
    assert list(policy.names) == certs.service_dns_names(SERVICE, NAMESPACE)
    assert policy.problem() is None
    assert policy.renew_before.days >= 14  # well before expiry
    ca = one(docs, "Secret", targets.ca_secret)
    assert ca["metadata"]["namespace"] == NAMESPACE
    assert "data" not in ca
    assert "stringData" not in ca
    # The Job only bootstraps: it keeps any certificate that has not expired.
    (job,) = objects(docs, "Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert "--renew-before-days=0" in container["args"]


def test_cert_manager_install_has_no_certificate_keeper() -> None:
    assert _reconciler_args(render(CERT_MANAGER)).cert_secret is None
