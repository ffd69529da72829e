"""The artifact users install, on real nodes: the image `make image` builds, run on two
realstack nodes of a control plane of its own, installed the two ways the README
documents (the release overlay, manifests/release, whose certs Job makes the Secret and the
caBundle; and the Helm chart), with only the realstack adaptation of tests/real/artifact/.
kube-apiserver calls the webhook through its Service. Then, through those pods: a real
PipelineRun per mode, a ConcurrencyControl, the leader reconciler pod deleted mid-run, a
webhook pod evicted while pods are admitted (the PDB holds), the probes, the mounted
certificate and a ConfigMap reload as the kubelet runs them, a cordon mid-run and a rolling
upgrade to a rebuilt image with runs in flight; all Succeeded, judged by Tekton.

Figures (build times, apply to Ready, the tier's wall time) go to the session's notes."""

from __future__ import annotations

import base64
import os
import shutil
import socket
import ssl
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from coschedule.marks import ANNOTATION_RUN_ADMITTED
from tests.conftest import PATIENCE_SECONDS, wait_until
from tests.e2e.kube import Api, ApiError, Obj, wait_for
from tests.e2e.world import (
    Ticker,
    make_namespace,
    unique,
    wait_webhook_sees,
    wait_webhook_sees_control,
)
from tests.real import artifact, conftest
from tests.real.artifact import (
    API_NODE,
    DEPLOYMENTS,
    NAMESPACE,
    OVERLAY,
    SERVICE_DNS,
    ArtifactStack,
)
from tests.real.nodes import cordon, restore
from tests.real.runs import (
    Seen,
    assert_succeeded,
    claim_placeholder_name,
    claim_template,
    describe,
    done,
    pipeline_run,
    placeholder_name,
    task,
    task_pods,
    wait_runs,
    write_read_pipeline,
)
from tests.real.stack import EXTERNAL, ROOT
from tests.real.volumes import LOCAL_CLASS, NETWORK_CLASS

pytestmark = pytest.mark.real

V1, V2 = "artifact-1", "artifact-2"
WEBHOOK_LABEL = "app.kubernetes.io/component"
LEASE = "coschedule-reconciler"


def _note(text: str) -> None:
    conftest._NOTES.append(f"artifact: {text}")


@pytest.fixture(scope="module")
def art() -> Iterator[ArtifactStack]:
    """Both images built by `make image` (the second with another version: a warm rebuild),
    the stack, the images imported into the node that runs coschedule's pods."""
    if EXTERNAL:
        pytest.skip("real: the artifact tier builds and installs its own (not on your cluster)")
    if why := artifact.unavailable():
        if os.environ.get(artifact.REQUIRED_ENV):
            pytest.fail(f"real: the artifact tier is required and cannot run: {why}")
        pytest.skip(f"real: {why}")
    started = time.monotonic()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    workdir = Path(tempfile.mkdtemp(prefix="coschedule-art-"))
    reused = artifact.reused_build()
    if reused is not None:
        # What `make image` made from this checkout just before: its version, nothing else.
        assert reused.version == version, f"{reused.image} is labelled {reused.version!r}"
        v1 = reused
        _note(f"the image make image built: {v1.image} ({v1.archive}), not built again")
    else:
        v1 = artifact.make_image(V1, version, workdir)
        _note(f"make image {v1.seconds:.0f} s")
    v2 = artifact.make_image(V2, f"{version}-upgrade", workdir)
    _note(f"rebuilt with another version (the upgrade's image) {v2.seconds:.0f} s")
    try:
        stack = artifact.start(workdir)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    failed = True
    try:
        stack.builds = {V1: v1, V2: v2}
        imported = artifact.import_images(stack, v1, v2)
        _note(f"stack up; both images imported into {API_NODE} in {imported:.0f} s")
        yield stack
        failed = False
    finally:
        if failed:
            print(stack.logs())
        artifact.stop(stack)
        for build in (v1, v2):
            if build is not reused:  # make image's own archive stays
                build.archive.unlink(missing_ok=True)
        if not os.environ.get("REAL_KEEP"):
            shutil.rmtree(workdir, ignore_errors=True)
        _note(f"tier wall time {time.monotonic() - started:.0f} s")


