"""Scheduling defaults and the hardening policy (issue 7), through kubectl and the real
scheduler. Each scenario runs once the webhook understands its config keys."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from coschedule.config.settings import ConfigError, parse_settings
from coschedule.marks import run_placeholder
from tests.e2e.conftest import E2E
from tests.e2e.kube import Obj, dump, wait_for
from tests.e2e.runs import node, wait_bound, wait_placeholder_bound
from tests.e2e.world import ARCH, ARM_NODE, TektonRun, bare_pod, unique

pytestmark = pytest.mark.e2e

DEFAULTS_KEY = "scheduling-defaults"
RELOAD_SECONDS = 15.0  # the design: reloads take effect within 10 s


def understood(key: str, bad_value: str) -> bool:
    """The webhook knows a config key when it refuses a bad value for it."""
    try:
        parse_settings({key: bad_value})
    except ConfigError:
        return True
    return False


def require_key(key: str, bad_value: str) -> None:
    if os.environ.get("E2E_STRICT"):
        return
    if not understood(key, bad_value):
        pytest.skip(f"e2e: config key {key!r} is not implemented by the webhook yet")


@pytest.fixture
def arm_defaults(e2e: E2E, namespace: Callable[..., str]) -> Iterator[str]:
    """A namespace whose pods default to arm64 nodes, through the hot-reloaded config."""
    require_key(DEFAULTS_KEY, "- bogus-field: 1")
    ns = namespace(mode="pipelineruns")
    config_dir = e2e.product.config_dir
    assert config_dir is not None
    rules = [{"namespaces": [ns], "nodeSelector": {ARCH: "arm64"}}]
    write_atomic(config_dir / DEFAULTS_KEY, yaml.safe_dump(rules))
    try:
        probe = bare_pod(ns, "probe", {"coschedule.dev/group": "probe"})
        wait_for(
            f"the webhook to reload {DEFAULTS_KEY}",
            lambda: (
                (e2e.api.create(probe, dry_run=True)["spec"].get("nodeSelector") or {}).get(ARCH)
                == "arm64"
            ),
            timeout=RELOAD_SECONDS,
            interval=0.5,
            describe=lambda: e2e.product.webhook.tail(20) if e2e.product.webhook else "",
        )
        yield ns
    finally:
        (config_dir / DEFAULTS_KEY).unlink(missing_ok=True)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def test_arm64_default_lands_run_and_placeholder_on_arm64(e2e: E2E, arm_defaults: str) -> None:
    e2e.require("scheduler", "controller-manager", "reconciler")
    api = e2e.api
    ns = arm_defaults
    run = TektonRun(api, ns, unique("pr")).create()
    stored = run.create_pod("report", fixture="tekton-taskrun-no-workspace")
    assert stored["spec"].get("nodeSelector", {}).get(ARCH) == "arm64", dump(stored["spec"])
    placeholder = run_placeholder(ns, run.name)
    ph = wait_placeholder_bound(api, ns, placeholder)
    sts = api.must_get("StatefulSet", placeholder, ns)
    assert (sts["spec"]["template"]["spec"].get("nodeSelector") or {}).get(ARCH) == "arm64", dump(
        sts
    )
    assert node(ph) == ARM_NODE
    wait_bound(api, ns, run.pod_name("report"), node=ARM_NODE)


def pod_file(tmp_path: Path, pod: Obj) -> str:
    path = tmp_path / f"{pod['metadata']['name']}.json"
    path.write_text(json.dumps(pod))
    return str(path)


def test_reserved_toleration_gets_a_kubectl_warning(
    e2e: E2E, namespace: Callable[..., str], tmp_path: Path
) -> None:
    require_key("policy-reserved-tolerations", "bogus")
    ns = namespace()
    pod = bare_pod(ns, "tolerant", {"coschedule.dev/group": unique("run")})
    pod["spec"]["tolerations"] = [
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
    ]
    done = e2e.kubectl_run("create", "-f", pod_file(tmp_path, pod))
    assert done.returncode == 0, done.stderr
    shown = f"stdout: {done.stdout}\nstderr: {done.stderr}"
    assert "Warning:" in done.stderr, f"no kubectl warning:\n{shown}"
    assert "node.kubernetes.io/unschedulable" in done.stderr, shown
    assert "reserved-tolerations" in done.stderr, done.stderr
    assert e2e.api.get("Pod", "tolerant", ns) is not None


def test_zone_wide_hard_anti_affinity_refused_by_kubectl(
    e2e: E2E, namespace: Callable[..., str], tmp_path: Path
) -> None:
    require_key("policy-hard-anti-affinity-topology", "bogus")
    ns = namespace()
    pod = bare_pod(ns, "zone-hog", {"app": "zone-hog"})
    pod["spec"]["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"app": "zone-hog"}},
                    "namespaceSelector": {},
                    "topologyKey": "topology.kubernetes.io/zone",
                }
            ]
        }
    }
    done = e2e.kubectl_run("create", "-f", pod_file(tmp_path, pod))
    assert done.returncode != 0, f"kubectl create succeeded:\n{done.stdout}"
    assert "denied the request" in done.stderr, done.stderr
    assert "hard-anti-affinity-topology" in done.stderr, done.stderr
    assert "topology.kubernetes.io/zone" in done.stderr, done.stderr
    assert e2e.api.get("Pod", "zone-hog", ns) is None
