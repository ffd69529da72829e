"""The cluster config: Tekton's flag matrix, every key, env vs folder, hot reload."""

from __future__ import annotations

from pathlib import Path

import pytest

from coschedule.config.settings import (
    DEFAULT_GROUP_LABELS,
    ConfigError,
    Settings,
    load_settings,
    parse_settings,
    read_raw_config,
)
from coschedule.config.store import SettingsStore
from coschedule.marks import IsolationScope, Mode, Placement

# (disable-affinity-assistant, coschedule) -> (with both keys, coschedule alone); None: invalid.
MATRIX = [
    ("false", "disabled", None, Mode.DISABLED),
    ("false", "workspaces", Mode.WORKSPACES, Mode.WORKSPACES),
    ("false", "pipelineruns", None, Mode.PIPELINERUNS),
    ("false", "isolate-pipelinerun", None, Mode.ISOLATE_PIPELINERUN),
    ("true", "disabled", Mode.DISABLED, Mode.DISABLED),
    ("true", "workspaces", Mode.DISABLED, Mode.WORKSPACES),
    ("true", "pipelineruns", Mode.PIPELINERUNS, Mode.PIPELINERUNS),
    ("true", "isolate-pipelinerun", Mode.ISOLATE_PIPELINERUN, Mode.ISOLATE_PIPELINERUN),
]


@pytest.mark.parametrize(("disable", "coschedule", "both", "alone"), MATRIX)
def test_flag_matrix(disable: str, coschedule: str, both: Mode | None, alone: Mode) -> None:
    assert parse_settings({"coschedule": coschedule}).mode is alone
    raw = {"disable-affinity-assistant": disable, "coschedule": coschedule}
    if both is None:
        with pytest.raises(ConfigError) as info:
            parse_settings(raw)
        # The error names both keys so an operator knows what to change.
        assert "disable-affinity-assistant" in str(info.value)
        assert "coschedule" in str(info.value)
    else:
        assert parse_settings(raw).mode is both


def test_defaults_are_tektons() -> None:
    settings = parse_settings({})
    assert settings.mode is Mode.WORKSPACES
    assert settings.topology_key == "kubernetes.io/hostname"
    assert settings.group_labels == DEFAULT_GROUP_LABELS
    assert settings.group_labels[0] == "coschedule.dev/group"
    assert settings.idle_grace_seconds == 300
    assert settings.stuck_grace_seconds == 30
    assert settings.placeholder_bind_wait_seconds == 2.0


def test_the_placeholder_bind_wait_takes_decimals_and_zero(tmp_path: Path) -> None:
    assert (
        parse_settings({"placeholder-bind-wait-seconds": "0.75"}).placeholder_bind_wait_seconds
        == 0.75
    )
    assert parse_settings({"placeholder-bind-wait-seconds": "0"}).placeholder_bind_wait_seconds == 0
    environ = {"COSCHEDULE_PLACEHOLDER_BIND_WAIT_SECONDS": "1.5"}
    assert load_settings(None, environ).placeholder_bind_wait_seconds == 1.5


def test_stuck_grace_from_the_environment_and_the_folder(tmp_path: Path) -> None:
    environ = {"COSCHEDULE_STUCK_GRACE_SECONDS": "12"}
    assert load_settings(None, environ).stuck_grace_seconds == 12
    (tmp_path / "stuck-grace-seconds").write_text("5\n")
    assert load_settings(tmp_path, environ).stuck_grace_seconds == 5


