"""bench.scheduler's as-deployed scenarios, without a cluster: how each batch is made (burst
seeded, burst gated, steady), when each run arrives, what a run's first pod bound is counted
from, and that each scenario is compared with plain pods made the same way."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import pytest

from bench import scheduler as sb
from bench.decide import run_claims_cache
from coschedule.config.settings import Settings
from coschedule.k8s.timefmt import parse_time
from coschedule.marks import Mode
from coschedule.mutate.decision import AdmissionContext, decide
from coschedule.reconcile.model import MarkedPod
from coschedule.reconcile.placeholder import group_spec, pod_template
from coschedule.reconcile.run_seed import seed, slim_run
from coschedule.reconcile.shapes import parse_marked
from tests.e2e.cluster import Proc

Obj = dict[str, Any]


class RecordingApi:
    """Stores what is created, as kube-apiserver answers it (a uid per object)."""

    def __init__(self) -> None:
        self.made: list[tuple[str, Obj]] = []

    async def create(self, path: str, body: Obj) -> Obj:
        self.made.append((path, body))
        return {**body, "metadata": {**body["metadata"], "uid": f"uid-{len(self.made)}"}}


PLAN = replace(sb.QUICK, groups=3, per_group=4)


def test_the_three_as_deployed_scenarios_are_the_default() -> None:
    assert sb.Plan().encodings == sb.AS_DEPLOYED
    assert [sb.ENCODINGS[name].scenario for name in sb.AS_DEPLOYED] == [
        "seeded",
        "gated",
        "steady",
    ]
    assert all(sb.ENCODINGS[name].pods == sb.DEPLOYED for name in sb.AS_DEPLOYED)
    # The stand-ins are still there, as bursts.
    assert sb.ENCODINGS["gate-pin-spread"].cadence_s == 0.0


@pytest.mark.parametrize(
    ("name", "stopped_first", "cadence"),
    [(sb.DEPLOYED, False, 0.0), (sb.DEPLOYED_GATED, True, 0.0), (sb.DEPLOYED_STEADY, False, 0.2)],
)
def test_each_scenario_makes_its_runs_when_it_says(
    name: str, stopped_first: bool, cadence: float
) -> None:
    """A burst makes every run's owners before the watch opens (gated: with the scheduler
    already stopped); steady makes each run's owners at its arrival, inside the window."""
    batch = sb.deployed_batch("co-0", PLAN, sb.ENCODINGS[name])
    assert batch.kind == name
    assert batch.counted == 12
    assert len(batch.runs) == 3 == len(batch.groups)
    assert batch.stop_before_prepare is stopped_first
    assert batch.cadence_s == cadence
    assert (batch.prepare is None) is bool(cadence)
    assert (batch.prepare_run is None) is not bool(cadence)


def test_a_steady_run_is_owned_alone_at_its_arrival() -> None:
    """``prepare_run`` makes one run's PipelineRun and TaskRuns and points only that run's
    pods at them (the reconciler resolves a pod's run through those owners)."""
    batch = sb.deployed_batch("co-0", PLAN, sb.ENCODINGS[sb.DEPLOYED_STEADY])
    assert batch.prepare_run is not None
    api = RecordingApi()
    first, second = list(batch.runs)[:2]
    prepare_run = batch.prepare_run

    async def arrive() -> None:
        await prepare_run(cast(sb.Client, api), second)

    asyncio.run(arrive())
    kinds = [body["kind"] for _, body in api.made]
    assert kinds == ["PipelineRun"] + ["TaskRun"] * 4
    assert api.made[0][1]["metadata"]["name"] == second
    [work] = [step({}) for step in batch.steps]
    pods = {pod["metadata"]["name"]: pod for pod in work.create}
    task_runs = {body["metadata"]["name"]: i + 1 for i, (_, body) in enumerate(api.made)}
    for name in batch.runs[second]:
        meta = pods[name]["metadata"]
        [owner] = meta["ownerReferences"]
        assert owner["kind"] == "TaskRun"
        assert owner["uid"] == f"uid-{task_runs[meta['labels']['tekton.dev/taskRun']]}"
        assert meta["labels"]["tekton.dev/pipelineRunUID"] == "uid-1"
    for name in batch.runs[first]:  # not made yet: still the fixture's owner
        assert pods[name]["metadata"]["labels"]["tekton.dev/pipelineRunUID"] != "uid-1"