def _apply(art: ArtifactStack, text: str, name: str) -> str:
    path = art.workdir / name
    path.write_text(text)
    return art.kubectl("apply", "-f", str(path))


@dataclass
class Release:
    applied: str  # kubectl apply's output, warnings included
    manifest: str


@pytest.fixture(scope="module")
def release(art: ArtifactStack) -> Release:
    """`kubectl apply` of the release overlay: until both Deployments are Ready and the
    certs Job has completed (``kubectl wait --for=condition=complete``: the webhook pods can
    be Ready, the Secret made, a moment before the Job controller counts its pod)."""
    manifest = art.render_overlay(art.builds[V1])
    started = time.monotonic()
    applied = _apply(art, manifest, "release.yaml")
    art.wait_ready(art.builds[V1].image)
    seconds = art.figures["apply_to_ready"] = time.monotonic() - started
    _note(f"release overlay: kubectl apply to both Deployments Ready {seconds:.0f} s")
    wait_for(
        "the certs Job to complete",
        lambda: ((_job(art.api, "coschedule-certs") or {}).get("status") or {}).get("succeeded"),
        timeout=120,
        interval=0.5,
        describe=art.describe,
    )
    return Release(applied, manifest)


def _job(api: Api, name: str) -> Obj | None:
    return api.request("GET", f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/{name}", ok_missing=True)


def _secret(api: Api) -> Obj:
    secret = api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets/coschedule-webhook-tls")
    assert secret is not None
    return secret


def _ca_bundle(api: Api) -> bytes:
    config = api.must_get("MutatingWebhookConfiguration", "coschedule")
    bundles = {hook["clientConfig"].get("caBundle") for hook in config["webhooks"]}
    assert len(bundles) == 1, bundles
    bundle = bundles.pop()
    assert bundle, "the certs Job did not patch the caBundle"
    return base64.b64decode(bundle)


def _leader(api: Api) -> str:
    """The pod that holds the reconciler's Lease (its identity is ``POD_RANDOM``)."""
    holder: str = api.must_get("Lease", LEASE, NAMESPACE)["spec"].get("holderIdentity") or ""
    return holder.rsplit("_", 1)[0]


def _ready(pod: Obj) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def test_release_installs_from_the_image_as_shipped(art: ArtifactStack, release: Release) -> None:
    api = art.api
    image = art.builds[V1].image
    # The certs Job ran from the image and made the Secret and the caBundle.
    job = _job(api, "coschedule-certs")
    assert job is not None
    assert (job.get("status") or {}).get("succeeded") == 1, job.get("status")
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == image
    assert _secret(api)["data"]["tls.crt"]
    _ca_bundle(api)
    config = api.must_get("MutatingWebhookConfiguration", "coschedule")
    for hook in config["webhooks"]:
        service = hook["clientConfig"].get("service") or {}
        assert (service.get("name"), service.get("namespace")) == ("coschedule-webhook", NAMESPACE)
        assert "url" not in hook["clientConfig"]
    # Two replicas of each, from the image, on the pod network, Pod Security still restricted.
    labels = api.must_get("Namespace", NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert "would violate PodSecurity" not in release.applied, release.applied
    for component in ("webhook", "reconciler"):
        pods = [p for p in art.pods(component) if not p["metadata"].get("deletionTimestamp")]
        assert len(pods) == 2, art.describe()
        for pod in pods:
            assert _ready(pod), art.describe()
            assert not pod["spec"].get("hostNetwork")
            assert pod["spec"]["containers"][0]["image"] == image
            assert pod["spec"]["securityContext"]["runAsUser"] == 65532
            assert pod["status"]["podIP"].startswith("198.1"), pod["status"]["podIP"]
    # One reconciler leads.
    holder = _leader(api)
    assert holder in {p["metadata"]["name"] for p in art.pods("reconciler")}, holder
    # kube-apiserver calls the webhook pods through the Service: a pod is mutated.
    ns = unique("art-probe")
    make_namespace(api, ns, "pipelineruns")
    wait_webhook_sees(api, ns, "pipelineruns")
    api.delete("Namespace", ns)


# ---- the wave: runs per mode, a ConcurrencyControl, both kinds of pod deleted mid-run ----

PROBE_POD: Obj = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"generateName": "admit-", "labels": {"coschedule.dev/group": "admission-loop"}},
    "spec": {
        "serviceAccountName": "ci-builder",
        "automountServiceAccountToken": False,
        "containers": [{"name": "c", "image": "localhost/pause:local"}],
    },
}