def test_deprecated_key_alone_uses_default_coschedule() -> None:
    assert parse_settings({"disable-affinity-assistant": "true"}).mode is Mode.DISABLED
    assert parse_settings({"disable-affinity-assistant": "false"}).mode is Mode.WORKSPACES


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"coschedule": "pipelinerun"}, "not a mode"),
        ({"disable-affinity-assistant": "maybe"}, "not a boolean"),
        ({"topology-key": "not a key!"}, "topology-key"),
        ({"group-labels": " , "}, "group-labels"),
        ({"group-labels": "a/b,a/b"}, "twice"),
        ({"idle-grace-seconds": "soon"}, "idle-grace-seconds"),
        ({"idle-grace-seconds": "-1"}, "idle-grace-seconds"),
        ({"stuck-grace-seconds": "half a minute"}, "stuck-grace-seconds"),
        ({"stuck-grace-seconds": "-5"}, "stuck-grace-seconds"),
        ({"placeholder-bind-wait-seconds": "soon"}, "placeholder-bind-wait-seconds.* not a number"),
        (
            {"placeholder-bind-wait-seconds": "-1"},
            "placeholder-bind-wait-seconds.* between 0 and 3",
        ),
        ({"placeholder-bind-wait-seconds": "5"}, "timeout is 5 s"),
        ({"placeholder-bind-wait-seconds": "nan"}, "placeholder-bind-wait-seconds"),
        ({"placeholder-resources": "requests: {cpu: lots}"}, "quantity"),
        ({"placeholder-resources": "limits: [1]"}, "mapping"),
        ({"placeholder-resources": "burst: {cpu: 1m}"}, "unknown section"),
        ({"placeholder-priority-class": "Not_Valid"}, "placeholder-priority-class"),
        ({"placement": "node-name"}, 'key "placement": .* not one of auto, pod-affinity'),
        ({"topologykey": "kubernetes.io/hostname"}, "unknown config key"),
    ],
)
def test_bad_values_are_refused_with_the_key_named(raw: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        parse_settings(raw)


def test_every_key_parses() -> None:
    settings = parse_settings(
        {
            "coschedule": "isolate-pipelinerun\n",
            "topology-key": "topology.kubernetes.io/zone",
            "group-labels": "example.com/run, tekton.dev/pipelineRun",
            "placeholder-image": "registry.example.com/pause:3.10",
            "placeholder-resources": "requests: {cpu: 5m, memory: 4Mi}\nlimits: {memory: 8Mi}",
            "placeholder-priority-class": "ci-high",
            "idle-grace-seconds": "60",
            "rewrite-claims": "false",
            "placement": " Auto\n",
        }
    )
    assert settings.mode is Mode.ISOLATE_PIPELINERUN
    assert settings.topology_key == "topology.kubernetes.io/zone"
    assert settings.group_labels == ("example.com/run", "tekton.dev/pipelineRun")
    assert settings.placeholder_image == "registry.example.com/pause:3.10"
    assert settings.placeholder_resources == {
        "requests": {"cpu": "5m", "memory": "4Mi"},
        "limits": {"memory": "8Mi"},
    }
    assert settings.placeholder_priority_class == "ci-high"
    assert settings.idle_grace_seconds == 60
    assert settings.rewrite_claims is False
    assert settings.placement is Placement.AUTO
    assert parse_settings({"placement": ""}).placement is Settings().placement


def test_folder_wins_over_environment(tmp_path: Path) -> None:
    (tmp_path / "topology-key").write_text("topology.kubernetes.io/zone")
    environ = {
        "COSCHEDULE_TOPOLOGY_KEY": "kubernetes.io/hostname",
        "COSCHEDULE_COSCHEDULE": "pipelineruns",
        # Kubernetes injects these for a Service named "coschedule": never config keys.
        "COSCHEDULE_SERVICE_HOST": "10.0.0.1",
        "COSCHEDULE_PORT_443_TCP": "tcp://10.0.0.1:443",
        "HOME": "/root",
    }
    raw = read_raw_config(tmp_path, environ)
    assert raw == {"topology-key": "topology.kubernetes.io/zone", "coschedule": "pipelineruns"}
    settings = parse_settings(raw)
    assert settings.topology_key == "topology.kubernetes.io/zone"
    assert settings.mode is Mode.PIPELINERUNS


def test_configmap_volume_layout_is_read(tmp_path: Path) -> None:
    """A ConfigMap volume: keys are symlinks into ..data, a symlink to a timestamped dir."""
    data = tmp_path / "..2026_11_21_06_00_00.000000001"
    data.mkdir()
    (data / "coschedule").write_text("pipelineruns")
    (data / "_example").write_text("# documentation only")
    (tmp_path / "..data").symlink_to(data.name)
    (tmp_path / "coschedule").symlink_to("..data/coschedule")
    (tmp_path / "_example").symlink_to("..data/_example")
    assert read_raw_config(tmp_path, {}) == {"coschedule": "pipelineruns"}


def mode_of(store: SettingsStore) -> Mode:
    # A call, so that mypy does not carry an earlier narrowing across reloads.
    return store.current.mode


def test_reload_keeps_last_good_config_and_reports(tmp_path: Path) -> None:
    errors: list[int] = []
    (tmp_path / "coschedule").write_text("pipelineruns")
    store = SettingsStore(tmp_path, {}, on_error=lambda: errors.append(1))
    assert store.current.mode is Mode.PIPELINERUNS
    assert store.maybe_reload() is False  # nothing changed

    (tmp_path / "disable-affinity-assistant").write_text("false")  # invalid with pipelineruns
    assert store.maybe_reload() is False
    assert store.current.mode is Mode.PIPELINERUNS
    assert store.error is not None
    assert "disable-affinity-assistant" in store.error
    assert "coschedule" in store.error
    assert errors == [1]
    store.maybe_reload()  # the same bad folder is reported once, not on every poll
    assert errors == [1]

    (tmp_path / "disable-affinity-assistant").unlink()
    (tmp_path / "coschedule").write_text("isolate-pipelinerun")
    assert store.maybe_reload() is True
    assert mode_of(store) is Mode.ISOLATE_PIPELINERUN
    assert store.error is None


def test_start_refuses_invalid_combination(tmp_path: Path) -> None:
    (tmp_path / "coschedule").write_text("disabled")
    (tmp_path / "disable-affinity-assistant").write_text("false")
    with pytest.raises(ConfigError, match="disable-affinity-assistant"):
        SettingsStore(tmp_path, {})


def test_every_invalid_key_is_reported_in_one_error() -> None:
    raw = {
        "coschedule": "sometimes",
        "topology-key": "not a key!",
        "idle-grace-seconds": "soon",
        "group-shared-claims": "perhaps",
        "policy-control-plane": "loudly",
        "topologykey": "x",
        "placeholder-image": "registry.k8s.io/pause:3.10",  # valid: not named
    }
    with pytest.raises(ConfigError) as caught:
        parse_settings(raw)
    message = str(caught.value)
    assert message.startswith("6 config problems:")
    for fragment in (
        '"coschedule"',
        '"topology-key"',
        '"idle-grace-seconds"',
        '"group-shared-claims"',
        '"policy-control-plane"',
        "unknown config key(s): topologykey",
    ):
        assert fragment in message
    assert "placeholder-image" not in message.split("known keys are")[0]


def test_one_invalid_key_reads_as_before() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings({"idle-grace-seconds": "-1"})
    assert str(caught.value) == 'config key "idle-grace-seconds": must be 0 or more'


def test_reload_gauge_and_counter_hooks(tmp_path: Path) -> None:
    from coschedule.config.store import metric_hooks
    from coschedule.server.webhook_metrics import WebhookMetrics

    metrics = WebhookMetrics()
    on_error, on_loaded = metric_hooks(metrics)
    store = SettingsStore(tmp_path, {}, on_error=on_error, on_loaded=on_loaded)

    def gauge() -> float | None:
        return metrics.registry.get_sample_value("coschedule_config_last_reload_successful")

    assert gauge() == 1.0
    (tmp_path / "idle-grace-seconds").write_text("soon")
    store.maybe_reload()
    assert gauge() == 0.0
    assert metrics.registry.get_sample_value("coschedule_config_reload_errors_total") == 1.0
    (tmp_path / "idle-grace-seconds").write_text("60")
    store.maybe_reload()
    assert gauge() == 1.0


# ---- config that loads but would break every placeholder: refused at load, naming the key


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("requests: {cpu: 1m, mem: 8Mi}", "requests.mem: not a resource name"),
        ("limits: {cpus: 1}", "limits.cpus: not a resource name"),
        ("limits: {kubernetes.io/gpu: 1}", "limits.kubernetes.io/gpu: not a resource name"),
        ("requests: {hugepages-lots: 1Mi}", "requests.hugepages-lots: not a resource name"),
    ],
)
def test_unknown_resource_names_are_refused(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match='config key "placeholder-resources"') as caught:
        parse_settings({"placeholder-resources": text})
    assert fragment in str(caught.value)