def test_plain_steady_runs_make_their_owners_at_arrival_as_the_deployed_ones_do() -> None:
    """A steady window holds each run's owners being made: plain runs make theirs too (in
    the namespace coschedule does not serve), so the two windows hold the same work; a plain
    burst makes none (its owners would be made before its window)."""
    assert sb.plain_batch("plain-0", PLAN).prepare_run is None
    batch = sb.plain_batch("plain-0", PLAN, cadence_s=0.2)
    assert batch.prepare_run is not None
    prepare_run = batch.prepare_run
    api = RecordingApi()
    run = list(batch.runs)[1]

    async def arrive() -> None:
        await prepare_run(cast(sb.Client, api), run)

    asyncio.run(arrive())
    assert [body["kind"] for _, body in api.made] == ["PipelineRun"] + ["TaskRun"] * 4
    assert {path.split("/")[5] for path, _ in api.made} == {sb.PLAIN_NS}
    assert api.made[0][1]["metadata"]["name"] == run
    [work] = [step({}) for step in batch.steps]
    owned = [pod for pod in work.create if pod["metadata"]["name"] in batch.runs[run]]
    assert {pod["metadata"]["ownerReferences"][0]["uid"] for pod in owned} == {
        f"uid-{i}" for i in range(2, 6)
    }


def test_steady_arrivals_are_one_run_every_cadence_with_its_own_pods() -> None:
    batch = sb.plain_batch("plain-0", PLAN, cadence_s=0.2)
    assert batch.kind == "plain:steady"
    [work] = [step({}) for step in batch.steps]
    plan = sb.arrivals(batch.runs, work.create, batch.cadence_s)
    assert [(at, run) for at, run, _ in plan] == [(0.0, "pr-00"), (0.2, "pr-01"), (0.4, "pr-02")]
    for _, run, pods in plan:
        assert [p["metadata"]["name"] for p in pods] == batch.runs[run]
    assert sum(len(pods) for _, _, pods in plan) == len(work.create)


def test_a_runs_first_pod_bound_is_counted_from_its_own_start() -> None:
    runs = {"a": ["a-1", "a-2"], "b": ["b-1"], "c": ["c-1"]}
    bound_at = {"a-2": 10.5, "a-1": 11.0, "b-1": 12.0}
    # A burst: every run starts when the scheduler is continued.
    assert sb.first_bound(runs, bound_at, dict.fromkeys(runs, 10.0)) == [0.5, 2.0]
    # Steady: each run from its own arrival; a run with no pod bound is left out.
    assert sb.first_bound(runs, bound_at, {"a": 10.2, "b": 11.9, "c": 12.0}) == pytest.approx(
        [0.3, 0.1]
    )


def test_a_runs_placeholder_bound_is_counted_from_the_runs_start() -> None:
    runs = {"a": ["a-1", "a-2"], "b": ["b-1"], "c": ["c-1"]}
    groups = {"ph-a-0": ["a-1", "a-2"], "ph-b-0": ["b-1"], "ph-c-0": ["c-1"]}
    bound_at = {"ph-a-0": 10.4, "ph-b-0": 9.0}  # b's before the start; c's never seen
    assert sb.placeholders_bound(groups, runs, bound_at, dict.fromkeys(runs, 10.0)) == (
        pytest.approx([0.4, -1.0])
    )
    steady = {"a": 10.2, "b": 8.5}  # c has not arrived
    assert sb.placeholders_bound(groups, runs, bound_at, steady) == pytest.approx([0.2, 0.5])