@dataclass
class AdmissionLoop:
    """Dry-run pods admitted one after another, in a thread: each must be mutated."""

    api: Api
    namespace: str
    admitted: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> AdmissionLoop:
        self._thread = threading.Thread(target=self._loop, name="admissions", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        pod = {**PROBE_POD, "metadata": {**PROBE_POD["metadata"], "namespace": self.namespace}}
        while not self._stop.is_set():
            try:
                stored = self.api.create(pod, dry_run=True)
                mode = (stored["metadata"].get("annotations") or {}).get("coschedule.dev/mode")
                if mode != "pipelineruns":
                    self.failures.append(f"not mutated: mode {mode!r}")
                self.admitted += 1
            except (ApiError, OSError) as exc:
                self.failures.append(str(exc)[:300])
            time.sleep(0.1)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)


def _disruptions_allowed(api: Api) -> int:
    pdb = api.request(
        "GET", f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets/coschedule-webhook"
    )
    return int(((pdb or {}).get("status") or {}).get("disruptionsAllowed") or 0)


def _evict(api: Api, pod: str) -> int:
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": NAMESPACE},
    }
    try:
        api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}/eviction", body)
    except ApiError as exc:
        return exc.status
    return 201


def _namespace(api: Api, prefix: str, mode: str | None) -> str:
    name = unique(f"art-{prefix}")
    make_namespace(api, name, mode)
    # Until the webhook has seen the namespace, its pods get the cluster's mode: workspaces,
    # which marks no pod without claims (so there is nothing to wait for).
    if mode not in (None, "workspaces"):
        wait_webhook_sees(api, name, mode)
    return name


GO_FILE = "go"  # what a held ``slow`` task waits for in its workspace (_release_slow_task)
HELD = -1  # seconds: ``slow`` waits for GO_FILE rather than sleeping


def _slow_pipeline(seconds: int) -> tuple[list[Obj], list[Obj]]:
    """``slow`` sleeps (or, HELD, waits up to 15 minutes until the test writes GO_FILE into
    its volume), then write_read_pipeline's tasks: pods are created across whatever the
    scenario does meanwhile."""
    tasks, finally_ = write_read_pipeline()
    tasks[0]["runAfter"] = ["slow"]
    script = (
        # Backquotes: Tekton reads every $(...) as one of its variables.
        f"for n in `seq 900`; do [ -f $(workspaces.src.path)/{GO_FILE} ] && break; sleep 1; done\n"
        f"[ -f $(workspaces.src.path)/{GO_FILE} ]\n"
        if seconds == HELD
        else f"sleep {seconds}\n"
    )
    return [task("slow", script, ["src"]), *tasks], finally_


def _release_slow_task(api: Api, namespace: str, run: str) -> None:
    """Write GO_FILE into the held ``slow`` task's volume, on the host: the suite's
    provisioner makes hostPath volumes under the stack's folder."""
    pod = task_pods(api, namespace, run)["slow"]
    (claim,) = [
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    ]
    volume = api.must_get("PersistentVolumeClaim", claim, namespace)["spec"]["volumeName"]
    path = Path(api.must_get("PersistentVolume", volume)["spec"]["hostPath"]["path"])
    (path / GO_FILE).write_text("go\n")


def _two_workspace_run(namespace: str, name: str, seconds: int, storage_class: str) -> Obj:
    tasks, finally_ = _slow_pipeline(seconds)
    return pipeline_run(
        namespace,
        name,
        tasks,
        {
            "src": {"volumeClaimTemplate": claim_template(storage_class)},
            "cache": {"volumeClaimTemplate": claim_template(storage_class)},
        },
        finally_=finally_,
    )


def _running(api: Api, namespace: str, run: str, task_name: str) -> str | None:
    pod = task_pods(api, namespace, run).get(task_name)
    if pod and (pod.get("status") or {}).get("phase") == "Running":
        node: str = pod["spec"]["nodeName"]
        return node
    return None