def test_every_resource_a_pod_may_request_is_accepted() -> None:
    text = (
        "requests: {cpu: 1m, memory: 8Mi, ephemeral-storage: 1Mi, hugepages-2Mi: 2Mi,"
        " example.com/device: 1}\nlimits: {memory: 16Mi, hugepages-2Mi: 2Mi, example.com/device: 1}"
    )
    settings = parse_settings({"placeholder-resources": text})
    assert settings.placeholder_resources["requests"]["hugepages-2Mi"] == "2Mi"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        # The API server's rules for a container's resources, which every placeholder pod
        # would break: refused at load, naming the key and the entries.
        ("requests: {memory: 32Mi}\nlimits: {memory: 16Mi}", "limits.memory: '16Mi' is below"),
        ("requests: {cpu: '1'}\nlimits: {cpu: 500m}", "limits.cpu: '500m' is below requests.cpu"),
        ("requests: {cpu: 1001m}\nlimits: {cpu: '1'}", "limits.cpu: '1' is below"),
        ("requests: {memory: 1Gi}\nlimits: {memory: 1G}", "limits.memory: '1G' is below"),
        ("requests: {memory: -8Mi}", "requests.memory: '-8Mi' is negative"),
        (
            "requests: {cpu: 1m, example.com/device: 1}",
            "requests.example.com/device: '1' needs limits.example.com/device",
        ),
        (
            "requests: {example.com/device: 1}\nlimits: {example.com/device: 2}",
            "requests.example.com/device: '1' must equal limits.example.com/device '2'",
        ),
        ("limits: {memory: 16Mi, example.com/device: 500m}", "'500m' is not a whole number"),
        (
            "requests: {memory: 8Mi, hugepages-2Mi: 2Mi}\n"
            "limits: {memory: 16Mi, hugepages-2Mi: 4Mi}",
            "requests.hugepages-2Mi: '2Mi' must equal limits.hugepages-2Mi '4Mi'",
        ),
        ("limits: {hugepages-2Mi: 2Mi}", "hugepages need a cpu or memory"),
    ],
)
def test_resources_the_api_server_would_refuse_are_refused_at_load(
    text: str, fragment: str
) -> None:
    with pytest.raises(ConfigError, match='config key "placeholder-resources"') as caught:
        parse_settings({"placeholder-resources": text})
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    "text",
    [
        "requests: {memory: 16Mi}\nlimits: {memory: 16Mi}",  # equal is fine
        "requests: {memory: 1G}\nlimits: {memory: 1Gi}",  # 1G < 1Gi
        "requests: {cpu: 500m}\nlimits: {cpu: '1'}",
        "requests: {memory: 8Mi}\nlimits: {cpu: 1m}",  # a limit of another resource
        "limits: {memory: 16Mi}",  # the request defaults to the limit
        "limits: {cpu: 1m, example.com/device: 2}",  # the same for a device
        "requests: {cpu: 1m, example.com/device: 2}\nlimits: {example.com/device: 2}",
    ],
)
def test_resources_within_limits_are_accepted(text: str) -> None:
    assert parse_settings({"placeholder-resources": text}).placeholder_resources