def test_each_scenario_is_compared_with_plain_pods_made_the_same_way() -> None:
    """Burst scenarios against the burst plain batches, steady against plain pods arriving
    at the same rate; the table names the scenario and the share pinned at admission."""
    plan = replace(PLAN, encodings=(sb.DEPLOYED_GATED, sb.DEPLOYED_STEADY))
    gated = sb.BatchResult(sb.DEPLOYED_GATED, 50, 0.2, 1.0, 5, 5, holder_nodes=5, gated=50)
    gated.webhook_cpu_s, gated.reconciler_cpu_s = 0.1, 0.3
    gated.lift = [0.2, 0.4, 1.0]
    gated.placeholder_bound = [0.3, 0.1, 0.6]
    gated.first_bound = [0.5, 0.7]
    gated.first_bound_logged = [0.3, 0.4]
    gated.apiserver_cpu_s = 0.75
    steady = sb.BatchResult(sb.DEPLOYED_STEADY, 50, 0.06, 6.0, 5, 5, holder_nodes=5, gated=10)
    steady.first_bound = [0.1, 0.2]
    plain_steady = sb.BatchResult("plain:steady", 50, 0.03, 6.0)
    plain_steady.first_bound = [0.01, 0.02]
    plain = sb.BatchResult("plain", 50, 0.1, 0.5)
    plain.first_bound_logged = [0.2, 0.25]
    plain.apiserver_cpu_s = 0.25
    rows = [
        plain,
        gated,
        sb.BatchResult(f"beside:{sb.DEPLOYED_GATED}", 50, 0.1, 0.5),
        plain_steady,
        steady,
        sb.BatchResult(f"beside:{sb.DEPLOYED_STEADY}", 50, 0.03, 6.0),
    ]
    result = sb.summarize(50, plan, rows, 1.0, 0.0, 0.0)
    by_name = {row["name"]: row for row in result["encodings"]}
    burst, arriving = by_name[sb.DEPLOYED_GATED], by_name[sb.DEPLOYED_STEADY]
    assert burst["cpu_ratios"] == [2.0]
    assert arriving["cpu_ratios"] == [2.0]
    assert burst["throughput_ratios"] == [0.5]
    assert arriving["throughput_ratios"] == [1.0]
    assert burst["plain"]["pods"] == 50
    assert arriving["plain"]["first_bound_p99_s"] == 0.02
    assert burst["pinned_at_admission"] == "0/50"
    assert arriving["pinned_at_admission"] == "40/50"
    # Scheduler 4 ms + webhook 2 ms + reconciler 6 ms per pod, over plain's 2 ms.
    assert burst["control_plane_ratio"] == 6.0
    assert burst["lift_p50_s"] == 0.4
    assert burst["lift_p99_s"] == 1.0
    assert (burst["placeholder_bound_p50_s"], burst["placeholder_bound_p99_s"]) == (0.3, 0.6)
    assert result["plain_steady"]["cpu_ms_per_pod"] == 0.6
    table = sb.render([result])
    assert "| 50 | burst, gated | 2.00x (2.00-2.00) | 0.50x (0.50-0.50) |" in table
    assert "| 50 | steady | 2.00x (2.00-2.00) | 1.00x (1.00-1.00) |" in table
    assert "| 1.00x | 0/50 |" in table
    assert "| 1.00x | 40/50 |" in table
    assert (
        "50 nodes, burst, gated, reconciler: a run's placeholder bound after its start p50 "
        "0.30 s, p99 0.60 s; placeholder bound -> gate lifted p50 0.40 s"
    ) in table
    # kube-apiserver: 15 ms per gated pod against plain's 5; the first pod by both clocks.
    assert (burst["apiserver_ms_per_pod"], burst["plain"]["apiserver_ms_per_pod"]) == (15.0, 5.0)
    assert (
        "50 nodes, burst, gated, kube-apiserver 15.00 ms CPU per pod (plain 5.00 ms); a run's "
        "first pod bound as kube-scheduler logged it p50 0.30 s / p99 0.40 s (plain 0.20 s / "
        "0.25 s), as the benchmark's watch saw it 0.50 s / 0.70 s"
    ) in table