def _statefulsets(api: Api, namespace: str) -> dict[str, str]:
    return {s["metadata"]["name"]: s["metadata"]["uid"] for s in api.list("StatefulSet", namespace)}


@dataclass
class Wave:
    namespaces: dict[str, str]
    runs: dict[str, dict[str, Obj]]
    admissions: AdmissionLoop
    second_eviction: int
    deleted_reconciler: str
    reconcilers_before: set[str]
    reload_pods: dict[str, str]  # pod name -> container, the pods that saw the config change
    placeholders_before: dict[str, dict[str, str]]
    placeholders_after: dict[str, dict[str, str]]


QUEUE = ("q0", "q1")
ISOLATED = ("iso-a", "iso-b")


@pytest.fixture(scope="module")
def wave(art: ArtifactStack, release: Release) -> Wave:
    api = art.api
    ns = {
        "workspaces": _namespace(api, "ws", "workspaces"),
        "pipelineruns": _namespace(api, "pr", "pipelineruns"),
        "queue": _namespace(api, "queue", "pipelineruns"),
    }
    control = {
        "apiVersion": "coschedule.dev/v1alpha1",
        "kind": "ConcurrencyControl",
        "metadata": {"name": "one-at-a-time", "namespace": ns["queue"]},
        "spec": {"selector": {}, "kinds": ["PipelineRun"], "strategy": "Queue", "maxRunning": 1},
    }
    api.create(control)
    probe = _two_workspace_run(ns["queue"], "probe", 1, LOCAL_CLASS)
    wait_webhook_sees_control(api, ns["queue"], "one-at-a-time", probe)
    # The ConfigMap changes now; the kubelet updates the mounted folder within its sync period.
    reload_pods = {p["metadata"]["name"]: "webhook" for p in art.pods("webhook")}
    reload_pods |= {p["metadata"]["name"]: "reconciler" for p in art.pods("reconciler")}
    api.patch("ConfigMap", "coschedule-config", {"data": {"stuck-grace-seconds": "45"}}, NAMESPACE)

    shared_claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "shared", "namespace": ns["workspaces"]},
                    **claim_template(LOCAL_CLASS)}  # fmt: skip
    api.create(shared_claim)
    tasks, _ = _slow_pipeline(20)
    api.create(
        pipeline_run(
            ns["workspaces"],
            "ws-run",
            [tasks[0], tasks[1], tasks[3]],  # slow, write, lint: one workspace
            {"src": {"persistentVolumeClaim": {"claimName": "shared"}}},
        )
    )
    api.create(_two_workspace_run(ns["pipelineruns"], "pr-run", 20, LOCAL_CLASS))
    for run in QUEUE:
        api.create(_two_workspace_run(ns["queue"], run, 3, LOCAL_CLASS))

    wait_for(
        "the slow tasks to run",
        lambda: all(
            _running(api, ns[key], run, "slow")
            for key, run in (("workspaces", "ws-run"), ("pipelineruns", "pr-run"))
        ),
        timeout=180,
        describe=lambda: describe(api, ns["pipelineruns"]) + describe(api, ns["workspaces"]),
    )
    before = {key: _statefulsets(api, name) for key, name in ns.items()}
    # The leader reconciler pod deleted mid-run: the Deployment makes a new one.
    reconcilers_before = {p["metadata"]["name"] for p in art.pods("reconciler")}
    leader = _leader(api)
    api.delete("Pod", leader, NAMESPACE)
    # A webhook pod evicted while pods are admitted; the PDB refuses the second eviction.
    wait_for("the PDB to allow one disruption", lambda: _disruptions_allowed(api) >= 1, timeout=120)
    admissions = AdmissionLoop(api, ns["pipelineruns"]).start()
    try:
        webhooks = sorted(p["metadata"]["name"] for p in art.pods("webhook"))
        assert _evict(api, webhooks[0]) == 201
        second = _evict(api, webhooks[1])
        art.wait_ready(timeout=180)
        time.sleep(3)  # admissions go on through the new pod too
    finally:
        admissions.stop()
    # While the runs still run (a run's placeholder goes when it ends).
    after = {key: _statefulsets(api, name) for key, name in ns.items()}
    runs = {key: wait_runs(api, name, [], timeout=300, until=_all_done) for key, name in ns.items()}
    return Wave(
        ns,
        runs,
        admissions,
        second,
        leader,
        reconcilers_before,
        reload_pods,
        before,
        after,
    )