def test_the_limits_check_is_reported_with_the_other_problems() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings(
            {
                "placeholder-resources": "requests: {memory: 32Mi}\nlimits: {memory: 16Mi}",
                "idle-grace-seconds": "-1",
            }
        )
    message = str(caught.value)
    assert message.startswith("2 config problems")
    assert "limits.memory: '16Mi' is below requests.memory '32Mi'" in message


@pytest.mark.parametrize(
    "image",
    [
        "registry.k8s.io/pause:3.10",
        "pause",
        "localhost:5000/team/pause:latest",
        "[::1]:5000/pause",
        "registry.example.com/a/b/c@sha256:" + "0" * 64,
        "registry.example.com/pause:3.10@sha256:" + "a" * 64,
    ],
)
def test_image_references_are_accepted(image: str) -> None:
    assert parse_settings({"placeholder-image": f" {image}\n"}).placeholder_image == image


@pytest.mark.parametrize(
    "image",
    [
        "registry.k8s.io/Pause:3.10",
        "registry.k8s.io/pause:3.10 extra",
        "registry.k8s.io/pause:",
        "registry.k8s.io//pause",
        "pause@sha256:short",
        "https://registry.k8s.io/pause",
        "pause:" + "1" * 200,
    ],
)
def test_invalid_image_references_are_refused(image: str) -> None:
    with pytest.raises(ConfigError, match=r'config key "placeholder-image": .* is not an image'):
        parse_settings({"placeholder-image": image})