def gated_triple() -> list[sb.BatchResult]:
    """One round's batches of the gated burst: plain, gated (its placeholders on 5 nodes),
    plain beside it."""
    gated = sb.BatchResult(sb.DEPLOYED_GATED, 50, 0.2, 1.0, 5, 5, holder_nodes=5, gated=50)
    gated.first_bound = [0.5, 0.7]
    plain = sb.BatchResult("plain", 50, 0.1, 0.5)
    plain.first_bound = [0.2]
    return [plain, gated, sb.BatchResult(f"beside:{sb.DEPLOYED_GATED}", 50, 0.1, 0.5)]


def test_a_run_stopped_early_keeps_the_scenarios_it_measured(tmp_path: Path) -> None:
    """The checkpoint after a round's first scenario: only that scenario (a summary of one
    with no batch would have nothing to show), the rounds begun, marked partial; written
    whole, and readable by the table."""
    plan = replace(PLAN, rounds=3)  # the three as-deployed scenarios
    rows = gated_triple()
    result = sb.partial(5000, plan, rows, 600.0, 3.0, 4.0)
    assert result["partial"] is True
    assert result["rounds"] == 1
    assert [row["name"] for row in result["encodings"]] == [sb.DEPLOYED_GATED]
    assert result["encodings"][0]["cpu_ratios"] == [2.0]
    path = tmp_path / "scheduler.json"
    sb.write_json(path, [result])
    assert json.loads(path.read_text())[0]["encodings"][0]["name"] == sb.DEPLOYED_GATED
    assert [p.name for p in tmp_path.iterdir()] == ["scheduler.json"]
    assert "| 5,000 | burst, gated | 2.00x (2.00-2.00) |" in sb.render([result])
    assert sb.summarize(5000, plan, rows, 600.0, 3.0, 4.0).get("partial") is None


def test_kube_controller_managers_client_limit_is_its_own_unless_raised() -> None:
    """Its default (20 QPS, burst 30) is what most clusters run, and what a sustained 5 runs/s
    outruns: the bench keeps it unless asked, and says which limit each result had."""
    rows = gated_triple()
    assert sb.kcm_args(PLAN) == ()
    default = sb.partial(5000, PLAN, rows, 60.0, 1.0, 1.0)
    assert default["kcm_api_qps"] is None
    assert "kube-controller-manager client limit its default (20 QPS, burst 30)" in sb.render(
        [default]
    )
    raised = replace(PLAN, kcm_api_qps=100)
    assert sb.kcm_args(raised) == ("--kube-api-qps=100", "--kube-api-burst=100")
    result = sb.partial(5000, raised, rows, 60.0, 1.0, 1.0)
    assert result["kcm_api_qps"] == 100
    assert "kube-controller-manager client limit 100 QPS, burst 100" in sb.render([result])


def test_a_benchmark_runs_seeded_placeholder_is_its_first_pods() -> None:
    """The bench's PipelineRun declares the claim its pods mount, as a PipelineRun sharing
    a workspace does: the placeholder made from the run has the template the first pod
    gives, so the reconciler does not patch it when the pods come. Without the workspace
    every seeded placeholder was patched (and a third of the patches met a 409)."""
    batch = sb.deployed_batch("co-0", PLAN, sb.ENCODINGS[sb.DEPLOYED_GATED])
    assert batch.prepare is not None
    api = RecordingApi()
    prepare = batch.prepare

    async def make_runs() -> None:
        await prepare(cast(sb.Client, api))

    asyncio.run(make_runs())
    settings = Settings(mode=Mode.PIPELINERUNS)  # bench.deployed's CONFIG
    [work] = [step({}) for step in batch.steps]
    runs = [body for _, body in api.made if body["kind"] == "PipelineRun"]
    assert len(runs) == len(batch.runs)
    for run in runs:
        run["metadata"]["creationTimestamp"] = "2026-11-28T10:00:00Z"
        made = parse_time(run["metadata"]["creationTimestamp"])
        assert made is not None
        found = seed(slim_run(run), {"coschedule.dev/enabled": "true"}, settings, made + 1.0)
        assert found is not None
        first = next(
            p for p in work.create if p["metadata"]["name"] in batch.runs[run["metadata"]["name"]]
        )
        namespace = first["metadata"]["namespace"]
        ctx = AdmissionContext(settings, namespace, None, run_claims_cache(first, namespace))
        marked = parse_marked(sb.mutated(first, decide(first, ctx)))
        assert isinstance(marked, MarkedPod)
        assert marked.marks.placeholder == found.pod.marks.placeholder
        from_seed = group_spec(namespace, found.pod.marks.placeholder, [found.pod])
        from_pod = group_spec(namespace, marked.marks.placeholder, [marked])
        assert from_seed is not None
        assert from_pod is not None
        assert from_seed.claims == from_pod.claims == (f"{run['metadata']['name']}-ws",)
        assert pod_template(from_seed, settings) == pod_template(from_pod, settings)