def _all_done(runs: dict[str, Obj]) -> bool:
    return bool(runs) and all(done(run) for run in runs.values())


def _nodes_of(api: Api, namespace: str, run: str) -> set[str]:
    return {p["spec"]["nodeName"] for p in task_pods(api, namespace, run).values()}


def test_a_run_per_mode_succeeds_through_the_pods(art: ArtifactStack, wave: Wave) -> None:
    api = art.api
    ns = wave.namespaces
    assert_succeeded(wave.runs["workspaces"], api, ns["workspaces"], "ws-run")
    assert_succeeded(wave.runs["pipelineruns"], api, ns["pipelineruns"], "pr-run")
    for key, run in (("workspaces", "ws-run"), ("pipelineruns", "pr-run")):
        nodes = _nodes_of(api, ns[key], run)
        assert len(nodes) == 1, f"{run} ran on {nodes}\n{describe(api, ns[key])}"
    # The run's placeholder (pipelineruns) and the claim's (workspaces) were made.
    assert (
        placeholder_name(ns["pipelineruns"], "pr-run") in wave.placeholders_before["pipelineruns"]
    )
    # The run was stamped when admitted, and Tekton copied the stamp onto every pod of it:
    # whichever webhook replica a first pod reaches sees that its placeholder is on its way.
    made = wave.runs["pipelineruns"]["pr-run"]
    stamp = (made["metadata"].get("annotations") or {}).get(ANNOTATION_RUN_ADMITTED)
    assert stamp, made["metadata"]
    for name, pod in task_pods(api, ns["pipelineruns"], "pr-run").items():
        assert (pod["metadata"].get("annotations") or {}).get(ANNOTATION_RUN_ADMITTED) == stamp, (
            name
        )
    shared = claim_placeholder_name(ns["workspaces"], "shared")
    assert shared in wave.placeholders_before["workspaces"], describe(api, ns["workspaces"])


def test_a_concurrency_control_queues_the_second_run(art: ArtifactStack, wave: Wave) -> None:
    api = art.api
    ns = wave.namespaces["queue"]
    assert_succeeded(wave.runs["queue"], api, ns, *QUEUE)
    # One at a time: the later run's first pod was made after the earlier run completed.
    windows = sorted(
        (
            min(p["metadata"]["creationTimestamp"] for p in task_pods(api, ns, run).values()),
            wave.runs["queue"][run]["status"]["completionTime"],
        )
        for run in QUEUE
    )
    assert windows[1][0] >= windows[0][1], windows


def test_the_reconciler_pod_deleted_mid_run(art: ArtifactStack, wave: Wave) -> None:
    api = art.api
    now = {p["metadata"]["name"] for p in art.pods("reconciler") if _ready(p)}
    assert wave.deleted_reconciler not in now
    assert now - wave.reconcilers_before, "the Deployment made a new reconciler pod"
    assert len(now) == 2, art.describe()
    wait_for("a live reconciler pod to lead", lambda: _leader(api) in now, timeout=60)
    # The runs it was reconciling kept their placeholders: none recreated.
    for key in ("workspaces", "pipelineruns"):
        before, after = wave.placeholders_before[key], wave.placeholders_after[key]
        assert {n: after.get(n) for n in before} == before, f"{key}: placeholder recreated"


def test_admission_never_stopped_and_the_pdb_held(wave: Wave) -> None:
    assert wave.admissions.failures == [], wave.admissions.failures[:5]
    assert wave.admissions.admitted > 20, wave.admissions.admitted
    assert wave.second_eviction == 429, "the PDB (minAvailable 1) refuses the second eviction"


