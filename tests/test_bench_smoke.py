"""Smoke test of the benchmark harness (a few hundred requests; asserts no speed).

The servers start, the floor and the webhook answer every benchmark payload correctly, the
open-loop generator counts right and reports sane percentiles, the closed-loop tools run,
and the table renders with the ratio first. ``python -m bench`` itself is never run here.
"""

from __future__ import annotations

import asyncio
import dis
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import uvicorn

from bench import appcost, interp, openloop, phases, report, suite, watch_decode
from bench import decide as decide_bench
from bench import scheduler as scheduler_bench
from bench.loadgen import run_closed, run_openloop, run_wrk, wrk_path
from bench.openloop import LoadConfig, percentiles
from bench.payloads import tekton_pod
from bench.servers import Server, expected_answer
from bench.target import FLOOR_RESPONSE, floor_context, https_config
from coschedule.certs import CA_FILE
from coschedule.config.settings import DEFAULT_TOPOLOGY_KEY, Settings
from coschedule.config.store import SettingsStore
from coschedule.marks import (
    GATE_PLACEHOLDER,
    LABEL_INSTANCE,
    Mode,
    Placement,
    affinity_term,
    placeholder_claim,
    run_placeholder,
)
from coschedule.mutate.decision import AdmissionContext, decide
from coschedule.placement import node_pin
from coschedule.server import serve as serve_module
from coschedule.server.serve import ServeOptions, build_webhook
from coschedule.server.webhook_metrics import WebhookMetrics
from tests.e2e.cluster import find_binaries

RATE = 300  # requests per second for one second: a few hundred requests
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ws() -> Iterator[suite.Workspace]:
    with suite.workspace() as workspace:
        yield workspace


@pytest.fixture(scope="module")
def servers(ws: suite.Workspace) -> Iterator[dict[str, Server]]:
    # Unpinned: the smoke test must not depend on which cores a CI runner grants.
    with (
        Server("webhook", ws.cert_dir, [None], log_dir=ws.log_dir) as webhook,
        Server("floor", ws.cert_dir, [None], log_dir=ws.log_dir) as floor,
    ):
        webhook.start(ws.body("tekton"))
        floor.start(ws.body("tekton"))
        yield {"webhook": webhook, "floor": floor}


def test_bench_uvicorn_options_are_the_servers(tmp_path: Path) -> None:
    """The floor and the webhook run under the options ``coschedule serve`` uses."""
    from coschedule import certs

    certs.write_bundle(certs.generate(["127.0.0.1"]), tmp_path)
    webhook = build_webhook(SettingsStore(None, {}), WebhookMetrics(), tmp_path)
    seen: list[uvicorn.Config] = []

    async def record(self: uvicorn.Server, sockets: Any = None) -> None:
        seen.append(self.config)

    # Listeners made but never bound: nothing is served, no port is taken.
    with (
        socket.socket() as https_sock,
        socket.socket() as health_sock,
        pytest.MonkeyPatch.context() as patch,
    ):
        patch.setattr(serve_module._Server, "serve", record)
        options = ServeOptions(host="127.0.0.1", port=1, sockets=((https_sock,), (health_sock,)))
        asyncio.run(serve_module.serve(webhook, options))
    served = seen[0]  # the HTTPS listener (the second is the plain probe port)
    assert served.ssl_context_factory is not None
    ours = https_config(object(), floor_context(tmp_path), "127.0.0.1", 1)
    ignore = {"app", "ssl_context_factory"}
    assert {k: v for k, v in vars(ours).items() if k not in ignore} == {
        k: v for k, v in vars(served).items() if k not in ignore
    }