@pytest.mark.parametrize("key", ["rewrite-claims", "group-shared-claims"])
@pytest.mark.parametrize("empty", ["", "  ", "\n"])
def test_an_empty_flag_means_its_default(key: str, empty: str) -> None:
    attr = key.replace("-", "_")
    default = getattr(Settings(), attr)
    assert getattr(parse_settings({key: empty}), attr) is default
    # Not merely false: the opposite value written is read as written.
    assert getattr(parse_settings({key: str(not default).lower()}), attr) is (not default)


def test_an_empty_disable_affinity_assistant_is_absent() -> None:
    settings = parse_settings({"disable-affinity-assistant": "", "coschedule": "pipelineruns"})
    assert settings.mode is Mode.PIPELINERUNS
    assert "migration" not in settings.mode_reason


def test_mistyped_environment_variables_are_refused_naming_them() -> None:
    environ = {
        "COSCHEDULE_TOPOLOGY_KY": "topology.kubernetes.io/zone",
        "COSCHEDULE_MODE": "pipelineruns",
        "COSCHEDULE_COSCHEDULE": "pipelineruns",
        # Not typos: Service links Kubernetes injects, and the project's own switches.
        "COSCHEDULE_WEBHOOK_SERVICE_HOST": "10.0.0.1",
        "COSCHEDULE_WEBHOOK_SERVICE_PORT_HTTPS": "443",
        "COSCHEDULE_WEBHOOK_PORT": "tcp://10.0.0.1:443",
        "COSCHEDULE_WEBHOOK_PORT_443_TCP_ADDR": "10.0.0.1",
        "COSCHEDULE_E2E_REQUIRED": "1",
        "OTHER": "x",
    }
    with pytest.raises(ConfigError) as caught:
        load_settings(None, environ)
    message = str(caught.value)
    assert "COSCHEDULE_MODE, COSCHEDULE_TOPOLOGY_KY" in message
    assert "COSCHEDULE_COSCHEDULE" in message  # the mode's variable, named
    for fine in ("SERVICE_HOST", "SERVICE_PORT", "PORT_443", "E2E", "OTHER"):
        assert fine not in message.split("(the mode's", 1)[0], fine
    del environ["COSCHEDULE_TOPOLOGY_KY"], environ["COSCHEDULE_MODE"]
    assert load_settings(None, environ).mode is Mode.PIPELINERUNS


