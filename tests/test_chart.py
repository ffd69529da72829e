"""charts/coschedule, rendered and linted by a real Helm (tests/chart.py).

With its defaults the chart renders the kustomize overlays' objects (labels aside); every
value in values.yaml is exercised by tests/fixtures/chart-all-options.yaml and reaches the
objects; every rendered object is valid against the Kubernetes 1.30 and 1.36 schemas. The
structural checks of tests/test_manifests.py run on the chart's defaults too.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from coschedule.config.policy import POLICY_KEYS, PolicyMode
from coschedule.config.settings import (
    DEFAULT_PLACEHOLDER_BIND_WAIT_SECONDS,
    KNOWN_KEYS,
    MAX_PLACEHOLDER_BIND_WAIT_SECONDS,
    parse_settings,
)
from coschedule.marks import IsolationScope, Mode
from coschedule.server.cache_gate import SYNC_WAIT_SECONDS
from coschedule.server.pod_endpoint import CLAIM_WAIT_SECONDS, TOTAL_WAIT_SECONDS
from tests.chart import CHART, NAMESPACE, ROOT, all_options, helm, lint, render_chart
from tests.test_manifests import (
    CERT_MANAGER,
    CRDS,
    K8S_VERSIONS,
    RUNS_WEBHOOK_NAME,
    SELF_SIGNED,
    Obj,
    _permissions,
    _webhook,
    container_port,
    ident,
    objects,
    one,
    parse_args,
    pod_templates,
    render,
    schema_problems,
)

DEFAULTS: Obj = yaml.safe_load((CHART / "values.yaml").read_text("utf-8"))
# Values whose default is an empty mapping or list: a leaf for "every value is exercised".
_LEAF_MAPPINGS = {
    "resources",
    "nodeSelector",
    "affinity",
    "requests",
    "limits",
    "podAnnotations",
    "podLabels",
    "podSecurityContext",
    "containerSecurityContext",
    "labels",
}


def _values(source: str) -> Obj:
    return {"certificates": {"source": source}}


def _without_helm_labels(obj: Obj) -> Obj:
    """The object as kustomize writes it: Helm's labels are the chart's only addition, and
    the certs Job carries the release revision in its name."""
    obj = json.loads(json.dumps(obj))
    obj["metadata"].pop("labels", None)
    name, _, revision = obj["metadata"]["name"].rpartition("-")
    if obj["kind"] == "Job" and revision.isdigit():
        obj["metadata"]["name"] = name
    return obj


@pytest.mark.parametrize(
    ("source", "overlay"), [("self-signed", SELF_SIGNED), ("cert-manager", CERT_MANAGER)]
)
def test_chart_defaults_render_the_overlay_objects(source: str, overlay: str) -> None:
    """The same objects, but the Namespace: the chart's is the release's, which Helm creates
    (``--create-namespace``) before it stores the release there."""
    docs = render_chart(_values(source))
    assert not objects(docs, "Namespace")
    chart = {ident(_without_helm_labels(o)): _without_helm_labels(o) for o in docs}
    kustomize = {
        ident(o): _without_helm_labels(o)
        for o in render(overlay) + render(CRDS)  # the CRD is applied on its own
        if o["kind"] != "Namespace"
    }
    assert sorted(chart) == sorted(kustomize)
    for name, obj in kustomize.items():
        assert chart[name] == obj, name


@pytest.mark.parametrize(
    ("source", "overlay"), [("self-signed", SELF_SIGNED), ("cert-manager", CERT_MANAGER)]
)
def test_chart_and_kustomize_grant_the_same_rbac_and_register_the_same_webhook(
    source: str, overlay: str
) -> None:
    chart, kustomize = render_chart(_values(source)), render(overlay)

    def rbac(docs: list[Obj]) -> dict[str, set[tuple[str, str, str, str]]]:
        roles = objects(docs, "ClusterRole") + objects(docs, "Role")
        return {ident(role): _permissions(role) for role in roles}

    def bindings(docs: list[Obj]) -> dict[str, Any]:
        found = objects(docs, "ClusterRoleBinding") + objects(docs, "RoleBinding")
        return {ident(b): (b["roleRef"], b["subjects"]) for b in found}

    assert rbac(chart) == rbac(kustomize)
    assert bindings(chart) == bindings(kustomize)
    hook, expected = _webhook(chart), _webhook(kustomize)
    for field in (
        "rules",
        "namespaceSelector",
        "objectSelector",
        "matchConditions",
        "failurePolicy",
        "timeoutSeconds",
        "sideEffects",
        "reinvocationPolicy",
        "matchPolicy",
        "clientConfig",
    ):
        assert hook.get(field) == expected.get(field), field
    assert hook["failurePolicy"] == "Ignore"


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("source", ["self-signed", "cert-manager"])
def test_every_option_renders_valid_objects(version: str, source: str) -> None:
    values = all_options()
    values["certificates"]["source"] = source
    problems = schema_problems(render_chart(values), version)
    assert not problems, f"invalid against Kubernetes {version}:\n" + "\n".join(problems)


@pytest.mark.parametrize("kube_version", ["v1.30.0", "v1.36.0"])
@pytest.mark.parametrize("values", ["defaults", "cert-manager", "all-options"])
def test_helm_lint_is_clean(values: str, kube_version: str) -> None:
    given = {
        "defaults": None,
        "cert-manager": _values("cert-manager"),
        "all-options": all_options(),
    }
    report = lint(given[values], kube_version)
    assert report["errors"] == []
    # Strict: warnings are errors. Severity 1 is information ("icon is recommended").
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_helm_lint_reports_a_broken_chart(tmp_path: Any) -> None:
    # The linter is real: a template that does not parse is an error.
    import shutil

    broken = tmp_path / "coschedule"
    shutil.copytree(CHART, broken)
    (broken / "templates" / "broken.yaml").write_text("{{ if }}\n")
    report = helm().lint(str(broken), None, strict=True, namespace=NAMESPACE)
    assert report["errors"], report


def _leaves(values: Obj, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for key, value in values.items():
        path = (*prefix, key)
        if isinstance(value, dict) and value and key not in _LEAF_MAPPINGS:
            yield from _leaves(value, path)
        else:
            yield path


def _get(values: Obj, path: tuple[str, ...]) -> Any:
    for key in path:
        values = values[key]
    return values


def test_the_all_options_file_sets_every_value() -> None:
    options = all_options()
    for path in _leaves(DEFAULTS):
        dotted = ".".join(path)
        if path == ("certificates", "source"):
            continue  # both sources are rendered with every option
        if path == ("config", "isolation-scope"):
            continue  # a wider scope does not load with the file's zone topology-key
        try:
            value = _get(options, path)
        except KeyError:
            pytest.fail(f"tests/fixtures/chart-all-options.yaml does not set {dotted}")
        assert value != _get(DEFAULTS, path), f"{dotted} is set to its default"
    # And nothing the chart does not have (the schema would refuse it anyway).
    assert set(_leaves(options)) - set(_leaves(DEFAULTS)) == {
        ("config", "disable-affinity-assistant")
    }


def _pod(docs: list[Obj], kind: str, prefix: str) -> Obj:
    [(_, pod)] = [
        (owner, pod)
        for owner, pod in pod_templates(docs)
        if owner["kind"] == kind and owner["metadata"]["name"].startswith(prefix)
    ]
    return pod


def test_every_option_reaches_the_objects() -> None:
    values = all_options()
    docs = render_chart(values)
    image = f"{values['image']['repository']}@{values['image']['digest']}"
    assert not objects(docs, "Namespace")  # the release's, made by helm --create-namespace
    pods = {
        "webhook": _pod(docs, "Deployment", "coschedule-webhook"),
        "reconciler": _pod(docs, "Deployment", "coschedule-reconciler"),
        "certs": _pod(docs, "Job", "coschedule-certs"),
    }
    placements = {
        "webhook": values["webhook"],
        "reconciler": values["reconciler"],
        "certs": values["certificates"]["selfSigned"],
    }
    for name, pod in pods.items():
        spec, given = pod["spec"], placements[name]
        (container,) = spec["containers"]
        assert container["image"] == image, name
        assert container["imagePullPolicy"] == "Always", name
        assert container["resources"] == given["resources"], name
        assert spec["imagePullSecrets"] == [{"name": "registry-credentials"}], name
        for field in ("nodeSelector", "tolerations", "affinity", "priorityClassName"):
            assert spec[field] == given[field], f"{name} {field}"
    assert one(docs, "Deployment", "coschedule-webhook")["spec"]["replicas"] == 3
    assert one(docs, "Deployment", "coschedule-reconciler")["spec"]["replicas"] == 1
    # One reconciler: no budget that would block every drain; the webhook keeps its own.
    budgets = {pdb["metadata"]["name"] for pdb in objects(docs, "PodDisruptionBudget")}
    assert budgets == {"coschedule-webhook"}
    hook = _webhook(docs)
    assert hook["failurePolicy"] == "Fail"
    assert hook["timeoutSeconds"] == 4
    # admissionPolicy.enabled false (a cluster older than 1.36): no policy is rendered.
    assert not objects(docs, "MutatingAdmissionPolicy")
    assert not objects(docs, "MutatingAdmissionPolicyBinding")
    runs = _webhook(docs, RUNS_WEBHOOK_NAME)
    assert runs["failurePolicy"] == "Fail"
    assert runs["timeoutSeconds"] == 4
    args = pods["certs"]["spec"]["containers"][0]["args"]
    assert "--days=60" in args
    assert "--renew-before-days=0" in args  # the Job only bootstraps
    keeper = pods["reconciler"]["spec"]["containers"][0]["args"]
    for flag in ("--cert-validity=60d", "--cert-renew-before=20d"):
        assert flag in keeper
    assert "--ca-validity=1000d" in keeper
    assert "--ca-renew-before=300d" in keeper
    (monitor,) = objects(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["interval"] == "15s"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    (alerting,) = objects(docs, "PrometheusRule")
    assert alerting["metadata"]["labels"]["release"] == "prometheus"
    assert one(docs, "ConfigMap", "coschedule-grafana-dashboard")

    # Pod metadata, log level, extra args and env, security contexts.
    for name, given in (
        ("webhook", values["webhook"]),
        ("reconciler", values["reconciler"]),
        ("certs", values["certificates"]["selfSigned"]),
    ):
        meta, spec = pods[name]["metadata"], pods[name]["spec"]
        assert meta["annotations"] == given["podAnnotations"], name
        assert meta["labels"] == {
            **given["podLabels"],
            "app.kubernetes.io/name": "coschedule",
            "app.kubernetes.io/component": name,
        }, name
        assert spec["securityContext"] == {
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
            "supplementalGroups": [1000],
        }, name
        assert spec["containers"][0]["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
            "procMount": "Default",
        }, name
    for name in ("webhook", "reconciler"):
        (container,) = pods[name]["spec"]["containers"]
        given = values[name]
        assert container["args"][-len(given["extraArgs"]) :] == given["extraArgs"], name
        for env in given["extraEnv"]:
            assert env in container["env"], name
        args = parse_args(container["args"])
        assert args.log_level == "debug", name
    # The webhook on the node's network, on the ports it was given; the Service follows.
    webhook_spec = pods["webhook"]["spec"]
    assert webhook_spec["hostNetwork"] is True
    assert webhook_spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert "hostNetwork" not in pods["reconciler"]["spec"]
    (container,) = webhook_spec["containers"]
    args = parse_args(container["args"])
    assert (args.port, args.health_port) == (10260, 10261)
    (service_port,) = one(docs, "Service", "coschedule-webhook")["spec"]["ports"]
    assert container_port(container, service_port["targetPort"]) == 10260
    assert service_port["port"] == 443
    for probe in ("livenessProbe", "readinessProbe"):
        assert container_port(container, container[probe]["httpGet"]["port"]) == 10261

    settings = parse_settings(one(docs, "ConfigMap", "coschedule-config")["data"])
    assert settings.mode is Mode.PIPELINERUNS
    assert settings.topology_key == "topology.kubernetes.io/zone"
    assert settings.group_labels == ("coschedule.dev/group", "tekton.dev/pipelineRun")
    assert settings.placeholder_image == "registry.example.com/mirror/pause:3.10"
    assert settings.placeholder_resources == {
        "requests": {"cpu": "2m", "memory": "16Mi"},
        "limits": {"memory": "32Mi"},
    }
    assert settings.placeholder_priority_class == "ci-placeholders"
    assert settings.idle_grace_seconds == 120
    assert settings.rewrite_claims is False
    assert settings.group_shared_claims is True
    assert settings.isolation_tenant_label == "example.com/team"
    (rule,) = settings.scheduling_defaults
    assert dict(rule.node_selector) == {"kubernetes.io/arch": "arm64"}
    assert (
        settings.policy.reserved_tolerations.value,
        settings.policy.control_plane.value,
        settings.policy.hard_anti_affinity_topology.value,
        settings.policy.unsatisfiable_placement.value,
    ) == ("deny", "off", "warn", "warn")


def test_cert_manager_options_reach_the_certificates() -> None:
    values = all_options()
    values["certificates"]["source"] = "cert-manager"
    docs = render_chart(values)
    assert not objects(docs, "Job")
    ca, serving = (
        one(docs, "Certificate", "coschedule-ca"),
        one(docs, "Certificate", "coschedule-webhook"),
    )
    assert (ca["spec"]["duration"], ca["spec"]["renewBefore"]) == ("87600h", "17520h")
    assert (serving["spec"]["duration"], serving["spec"]["renewBefore"]) == ("720h", "240h")


def test_tag_and_default_image() -> None:
    docs = render_chart({"image": {"tag": "9.9.9"}})
    (container,) = _pod(docs, "Deployment", "coschedule-webhook")["spec"]["containers"]
    assert container["image"] == "ghcr.io/coschedule/coschedule:9.9.9"
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text("utf-8"))
    (container,) = _pod(render_chart(), "Deployment", "coschedule-webhook")["spec"]["containers"]
    assert container["image"] == f"ghcr.io/coschedule/coschedule:{chart['appVersion']}"


def test_another_namespace_is_followed_everywhere() -> None:
    docs = render_chart(_values("cert-manager"), namespace="platform-coschedule")
    for obj in docs:
        if obj["metadata"].get("namespace") == "kube-node-lease":  # the kubelets' Leases
            assert obj["kind"] in ("Role", "RoleBinding"), ident(obj)
            for subject in obj.get("subjects", ()):
                assert subject["namespace"] == "platform-coschedule", ident(obj)
        elif "namespace" in obj["metadata"]:
            assert obj["metadata"]["namespace"] == "platform-coschedule", ident(obj)
    assert not objects(docs, "Namespace")
    hook = _webhook(docs)
    assert hook["clientConfig"]["service"]["namespace"] == "platform-coschedule"
    (excluded,) = hook["namespaceSelector"]["matchExpressions"]
    assert excluded["values"] == ["kube-system", "platform-coschedule"]
    serving = one(docs, "Certificate", "coschedule-webhook")
    assert "coschedule-webhook.platform-coschedule.svc" in serving["spec"]["dnsNames"]
    config = one(docs, "MutatingWebhookConfiguration", "coschedule")
    annotations = config["metadata"]["annotations"]
    assert annotations["cert-manager.io/inject-ca-from"] == "platform-coschedule/coschedule-webhook"
    for binding in objects(docs, "ClusterRoleBinding") + objects(docs, "RoleBinding"):
        assert {s["namespace"] for s in binding["subjects"]} == {"platform-coschedule"}


def test_the_schema_knows_exactly_the_config_keys() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text("utf-8"))
    assert set(schema["properties"]["config"]["properties"]) == KNOWN_KEYS
    assert schema["properties"]["config"]["additionalProperties"] is False
    assert set(DEFAULTS["config"]) == KNOWN_KEYS - {"disable-affinity-assistant"}


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"config": {"topologykey": "x"}}, "additional properties 'topologykey' not allowed"),
        ({"webhook": {"failurePolicy": "Maybe"}}, "/webhook/failurePolicy"),
        ({"certificates": {"source": "vault"}}, "/certificates/source"),
        ({"image": {"digest": "latest"}}, "/image/digest"),
        ({"certificates": {"selfSigned": {"days": 0}}}, "/certificates/selfSigned/days"),
        # Values, not only keys: an unquoted off is YAML's false, which no process accepts.
        ({"config": {"policy-control-plane": False}}, "/config/policy-control-plane"),
        ({"config": {"policy-reserved-tolerations": "block"}}, "/config/policy-reserved"),
        ({"config": {"policy-hard-anti-affinity-topology": 1}}, "/config/policy-hard-anti"),
        ({"config": {"coschedule": False}}, "/config/coschedule"),
        ({"config": {"coschedule": "per-run"}}, "/config/coschedule"),
        # No webhook replica while a webhook fails closed: nothing could be created.
        ({"webhook": {"replicas": 0, "failurePolicy": "Fail"}}, "/webhook/replicas"),
        ({"webhook": {"replicas": 0, "runsFailurePolicy": "Fail"}}, "/webhook/replicas"),
        (
            {"webhook": {"replicas": 0, "failurePolicy": "Fail", "runsFailurePolicy": "Ignore"}},
            "/webhook/replicas",
        ),
        ({"logLevel": "verbose"}, "/logLevel"),
        ({"webhook": {"port": 0}}, "/webhook/port"),
        ({"webhook": {"healthPort": 70000}}, "/webhook/healthPort"),
        ({"webhook": {"hostNetwork": "yes"}}, "/webhook/hostNetwork"),
        ({"reconciler": {"extraArgs": [3]}}, "/reconciler/extraArgs/0"),
        ({"webhook": {"extraEnv": [{"value": "x"}]}}, "/webhook/extraEnv/0"),
        ({"webhook": {"podAnnotations": {"a": 1}}}, "/webhook/podAnnotations/a"),
        # The selector labels are the Deployment's, immutable: podLabels cannot set them.
        (
            {"reconciler": {"podLabels": {"app.kubernetes.io/component": "x"}}},
            "invalid propertyName 'app.kubernetes.io/component'",
        ),
        ({"podSecurityContext": "restricted"}, "/podSecurityContext"),
        # 0-3 s, as a number or its text (the process's words).
        ({"config": {"placeholder-bind-wait-seconds": 4}}, "/config/placeholder-bind-wait"),
        ({"config": {"placeholder-bind-wait-seconds": "3.5"}}, "/config/placeholder-bind-wait"),
        ({"config": {"placeholder-bind-wait-seconds": "-1"}}, "/config/placeholder-bind-wait"),
        ({"config": {"placeholder-bind-wait-seconds": "soon"}}, "/config/placeholder-bind-wait"),
    ],
)
def test_bad_values_are_refused_by_the_schema(values: Obj, fragment: str) -> None:
    with pytest.raises(Exception, match=re.escape(fragment)) as caught:
        render_chart(values)
    assert "schema" in str(caught.value)


@pytest.mark.parametrize(
    "config",
    [
        {"policy-control-plane": "off", "policy-reserved-tolerations": "deny"},
        {"policy-hard-anti-affinity-topology": "", "coschedule": ""},
        *({"coschedule": mode.value} for mode in Mode),
        {"isolation-scope": "cluster"},
        {"isolation-scope": "tenant", "isolation-tenant-label": "example.com/team"},
        {"isolation-scope": "", "isolation-tenant-label": ""},
        *({"placeholder-bind-wait-seconds": w} for w in ("0", ".5", "2.", " 3 ", "3.0", "")),
    ],
)
def test_every_accepted_config_value_is_one_the_processes_accept(config: Obj) -> None:
    """What the schema lets through, the processes load (the ConfigMap as rendered)."""
    (configmap,) = [o for o in render_chart({"config": config}) if o["kind"] == "ConfigMap"]
    for key, value in config.items():
        assert configmap["data"][key] == value
    parse_settings(configmap["data"])


def test_the_schema_enums_are_the_processes_words() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text("utf-8"))
    config = schema["properties"]["config"]["properties"]
    assert set(config["coschedule"]["enum"]) == {m.value for m in Mode} | {""}
    for key in POLICY_KEYS:
        assert set(config[key]["enum"]) == {m.value for m in PolicyMode} | {""}, key
    assert set(config["isolation-scope"]["enum"]) == {s.value for s in IsolationScope} | {""}


def test_openshift_assigns_the_uid_when_the_values_drop_it() -> None:
    """restricted-v2 refuses a fixed UID outside the namespace's range: null drops a key
    from the shipped securityContext and keeps the rest."""
    values = {
        "podSecurityContext": {"runAsUser": None, "runAsGroup": None, "fsGroup": None},
        "containerSecurityContext": {"runAsUser": None, "runAsGroup": None},
    }
    docs = render_chart(values)
    for owner, pod in pod_templates(docs):
        spec = pod["spec"]
        assert spec["securityContext"] == {
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        }, ident(owner)
        for container in spec["containers"]:
            context = container["securityContext"]
            assert "runAsUser" not in context, ident(owner)
            assert "runAsGroup" not in context, ident(owner)
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert context["readOnlyRootFilesystem"] is True
    for version in K8S_VERSIONS:
        assert schema_problems(docs, version) == []


def test_the_webhook_ports_follow_without_host_network() -> None:
    docs = render_chart({"webhook": {"port": 9443, "healthPort": 9080}})
    pod = _pod(docs, "Deployment", "coschedule-webhook")
    assert "hostNetwork" not in pod["spec"]
    (container,) = pod["spec"]["containers"]
    args = parse_args(container["args"])
    assert (args.port, args.health_port) == (9443, 9080)
    (service_port,) = one(docs, "Service", "coschedule-webhook")["spec"]["ports"]
    assert container_port(container, service_port["targetPort"]) == 9443


def test_one_port_for_both_webhook_listeners_is_refused() -> None:
    with pytest.raises(Exception, match=r"webhook\.port and webhook\.healthPort are both 9443"):
        render_chart({"webhook": {"port": 9443, "healthPort": 9443}})


@pytest.mark.parametrize("bind", [None, "", "0", "1.5", "2", "2.5", "3", 3])
def test_the_webhook_timeout_must_outlast_its_longest_wait_on_one_request(
    bind: str | int | None,
) -> None:
    """A request waits for the caches' first list or a claim, or for the placeholder's
    binding, or for one of the first two and then the binding, all within
    ``TOTAL_WAIT_SECONDS`` (server/pod_endpoint.py). ``timeoutSeconds`` must leave 1 s more,
    or the API server gives up on the webhook while it waits: the chart refuses that."""
    wait = DEFAULT_PLACEHOLDER_BIND_WAIT_SECONDS if bind in (None, "") else float(bind or 0)
    first = max(SYNC_WAIT_SECONDS, CLAIM_WAIT_SECONDS)
    longest = min(first + wait, TOTAL_WAIT_SECONDS) if wait > 0 else first
    least = math.ceil(longest + 1)
    config = {} if bind is None else {"placeholder-bind-wait-seconds": bind}
    docs = render_chart({"webhook": {"timeoutSeconds": least}, "config": config})
    hooks = one(docs, "MutatingWebhookConfiguration", "coschedule")["webhooks"]
    assert {hook["timeoutSeconds"] for hook in hooks} == {least}
    refused = {"webhook": {"timeoutSeconds": least - 1}, "config": config}
    with pytest.raises(Exception, match=r"webhook\.timeoutSeconds is \d+") as caught:
        render_chart(refused)
    message = str(caught.value)
    assert f"webhook.timeoutSeconds is {least - 1}," in message
    assert f"may wait {longest:g} s on one request" in message
    assert f"placeholder-bind-wait-seconds is {wait:g} s" in message
    assert f"set webhook.timeoutSeconds to {least} or more" in message


def test_the_default_timeout_leaves_the_longest_bind_wait_a_second() -> None:
    """The shipped timeoutSeconds (chart and manifests, 5) takes every bind wait the
    processes accept (up to 3 s)."""
    assert DEFAULTS["webhook"]["timeoutSeconds"] >= TOTAL_WAIT_SECONDS + 1
    assert TOTAL_WAIT_SECONDS >= MAX_PLACEHOLDER_BIND_WAIT_SECONDS
    config = {"placeholder-bind-wait-seconds": str(MAX_PLACEHOLDER_BIND_WAIT_SECONDS)}
    hooks = one(render_chart({"config": config}), "MutatingWebhookConfiguration", "coschedule")
    assert {h["timeoutSeconds"] for h in hooks["webhooks"]} == {5}
    manifest = yaml.safe_load(
        (ROOT / "manifests/base/mutatingwebhookconfiguration.yaml").read_text()
    )
    assert {h["timeoutSeconds"] for h in manifest["webhooks"]} == {5}


def test_pod_labels_add_to_the_selector_labels() -> None:
    docs = render_chart({"webhook": {"podLabels": {"team": "platform"}}})
    deployment = one(docs, "Deployment", "coschedule-webhook")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels == {**deployment["spec"]["selector"]["matchLabels"], "team": "platform"}
    assert "annotations" not in deployment["spec"]["template"]["metadata"]


def test_no_webhook_replica_is_allowed_only_when_both_webhooks_fail_open() -> None:
    values = {"webhook": {"replicas": 0, "failurePolicy": "Ignore", "runsFailurePolicy": "Ignore"}}
    webhook = one(render_chart(values), "Deployment", "coschedule-webhook")
    assert webhook["spec"]["replicas"] == 0


def test_notes_say_to_wait_for_ready_pods_and_name_both_policies() -> None:
    for values in (None, {"webhook": {"failurePolicy": "Ignore"}}):
        with helm().Chart.load(str(CHART)) as chart:
            rendered = chart.render(values, name="coschedule", namespace=NAMESPACE, is_install=True)
        (notes,) = [text for name, text in rendered.items() if name.endswith("NOTES.txt")]
        assert "Ready" in notes
        assert notes.index("rollout status") < notes.index("coschedule.dev/enabled=true")
        assert "runsFailurePolicy" in notes
        assert "failurePolicy" in notes


def test_crds_folder_is_rendered_and_validated() -> None:
    # The ConcurrencyControl CRD lands in crds/; whatever is there is rendered first.
    files = sorted(p.name for p in (CHART / "crds").iterdir() if p.suffix in (".yaml", ".yml"))
    crds = objects(render_chart(), "CustomResourceDefinition")
    assert len(crds) == len(files)
    for version in K8S_VERSIONS:
        assert schema_problems(crds, version) == []


def test_the_chart_ships_the_manifests_concurrencycontrol_crd() -> None:
    shipped = yaml.safe_load(
        (CHART / "crds" / "concurrencycontrols.coschedule.dev.yaml").read_text()
    )
    base = CHART.parents[1] / "manifests" / "crds" / "crd-concurrencycontrol.yaml"
    assert shipped == yaml.safe_load(base.read_text())


def test_documented_helm_install_creates_the_release_namespace() -> None:
    """The chart renders no Namespace, so every documented install says --create-namespace
    (tests/e2e/test_helm_install.py runs that command against a real API server)."""
    root = CHART.parent.parent
    commands = []
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md")), CHART / "values.yaml"]:
        text = path.read_text("utf-8").replace("\\\n", " ")
        commands += [(path.name, m) for m in re.findall(r"helm install coschedule [^\n]*", text)]
    assert len(commands) >= 3, commands
    for name, command in commands:
        assert "--create-namespace" in command, (name, command)