# kube-scheduler v1.36's lines at --v=2, as the benchmark's scheduler writes them.
BOUND = '"Successfully bound pod to node"'
SCHEDULER_LOG = "\n".join(
    [
        'I1129 12:27:06.386125   11926 eventhandlers.go:214] "Add event for unscheduled pod" '
        'pod="ns/a-0"',
        f'I1129 12:27:09.459675   11926 schedule_one.go:481] {BOUND} pod="ns/a-0" '
        'node="node-00245" evaluatedNodes=1 feasibleNodes=1',
        f"I1129 12:27:09.5   11926 schedule_one.go:481] {BOUND} "
        'pod="bench-deployed/affinity-assistant-9244bee26e-0" node="node-00245" '
        "evaluatedNodes=420 feasibleNodes=420",
        'E1129 12:27:09.600000   11926 schedule_one.go:1100] "Error scheduling pod; retrying" '
        'err="0/3 nodes are available" pod="ns/b-0"',
        f'I1129 12:27:10.000001   11926 schedule_one.go:481] {BOUND} pod="ns/a-0" '
        'node="node-00001" evaluatedNodes=1 feasibleNodes=1',
    ]
)


def test_kube_schedulers_binds_are_read_with_its_own_time() -> None:
    """Each bind at the time kube-scheduler logged it (local time, the year given); other
    lines, errors included, are not binds; a name's first bind is kept."""
    found = sb.logged_binds(SCHEDULER_LOG, 2026)
    assert found == {
        "a-0": pytest.approx(datetime(2026, 11, 29, 12, 27, 9).timestamp() + 0.459675),
        "affinity-assistant-9244bee26e-0": pytest.approx(
            datetime(2026, 11, 29, 12, 27, 9).timestamp() + 0.5
        ),
    }


def test_a_batchs_binds_are_read_from_where_it_began_on_the_benchmarks_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only what the scheduler logged after the batch began (an earlier batch's pod of the
    same name is not this one's), each on the monotonic clock the watch's times use; a pod
    never logged is left out once the wait is over."""
    monkeypatch.setattr(sb, "LOG_WAIT_S", 0.2)
    log_path = tmp_path / "kube-scheduler.log"
    now = datetime.now().replace(microsecond=0)
    stamp = now.strftime("%m%d %H:%M:%S")
    earlier = f'I{stamp}.000000 1 s.go:1] {BOUND} pod="ns/a-0" node="n"\n'
    later = f'I{stamp}.250000 1 s.go:1] {BOUND} pod="ns/a-0" node="n"\n'
    log_path.write_text(earlier)
    offset = len(earlier)
    with log_path.open("a") as log:
        log.write(later)
    scheduler = Proc("kube-scheduler", [], log_path)
    found = asyncio.run(sb.scheduler_binds(scheduler, offset, ["a-0", "b-0"]))
    assert list(found) == ["a-0"]
    expected = now.timestamp() + 0.25 - (time.time() - time.monotonic())
    assert found["a-0"] == pytest.approx(expected, abs=0.05)