def test_every_coschedule_variable_the_project_names_is_a_key_or_a_known_switch() -> None:
    """The project's own COSCHEDULE_* names (docs, tests, benchmarks, Makefile) are each a
    config key, a Service link or one of TOOL_VARIABLE_PREFIXES: none would be refused."""
    import re

    root = Path(__file__).resolve().parents[2]
    names: set[str] = set()
    for pattern in ("**/*.py", "**/*.md", "**/*.yaml", "Makefile", ".ci/run"):
        for path in root.glob(pattern):
            if ".venv" in path.parts or not path.is_file():
                continue
            names |= set(re.findall(r"\bCOSCHEDULE_[A-Z0-9_]*[A-Z0-9]\b", path.read_text("utf-8")))
    assert "COSCHEDULE_COSCHEDULE" in names
    typos = {"COSCHEDULE_TOPOLOGY_KY", "COSCHEDULE_MODE"}  # this file's own examples
    raw = read_raw_config(None, dict.fromkeys(names - typos, "x"))
    assert "/unknown-variables" not in raw, raw.get("/unknown-variables")


# ---- isolation scope --------------------------------------------------------------------


def test_isolation_scope_and_tenant_label_parse() -> None:
    settings = parse_settings(
        {"isolation-scope": " Tenant\n", "isolation-tenant-label": "example.com/team"}
    )
    assert settings.isolation_scope is IsolationScope.TENANT
    assert settings.isolation_tenant_label == "example.com/team"
    assert parse_settings({}).isolation_scope is IsolationScope.NAMESPACE
    assert parse_settings({"isolation-scope": ""}).isolation_scope is IsolationScope.NAMESPACE


@pytest.mark.parametrize("scope", ["cluster", "tenant"])
def test_a_cross_namespace_scope_with_a_zone_key_is_refused_naming_both_keys(scope: str) -> None:
    raw = {
        "isolation-scope": scope,
        "isolation-tenant-label": "example.com/team",
        "topology-key": "topology.kubernetes.io/zone",
    }
    with pytest.raises(ConfigError) as caught:
        parse_settings(raw)
    message = str(caught.value)
    assert '"isolation-scope"' in message
    assert '"topology-key"' in message
    assert "topology.kubernetes.io/zone" in message
    # Namespace scope with a zone key is what it always was.
    assert parse_settings({**raw, "isolation-scope": "namespace"}).topology_key.endswith("zone")


def test_tenant_scope_without_the_tenant_label_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "isolation-scope").write_text("tenant")
    with pytest.raises(ConfigError, match='"isolation-tenant-label"'):
        SettingsStore(tmp_path, {})
    # From the environment too (COSCHEDULE_ISOLATION_SCOPE).
    with pytest.raises(ConfigError, match='"isolation-tenant-label"'):
        load_settings(None, {"COSCHEDULE_ISOLATION_SCOPE": "tenant"})


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"isolation-scope": "node"}, "not a scope; use one of namespace, tenant, cluster"),
        ({"isolation-tenant-label": "not a key!"}, '"isolation-tenant-label"'),
    ],
)
def test_bad_isolation_values_are_refused(raw: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        parse_settings(raw)


def test_a_reload_into_a_cross_namespace_scope_with_a_zone_key_keeps_the_last_good(
    tmp_path: Path,
) -> None:
    (tmp_path / "isolation-scope").write_text("cluster")
    store = SettingsStore(tmp_path, {})
    (tmp_path / "topology-key").write_text("topology.kubernetes.io/zone")
    store.maybe_reload()
    assert store.current.topology_key == "kubernetes.io/hostname"
    assert store.current.isolation_scope is IsolationScope.CLUSTER
    assert store.error is not None
    assert '"topology-key"' in store.error