def test_both_servers_answer_every_payload_correctly(
    servers: dict[str, Server], ws: suite.Workspace
) -> None:
    for name in ws.bodies:
        servers["webhook"].check(ws.body(name))  # raises on a wrong status or body
    servers["floor"].check(ws.body("fat"))
    assert expected_answer("floor", b"") == FLOOR_RESPONSE
    webhook_answer = expected_answer("webhook", ws.body("tekton"))
    assert b'"allowed":true' in webhook_answer
    assert b'"patchType":"JSONPatch"' in webhook_answer
    # Same size class, so both servers write about as much.
    assert 0.5 < len(FLOOR_RESPONSE) / len(webhook_answer) < 2


@pytest.mark.parametrize("app", ["webhook", "floor"])
def test_open_loop_counts_and_percentiles(
    servers: dict[str, Server], ws: suite.Workspace, app: str
) -> None:
    server = servers[app]
    before = server.cpu_seconds()
    data = run_openloop(
        server.port,
        ws.bodies["tekton"],
        cpu=None,
        rate=RATE,
        seconds=1.0,
        warmup=0.1,
        connections=8,
        ca_file=ws.cert_dir / "ca.crt",
    )
    assert data["measured"] == RATE
    assert data["ok"] == RATE
    assert data["errors"] == 0
    assert data["statuses"] == {"200": RATE}
    lat = data["latency_ms"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99.9"] <= lat["max"]
    # Answered, not timed out: within the generator's own grace, however loaded the machine.
    assert lat["max"] < openloop.GRACE_S * 1000
    assert data["send_lag_ms"]["p50"] >= 0
    assert data["sample_body"] == expected_answer(app, ws.body("tekton")).decode()
    assert server.cpu_seconds() >= before
    assert server.rss_bytes() > 10 * 1024 * 1024


def test_open_loop_has_no_coordinated_omission(
    servers: dict[str, Server], ws: suite.Workspace
) -> None:
    """Freeze the server for 0.4 s mid-run: every request scheduled in that time must show
    the wait. A generator that waited for answers before sending would charge the stall to
    at most one request per connection (8 here, 2% of 400) and keep p90 low."""
    server = servers["floor"]
    pid = server.pids[0]

    def stall() -> None:
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(0.4)
        finally:
            os.kill(pid, signal.SIGCONT)

    timer = threading.Timer(0.6, stall)
    config = LoadConfig(
        port=server.port, body=ws.body("tekton"), rate=200, duration=2.0, warmup=0, connections=8
    )
    try:
        result = openloop.run(config, on_start=timer.start)
    finally:
        timer.join()
    assert result.ok == 400
    assert result.errors == 0
    assert result.latency_ms["max"] >= 350
    assert result.latency_ms["p90"] >= 100  # ~60 of 400 requests waited over 100 ms
    # The median request did not wait out the stall: it is well below the one that did. Said
    # relative to the max, not as "under 100 ms", which a busy machine's queueing exceeds.
    assert result.latency_ms["p50"] < result.latency_ms["max"] - 200


def test_closed_loop_generator_keep_alive_and_close(
    servers: dict[str, Server], ws: suite.Workspace
) -> None:
    port = servers["webhook"].port
    for close in (False, True):
        result = run_closed(
            port, ws.bodies["small"], 1, 4, None, use_wrk=False, connection_close=close
        )
        assert result.tool == "bench.openloop"
        assert result.requests > 0
        assert result.errors == 0


@pytest.mark.skipif(wrk_path() is None, reason="wrk is not installed (apt-get install wrk)")
def test_wrk_runs_against_the_webhook(servers: dict[str, Server], ws: suite.Workspace) -> None:
    for close in (False, True):
        result = run_wrk(servers["webhook"].port, ws.bodies["tekton"], 1, 4, None, close)
        assert result.requests > 0
        assert result.errors == 0


def test_app_cost_measures_both_apps(ws: suite.Workspace) -> None:
    cost = appcost.measure(ws.cert_dir, rounds=1, budget=0.01, cold_calls=5)
    assert set(cost) == {"webhook_us", "floor_us", "webhook_cold_us", "floor_cold_us"}
    assert all(value > 0 for value in cost.values())


def _straight_line() -> int:
    x = 1
    y = x + 2
    return y


def test_interp_counts_every_bytecode_and_call_of_a_known_function() -> None:
    """The counters against ``dis``: each instruction run is one (RESUME raises no opcode
    event on 3.11), and a function outside ``ours`` counts in the total alone."""
    run_once = [i for i in dis.get_instructions(_straight_line) if i.opname != "RESUME"]
    here = _straight_line.__code__.co_filename
    assert interp.count_bytecodes(_straight_line, here) == (len(run_once), len(run_once))
    assert interp.count_bytecodes(_straight_line, "/nowhere/") == (len(run_once), 0)

    def twice() -> None:
        _straight_line()
        len("ab")
        _straight_line()

    assert interp.count_calls(twice, here) == (3, 3, 1)


def test_interp_measures_each_payload_through_the_asgi_app() -> None:
    """bench.interp's figures are sane: a run's pod is decided and patched, a plain pod
    goes the short way, and the counts are the same in a fresh process (``--baseline``
    with this very tree: the same measuring code, the same webhook)."""
    figures = interp.measure(loop=5, rounds=1, settle=False)  # this process's heap as it is
    assert set(figures) == set(interp.PAYLOADS)
    for row in figures.values():
        assert 0 < row["bytecodes_ours"] <= row["bytecodes"]
        assert 0 < row["python_calls_ours"] <= row["python_calls"]
        assert row["c_calls"] > 0
        assert 0 < row["cpu_us_min"] <= row["cpu_us_median"]
    assert figures["tekton"]["patched"]
    assert figures["argo"]["patched"]
    assert not figures["plain"]["patched"]
    assert figures["plain"]["bytecodes"] < figures["tekton"]["bytecodes"]
    runs = interp.compare(interp.ROOT, pairs=1, loop=5, rounds=1)
    counts = ("bytecodes", "bytecodes_ours", "python_calls", "c_calls")
    for tree in ("now", "baseline"):
        [process] = runs[tree]
        for name, row in figures.items():
            assert {k: process[name][k] for k in counts} == {k: row[k] for k in counts}
    table = interp.render({tree: interp.summary(r) for tree, r in runs.items()})
    assert f"| tekton | baseline | {figures['tekton']['bytecodes']:,} /" in table


def test_percentiles_are_nearest_rank() -> None:
    samples = [i / 1000 for i in range(1, 1001)]  # 1..1000 ms
    p = percentiles(samples)
    assert p["p50"] == pytest.approx(500)
    assert p["p99"] == pytest.approx(990)
    assert p["p99.9"] == pytest.approx(999)
    assert p["max"] == pytest.approx(1000)
    assert percentiles([]) == {}


def _results() -> dict[str, Any]:
    def closed(
        server: str, workers: int, payload: str, connection: str, rps: float
    ) -> dict[str, Any]:
        return {
            "server": server,
            "workers": workers,
            "payload": payload,
            "connection": connection,
            "rps": rps,
            "errors": 0,
            "cpu_s_per_1000": 0.1,
        }

    latency = {"p50": 0.3, "p90": 0.5, "p99": 1.5, "p99.9": 3.0, "max": 4.0}
    return {
        "date": "2026-11-21T07:00:00+00:00",
        "machine": {
            "cpu_model": "Test CPU",
            "cores": 2,
            "cores_usable": 2,
            "python": "3.11",
            "kernel": "6.1",
            "openssl": "OpenSSL 3",
            "packages": {"uvicorn": "0"},
        },
        "load_before": 0.1,
        "load_after": 0.2,
        "plan": {"quick": False, "server_cpus": [0], "client_cpu": 1, "wrk_connections": 32},
        "closed_loop_tool": "wrk",
        "webhook_mode": "pipelineruns",
        "ratio": {"rounds": [{}, {}, {}], "ratio": 0.7, "webhook_rps": 7000, "floor_rps": 10000},
        "closed_loop": [
            closed("webhook", 1, "tekton", "keep-alive", 7000),
            closed("floor", 1, "tekton", "keep-alive", 10000),
            closed("webhook", 2, "tekton", "keep-alive", 12000),
        ],
        "open_loop": [
            {
                "server": "webhook",
                "workers": 1,
                "rate": 1000,
                "latency_ms": latency,
                "send_lag_ms": {"p99": 0.01},
                "errors": 0,
                "cpu_s_per_1000": 0.2,
            }
        ],
        "decide": [
            {
                "payload": "tekton",
                "bytes": 1,
                "parse_us": 1,
                "decide_us": 20,
                "handle_us": 30,
                "goal_us": 30,
                "mode": "pipelineruns",
            },
            {
                "payload": "fat",
                "bytes": 1,
                "parse_us": 1,
                "decide_us": 200,
                "handle_us": 300,
                "goal_us": 150,
                "mode": "pipelineruns",
            },
        ],
        "reconciler": {"available": False, "note": "reconciler benchmark not available"},
        "leak": {
            "requests": 1000,
            "rss_after_warmup_mib": 50.0,
            "rss_after_mib": 50.5,
            "growth_second_half_mib": 0.1,
        },
    }


def test_table_puts_the_ratio_first_with_goals() -> None:
    table = report.render(_results())
    rows = [line for line in table.splitlines() if line.startswith("| 1 |")]
    assert rows
    first = rows[0]
    assert "webhook ÷ floor" in first
    assert "0.70x" in first
    assert "≥ 0.8x" in first
    assert first.endswith("MISSED |")
    verdicts = [goal.verdict for goal in report.goals(_results())]
    # ratio, p99 at 1,000/s, decide tekton, decide fat, reconciler, leak
    assert verdicts == ["MISSED", "met", "met", "MISSED", "n/a", "met"]
    assert "reconciler benchmark not available" in table
    assert "Test CPU" in table


def test_phases_time_every_phase_both_ways() -> None:
    result = phases.measure(budget=0.005, cold_calls=5)
    assert [row["phase"] for row in result["phases"]] == list(phases.PHASES)
    for row in result["phases"]:
        assert row["full_hot_us"] >= 0
        assert row["lean_cold_us"] > 0
    assert result["handle_hot_us"] > 0


def test_table_shows_phases_and_logging_cost() -> None:
    results = _results()
    results["ratio"] = {**results.get("ratio", {}), "webhook_cpu_us": 90.0, "floor_cpu_us": 70.0}
    results["phases"] = {
        "payload": "tekton",
        "phases": [
            {
                "phase": name,
                "full_hot_us": 2.0,
                "lean_hot_us": 1.0,
                "full_cold_us": 4.0,
                "lean_cold_us": 3.0,
            }
            for name in phases.PHASES
        ],
        "handle_hot_us": 30.0,
        "handle_cold_us": 40.0,
    }
    row = {"info_rps": 9000.0, "off_rps": 9090.0, "cost_pct": 1.0, "cpu_cost_pct": 2.0}
    row |= {"info_cpu_us": 100.0, "off_cpu_us": 99.0}
    results["logging"] = {"tekton": row, "denied": row}
    table = report.render(results)
    assert "| decide | 2.0 | 1.0 | 4.0 | 3.0 |" in table
    assert "50 µs of it is TLS, HTTP and ASGI" in table
    assert "logging at INFO" in table
    assert "+1.0 %" in table


def test_table_shows_the_python_run_per_admission() -> None:
    results = _results()
    assert "| n/a |" in report.render(results).split("bench.interp")[1].split("\n")[0]
    row = {"bytecodes": 1627, "python_calls": 38, "c_calls": 79}
    results["interp"] = {"tekton": row, "plain": {**row, "bytecodes": 950}}
    table = report.render(results)
    assert "tekton 1,627, 38, 79; plain 950, 38, 79" in table


def test_table_says_less_when_the_webhook_costs_less() -> None:
    """A handle cheaper than the floor's parse reads "less", never "-0 µs more"."""
    results = _results()
    results["ratio"] = {**results.get("ratio", {}), "webhook_cpu_us": 59.0, "floor_cpu_us": 53.0}
    results["app_cost"] = {"webhook_us": 17.8, "floor_us": 18.0}
    table = report.render(results)
    assert "webhook 59 µs, floor 53 µs: 6 µs more" in table
    assert "hot: webhook 18 µs, floor 18 µs, 0.2 µs less" in table
    assert "-0 µs" not in table


def test_the_in_cluster_payload_is_a_first_pod_whose_claim_is_rewritten() -> None:
    """``tekton in a cluster`` measures the claim-rewrite path, not the offline one."""
    pod = tekton_pod()
    cache = decide_bench.run_claims_cache(pod)
    ctx = AdmissionContext(
        Settings(mode=Mode.PIPELINERUNS, rewrite_claims=True), "ci", None, cache, explain=False
    )
    decision = decide(pod, ctx)
    assert decision.allowed
    assert decision.templates is not None
    [template] = decision.templates
    placeholder = run_placeholder("ci", pod["metadata"]["labels"]["tekton.dev/pipelineRun"])
    rewrites = [op for op in decision.ops if op["path"].endswith("/claimName")]
    assert [op["value"] for op in rewrites] == [placeholder_claim(template.name, placeholder)]
    # ``later pod``: with the StatefulSet made, the pod follows its templates, to the same
    # claim, and carries no templates of its own.
    decide_bench.add_placeholder(cache, "ci", placeholder, decision.templates)
    later = decide(pod, ctx)
    assert later.templates is None
    again = [op for op in later.ops if op["path"].endswith("/claimName")]
    assert [op["value"] for op in again] == [placeholder_claim(template.name, placeholder)]


def test_scheduler_bench_coscheduled_pods_are_decided_and_placeholders_rendered() -> None:
    """bench.scheduler's co-scheduled batch is what coschedule makes: every run pod carries
    the required pod-affinity term to its run's placeholder and mounts the claim the
    placeholder's template makes, and the placeholder pod is the StatefulSet's replica 0
    (our labels, the same claim), created before its run's pods; plain pods are the
    engine's pods untouched."""
    plan = replace(scheduler_bench.QUICK, groups=2, per_group=3)
    batch = scheduler_bench.coscheduled_batch("co-0", plan, scheduler_bench.ENCODINGS["affinity"])
    assert batch.counted == 6
    [step] = batch.steps
    work = step({})
    assert len(work.create) == 8 == len(work.expect)  # a placeholder before each run's pods
    holders = [p for p in work.create if p["metadata"]["name"] in batch.groups]
    assert [work.create.index(h) for h in holders] == [0, 4]
    for holder in holders:
        name = holder["metadata"]["name"]
        placeholder = name.removesuffix("-0")
        assert holder["metadata"]["labels"][LABEL_INSTANCE] == placeholder
        assert "podAntiAffinity" in holder["spec"]["affinity"]
        holder_claims = {
            v["persistentVolumeClaim"]["claimName"]
            for v in holder["spec"]["volumes"]
            if "persistentVolumeClaim" in v
        }
        members = [p for p in work.create if p["metadata"]["name"] in batch.groups[name]]
        assert len(members) == 3
        for pod in members:
            terms = pod["spec"]["affinity"]["podAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]
            assert affinity_term(placeholder, DEFAULT_TOPOLOGY_KEY) in terms
            mounted = {
                v["persistentVolumeClaim"]["claimName"]
                for v in pod["spec"]["volumes"]
                if "persistentVolumeClaim" in v
            }
            assert mounted <= holder_claims  # the finally task mounts none
        assert any(p["spec"]["volumes"] for p in members)
        assert set(batch.claims) >= holder_claims
    plain = scheduler_bench.plain_batch("plain-0", plan)
    assert plain.counted == 6
    assert all("affinity" not in pod["spec"] for pod in plain.steps[0]({}).create)


def test_scheduler_bench_gate_pin_holds_pods_and_releases_them_as_the_reconciler_does() -> None:
    """``gate-pin``: the run pods are created behind the placeholder's gate with no
    placeholder term (only the placeholders are waited for); once those are bound, the
    reconciler's patch (``node_pin.release_ops``) pins each pod to its placeholder's node
    and lifts the gate. ``-spread``: the placeholders carry a topology spread constraint
    instead of their anti-affinity."""
    plan = replace(scheduler_bench.QUICK, groups=2, per_group=3)
    batch = scheduler_bench.coscheduled_batch(
        "co-0", plan, scheduler_bench.ENCODINGS["gate-pin-spread"]
    )
    first, release = batch.steps
    work = first({})
    assert work.expect == list(batch.groups)
    for pod in work.create:
        spec = pod["spec"]
        if pod["metadata"]["name"] in batch.groups:
            assert "schedulingGates" not in spec
            assert "affinity" not in spec
            [constraint] = spec["topologySpreadConstraints"]
            assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"
        else:
            assert spec["schedulingGates"] == [{"name": GATE_PLACEHOLDER}]
            assert "affinity" not in spec
    nodes = {holder: f"node-{i}" for i, holder in enumerate(batch.groups)}
    patches = dict(release(nodes).patch)
    created = {pod["metadata"]["name"]: pod for pod in work.create}
    for holder, members in batch.groups.items():
        for name in members:
            released = jsonpatch.apply_patch(created[name], patches[name])
            assert not released["spec"].get("schedulingGates")
            assert node_pin.pinned_node(released["metadata"]) == nodes[holder]
            [term] = released["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]["nodeSelectorTerms"]
            assert term["matchFields"] == [node_pin.pin_requirement(nodes[holder])]


def test_scheduler_bench_counts_the_nodes_placeholders_took() -> None:
    """Per encoding: distinct placeholder nodes summed over its batches, out of its runs,
    and the fewest in one batch (a stack shows there even when other batches spread)."""
    plan = replace(scheduler_bench.QUICK, encodings=("gate-pin",), rounds=2)
    rows = [
        scheduler_bench.BatchResult("plain", 50, 0.1, 1.0),
        scheduler_bench.BatchResult("gate-pin", 50, 0.1, 1.0, 5, 5, holder_nodes=5),
        scheduler_bench.BatchResult("beside:gate-pin", 50, 0.1, 1.0),
        scheduler_bench.BatchResult("plain", 50, 0.1, 1.0),
        scheduler_bench.BatchResult("gate-pin", 50, 0.1, 1.0, 5, 5, holder_nodes=2),
        scheduler_bench.BatchResult("beside:gate-pin", 50, 0.1, 1.0),
    ]
    result = scheduler_bench.summarize(50, plan, rows, 1.0, 0.0, 0.0)
    [row] = result["encodings"]
    assert (row["colocated"], row["distinct_nodes"], row["fewest_nodes"]) == ("10/10", "7/10", 2)
    assert [b["holder_nodes"] for b in result["batches"]] == [None, 5, None, None, 2, None]
    assert "| 10/10 | 7/10 (fewest 2) |" in scheduler_bench.render([result])


@pytest.mark.parametrize("answer_first", [True, False])
def test_scheduler_bench_client_survives_connections_the_server_closes(
    ws: suite.Workspace, answer_first: bool
) -> None:
    """kube-apiserver closes a keep-alive connection idle for 90 s; a request on it must
    go out on a new connection, not hang. ``answer_first``: the server answers, then closes
    (idle); otherwise it closes a connection with the request unanswered (the race), and the
    client sends it once more."""
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        await reader.readuntil(b"\r\n\r\n")
        if answer_first or len(connections) > 1:
            body = b'{"n": %d}' % len(connections)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
        writer.close()

    async def scenario() -> list[dict[str, Any]]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=floor_context(ws.cert_dir))
        port = server.sockets[0].getsockname()[1]
        client = scheduler_bench.Client(
            f"https://127.0.0.1:{port}", ws.cert_dir / CA_FILE, "token", concurrency=1
        )
        try:
            answers = []
            for _ in range(2 if answer_first else 1):
                answers.append(await asyncio.wait_for(client.request("GET", "/api"), 10))
                await asyncio.sleep(0.2)  # the close has arrived
            return answers
        finally:
            await client.close()
            server.close()

    answers = asyncio.run(scenario())
    assert answers == ([{"n": 1}, {"n": 2}] if answer_first else [{"n": 2}])
    assert len(connections) == 2


@pytest.mark.skipif(find_binaries()[0] is None, reason="no kube-apiserver/kube-scheduler binaries")
def test_scheduler_bench_runs_on_a_real_scheduler() -> None:
    """A few nodes, one round: every batch binds, every run lands on its placeholder's
    node, and the figures and ratios come out (their values are not asserted)."""
    plan = replace(
        scheduler_bench.QUICK,
        nodes=(12,),
        groups=3,
        per_group=10,
        background_per_node=2,
        encodings=("affinity", "gate-pin-spread"),
    )
    [result] = scheduler_bench.measure(plan, log=lambda _: None)
    assert result["available"], result
    kinds = [b["kind"] for b in result["batches"]]
    assert kinds == [
        *("plain", "affinity", "beside:affinity"),
        *("plain", "gate-pin-spread", "beside:gate-pin-spread"),
    ]
    assert all(b["pods"] == 30 and b["wall_s"] > 0 for b in result["batches"])
    for batch in result["batches"]:
        # kube-scheduler's log (--v=2) gave each run's first bind the watch saw (the plain
        # batches' three runs; these encodings' batches count no runs), on the watch's
        # clock: about when the watch saw it (the scheduler logs once the bind is answered;
        # a loaded machine's watch lags), not hours off.
        logged, watched = batch["first_bound_logged_s"], batch["first_bound_s"]
        assert len(logged) == len(watched), batch
        if batch["kind"] == "plain" or batch["kind"].startswith("beside:"):
            assert len(logged) == 3, batch
        assert all(w - 5.0 < at <= w + 0.5 for at, w in zip(logged, watched, strict=True))
        assert batch["apiserver_cpu_s"] > 0
    for row in result["encodings"]:
        # kube-apiserver accepted the reconciler's release patch on every gated pod, and
        # every run's pods ended on its placeholder's node.
        assert row["colocated"] == "3/3", row
        # The placeholders' preferred anti-affinity (weight 100), or their spread
        # constraint, keeps three runs on 12 nodes apart.
        assert (row["distinct_nodes"], row["fewest_nodes"]) == ("3/3", 3), row
        for key in ("cpu_ratio", "throughput_ratio", "spillover_ratio"):
            assert row[key] > 0
    table = scheduler_bench.render([result])
    assert "| 12 | pod affinity (today) |" in table


def test_the_placement_auto_payloads_are_gated_then_pinned() -> None:
    """``placement auto, gated`` and ``pinned`` measure the node-name path, through the
    webhook's own placeholder cache, not the pod-affinity one."""
    pod = tekton_pod()
    cache = decide_bench.placeholder_cache()
    ctx = AdmissionContext(
        Settings(mode=Mode.PIPELINERUNS, placement=Placement.AUTO),
        "ci",
        placeholders=cache,
        explain=False,
    )
    gated = decide(pod, ctx)
    assert {
        "op": "add",
        "path": "/spec/schedulingGates",
        "value": [{"name": GATE_PLACEHOLDER}],
    } in (gated.ops)
    assert gated.placeholder is not None
    decide_bench.bind_placeholder(cache, "ci", gated.placeholder, "node-a")
    pinned = decide(pod, ctx)
    assert not any(op["path"].startswith("/spec/schedulingGates") for op in pinned.ops)
    assert pinned.ops[0]["path"] == "/spec/affinity"
    assert "nodeAffinity" in pinned.ops[0]["value"]
    assert "podAffinity" not in pinned.ops[0]["value"]


def test_webhook_memory_bench_fills_the_real_caches() -> None:
    """bench.webhook_memory on 400 claims: the caches hold every claim and volume, and the
    figure is per claim (no speed or size asserted)."""
    from bench import webhook_memory

    figures = asyncio.run(webhook_memory.measure(400, rss=False))
    assert figures["claims"] == 400
    assert figures["bytes_per_claim"] > 0
    per_10k = figures["bytes_per_claim"] * 10_000 / 2**20
    assert figures["mb_per_10k_claims"] == pytest.approx(per_10k, abs=0.1)


def test_reconciler_bench_runs_to_its_figures_in_its_own_process(tmp_path: Path) -> None:
    """``python -m bench.reconciler`` whole, at a small scale, as ``make bench`` runs it: it
    ends with its figures. A hang fails here after a bound, with what it printed, instead of
    hanging the suite (its fake API once fed one watch stream to two caches)."""
    out = tmp_path / "reconciler.json"
    command = [sys.executable, "-m", "bench.reconciler", "--json", str(out),
               "--runs", "20", "--nodes", "50", "--samples", "3"]  # fmt: skip
    try:
        done = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
        )
    except subprocess.TimeoutExpired as exc:
        said = [
            (part.decode(errors="replace") if isinstance(part, bytes) else part or "")[-2000:]
            for part in (exc.stdout, exc.stderr)
        ]
        pytest.fail(f"bench.reconciler still running after 120 s (hung?); it printed: {said}")
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert (figures["runs"], figures["marked_pods"], figures["samples"]) == (20, 200, 3)
    # One list per cache and no write at startup; each new run made its StatefulSet once.
    assert figures["api_calls_constant_per_run"] is True
    assert figures["api_calls"]["per_new_run"]["POST statefulsets"] == 1.0
    assert figures["cordon_to_delete_ms"]["max"] > 0


def test_a_real_stack_bench_writes_its_header_then_its_figures(tmp_path: Path) -> None:
    from bench.servers import write_results

    out = tmp_path / "result.json"
    write_results(out, "2026-11-27T07:00:00+00:00", {"commit": "abc"}, [1.5, 2.0], runs=3,
                  figures={"none": [1.0]})  # fmt: skip
    doc = json.loads(out.read_text())
    assert doc["date"] == "2026-11-27T07:00:00+00:00"
    assert doc["source"] == {"commit": "abc"}
    assert doc["load"] == [1.5, 2.0]
    assert doc["runs"] == 3
    assert doc["figures"] == {"none": [1.0]}
    assert doc["machine"]["cores"] == os.cpu_count()


def test_watch_decode_times_every_parse_of_every_shape() -> None:
    """bench.watch_decode's figures are sane: every event shape, every parse timed (they
    agree first), POD_CACHE for whole pods only, a table row each."""
    figures = watch_decode.measure(loop=2, rounds=1)
    assert set(figures) == {"whole pod", "whole pod, running", "metadata"}
    for row in figures.values():
        assert row["whole_us"] > 0
        assert row["decode_event_us"] > 0
    assert figures["whole pod"]["pod_cache_us"] > 0
    assert figures["whole pod, running"]["pod_cache_us"] > 0
    assert "pod_cache_us" not in figures["metadata"]
    assert figures["whole pod, running"]["bytes"] > figures["whole pod"]["bytes"]
    assert figures["whole pod"]["bytes"] > figures["metadata"]["bytes"] > 1000
    table = watch_decode.render(figures)
    assert "| whole pod (" in table
    assert "| whole pod, running (" in table
    assert "| metadata (" in table