def test_probes_certificate_mount_and_config_reload(art: ArtifactStack, wave: Wave) -> None:
    api = art.api
    # Readiness: the Service's endpoints are exactly the Ready webhook pods.
    slices = api.request(
        "GET",
        f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices",
        params={"labelSelector": "kubernetes.io/service-name=coschedule-webhook"},
    )
    assert slices is not None
    endpoints = {
        address
        for piece in slices["items"]
        for endpoint in piece.get("endpoints") or []
        if (endpoint.get("conditions") or {}).get("ready")
        for address in endpoint["addresses"]
    }
    webhooks = [p for p in art.pods("webhook") if _ready(p)]
    assert endpoints == {p["status"]["podIP"] for p in webhooks}, art.describe()
    # Liveness: the kubelet has probed every pod since it started, and restarted none.
    for pod in art.pods("webhook") + art.pods("reconciler"):
        for status in pod["status"]["containerStatuses"]:
            assert status["restartCount"] == 0, art.describe()
    # The certificate mounted from the Secret is what each pod serves, valid for the
    # Service's name under the caBundle the certs Job wrote. Right after the install the
    # reconciler's leader replaces the Job's certificate with one from its own CA (both CAs
    # trusted meanwhile), and the kubelet brings a changed Secret into the pods within its
    # sync period (about a minute): so each pod serves the Secret's certificate in time.
    ca = _ca_bundle(api)

    def served(pod: Obj) -> str:
        context = ssl.create_default_context(cadata=ca.decode())
        with (
            socket.create_connection((pod["status"]["podIP"], 8443), timeout=10) as sock,
            context.wrap_socket(sock, server_hostname=SERVICE_DNS) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
        assert der is not None
        return ssl.DER_cert_to_PEM_cert(der).strip()

    def every_pod_serves_the_secret() -> bool:
        secret_cert = base64.b64decode(_secret(api)["data"]["tls.crt"]).decode()
        return all(served(pod) in secret_cert for pod in webhooks)

    wait_for("every webhook pod to serve the Secret's certificate", every_pod_serves_the_secret,
             timeout=150, interval=2, describe=art.describe)  # fmt: skip
    # The ConfigMap edit reached the processes that were running then, through the kubelet.
    alive = {p["metadata"]["name"]: p for p in art.pods("webhook") + art.pods("reconciler")}
    watched = {name: c for name, c in wave.reload_pods.items() if name in alive}
    assert set(watched.values()) == {"webhook", "reconciler"}, watched

    def reloaded() -> bool:
        return all(
            "config reloaded" in art.pod_log(alive[name], container)
            for name, container in watched.items()
        )

    wait_for("the config reload in every pod", reloaded, timeout=150, interval=2,
             describe=art.describe)  # fmt: skip


# ---- a cordon mid-run and a rolling upgrade, with runs in flight ----


@dataclass
class StatefulSetUids(Ticker):
    """Every uid each StatefulSet of a namespace had, sampled from start to stop: a
    placeholder made again shows two."""

    thread_name: ClassVar[str] = "statefulsets"
    api: Api = field(kw_only=True)
    namespace: str = field(kw_only=True)
    uids: dict[str, set[str]] = field(default_factory=dict)

    def step(self) -> None:
        for name, uid in _statefulsets(self.api, self.namespace).items():
            self.uids.setdefault(name, set()).add(uid)


@dataclass
class Upgrade:
    namespaces: dict[str, str]
    runs: dict[str, dict[str, Obj]]
    cordoned: str
    admissions: AdmissionLoop
    refused_with_the_job: str  # the server's dry run of the new apply, the old Job still there
    placeholders: StatefulSetUids
    in_flight_when_ready: bool  # the upgrade's run had not ended when the rollout had
    seconds: float


@pytest.fixture(scope="module")
def upgrade(art: ArtifactStack, wave: Wave) -> Upgrade:
    api = art.api
    ns = {
        "cordon": _namespace(api, "cordon", "pipelineruns"),
        "upgrade": _namespace(api, "up", "pipelineruns"),
    }
    tasks = [
        task("first", "echo kept > $(workspaces.ws.path)/f\nsleep 15\n", ["ws"]),
        task("second", "grep -qx kept $(workspaces.ws.path)/f\n", ["ws"], run_after=["first"]),
    ]
    api.create(
        pipeline_run(
            ns["cordon"],
            "moved",
            tasks,
            {"ws": {"volumeClaimTemplate": claim_template(NETWORK_CLASS)}},
            finally_=[task("last", "cat $(workspaces.ws.path)/f\n", ["ws"])],
        )
    )
    # Held in its first task until the rollout is over (81 to 184 s on a loaded machine):
    # the test checks that it was still running when both Deployments were Ready.
    api.create(_two_workspace_run(ns["upgrade"], "up-run", HELD, LOCAL_CLASS))
    node = wait_for(
        "the cordon run's first task to run",
        lambda: _running(api, ns["cordon"], "moved", "first"),
        timeout=180,
        describe=lambda: describe(api, ns["cordon"]),
    )
    wait_for(
        "the upgrade run's first task to run",
        lambda: _running(api, ns["upgrade"], "up-run", "slow"),
        timeout=180,
        describe=lambda: describe(api, ns["upgrade"]),
    )
    placeholders = StatefulSetUids(api=api, namespace=ns["upgrade"], interval=0.5).start()
    cordon(api, node)
    try:
        # Uncordoned once the later task is placed: coschedule's own pods (on the relay's
        # node) must be free to move in the upgrade below.
        wait_for(
            "the cordon run's second task placed",
            lambda: (
                (task_pods(api, ns["cordon"], "moved").get("second") or {})
                .get("spec", {})
                .get("nodeName")
            ),
            timeout=120,
            describe=lambda: describe(api, ns["cordon"]),
        )
    finally:
        restore(api, node)
    admissions = AdmissionLoop(api, ns["upgrade"]).start()
    try:
        started = time.monotonic()
        manifest = art.workdir / "release-v2.yaml"
        manifest.write_text(art.render_overlay(art.builds[V2]))
        # docs/upgrade.md: within the certs Job's TTL (an hour) apply refuses the new image
        # for it (a Job's pod template cannot change)...
        refused = art.kubectl("apply", "--dry-run=server", "-f", str(manifest), check=False)
        # ...so the finished Job goes first, with the command the doc gives.
        art.kubectl("-n", NAMESPACE, "delete", "job", "coschedule-certs", "--ignore-not-found")
        art.kubectl("apply", "-f", str(manifest))
        art.wait_ready(art.builds[V2].image, timeout=2 * PATIENCE_SECONDS)
        seconds = time.monotonic() - started
        run = api.must_get("PipelineRun", "up-run", ns["upgrade"])
        in_flight = not done(run)
        _release_slow_task(api, ns["upgrade"], "up-run")
        runs = {
            key: wait_runs(api, name, [], timeout=300, until=_all_done) for key, name in ns.items()
        }
    finally:
        admissions.stop()
        placeholders.stop()
    _note(f"rolling upgrade to the rebuilt image: {seconds:.0f} s to both Deployments Ready")
    return Upgrade(ns, runs, node, admissions, refused, placeholders, in_flight, seconds)


def test_cordon_mid_run_moves_the_later_tasks(art: ArtifactStack, upgrade: Upgrade) -> None:
    api = art.api
    ns = upgrade.namespaces["cordon"]
    assert_succeeded(upgrade.runs["cordon"], api, ns, "moved")
    placed = {name: pod["spec"]["nodeName"] for name, pod in task_pods(api, ns, "moved").items()}
    assert placed["first"] == upgrade.cordoned, describe(api, ns)
    assert placed["second"] == placed["last"] != upgrade.cordoned, f"{placed}\n{describe(api, ns)}"


def test_rolling_upgrade_with_a_run_in_flight(art: ArtifactStack, upgrade: Upgrade) -> None:
    api = art.api
    ns = upgrade.namespaces["upgrade"]
    old, new = art.builds[V1], art.builds[V2]
    # The rebuilt image is another image: its own version label, its own ID.
    assert new.version == f"{old.version}-upgrade", (old.version, new.version)
    assert new.image_id != old.image_id, f"both builds are {old.image_id}"
    assert_succeeded(upgrade.runs["upgrade"], api, ns, "up-run")
    assert upgrade.in_flight_when_ready, "the run ended before the rollout did: lengthen it"
    placeholder = placeholder_name(ns, "up-run")
    assert placeholder in upgrade.placeholders.uids, upgrade.placeholders.uids
    assert len(upgrade.placeholders.uids[placeholder]) == 1, "the placeholder was made again"
    assert len(_nodes_of(api, ns, "up-run")) == 1, describe(api, ns)
    assert upgrade.admissions.failures == [], upgrade.admissions.failures[:5]
    # Every pod now runs the rebuilt image: the kubelet's imageID is the new build's.
    for component in ("webhook", "reconciler"):
        pods = [p for p in art.pods(component) if not p["metadata"].get("deletionTimestamp")]
        assert len(pods) == 2, art.describe()
        for pod in pods:
            assert pod["spec"]["containers"][0]["image"] == new.image, art.describe()
            status = pod["status"]["containerStatuses"][0]
            assert status["imageID"] == new.image_id, (pod["metadata"]["name"], status)
    # The certs Job, as docs/upgrade.md says: the apply was refused for it while it was
    # there; deleted, it was made again from the new image (and admission never stopped).
    refused = upgrade.refused_with_the_job
    assert '"coschedule-certs" is invalid' in refused, refused
    assert "field is immutable" in refused, refused
    job = _job(api, "coschedule-certs")
    assert job is not None
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == new.image
    wait_until(
        lambda: ((_job(api, "coschedule-certs") or {}).get("status") or {}).get("succeeded"),
        "the new certs Job to succeed",
        describe=art.describe,
    )


# ---- the Helm chart, on the same nodes ----


def test_helm_chart_installs_and_runs(art: ArtifactStack, upgrade: Upgrade) -> None:
    from tests.chart import render_chart_text

    api = art.api
    # The overlay's install goes (the CRD stays, as `kubectl delete -k` of an overlay keeps it).
    kept = [
        doc
        for doc in yaml.safe_load_all((art.workdir / "release-v2.yaml").read_text())
        if doc and doc["kind"] != "CustomResourceDefinition"
    ]
    removal = art.workdir / "release-objects.yaml"
    removal.write_text(yaml.safe_dump_all(kept))
    art.kubectl("delete", "-f", str(removal), "--ignore-not-found", "--wait=true", "--timeout=180s")
    wait_for(
        f"namespace {NAMESPACE} gone",
        lambda: api.get("Namespace", NAMESPACE) is None,
        timeout=180,
        interval=1,
    )
    values = yaml.safe_load(
        art.fill((OVERLAY / "values-realstack.yaml").read_text(), art.builds[V2])
    )
    chart = art.render_chart(render_chart_text(values), art.builds[V2])
    started = time.monotonic()
    art.kubectl("apply", "-f", str(ROOT / "manifests" / "base" / "namespace.yaml"))
    applied = _apply(art, chart, "chart.yaml")
    art.wait_ready(art.builds[V2].image)
    seconds = time.monotonic() - started
    _note(f"Helm chart: kubectl apply to both Deployments Ready {seconds:.0f} s")
    assert "would violate PodSecurity" not in applied, applied

    # The webhook's pods start once the Job has written the Secret; the Job's own status may
    # say it succeeded a moment after they are Ready (its pod's exit, then the Job
    # controller's write).
    def certs_jobs() -> list[Obj]:
        found = api.request("GET", f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs") or {}
        return list(found.get("items") or [])

    wait_for(
        "the certs Job succeeded",
        lambda: any(j["status"].get("succeeded") for j in certs_jobs()),
        timeout=60,
        interval=0.5,
    )
    jobs = certs_jobs()
    assert [j["status"].get("succeeded") for j in jobs] == [1], jobs
    for name in DEPLOYMENTS:
        labels = api.must_get("Deployment", name, NAMESPACE)["metadata"]["labels"]
        assert labels.get("app.kubernetes.io/managed-by") == "Helm", labels
    # The isolate-pipelinerun mode through the chart's pods: two runs, one node each.
    ns = _namespace(api, "iso", "isolate-pipelinerun")
    for run in ISOLATED:
        api.create(_two_workspace_run(ns, run, 1, LOCAL_CLASS))
    seen = Seen()
    runs = wait_runs(api, ns, list(ISOLATED), seen=seen, timeout=300)
    assert_succeeded(runs, api, ns, *ISOLATED)
    nodes = [_nodes_of(api, ns, run) for run in ISOLATED]
    for run, on in zip(ISOLATED, nodes, strict=True):
        assert len(on) == 1, describe(api, ns)
        assert seen.placeholder_nodes(placeholder_name(ns, run)) == on, describe(api, ns)
    assert nodes[0] != nodes[1], f"isolated runs shared a node: {nodes}\n{describe(api, ns)}"
