"""Property: whatever a client POSTs to /mutate, the answer is a clean 200/400/413 with a
JSON body, never a 500 or a crash; a 200 echoes the uid and its patch applies."""

from __future__ import annotations

import asyncio
import base64
import copy
from typing import Any

import httpx
import jsonpatch as reference_jsonpatch
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coschedule.config.store import SettingsStore
from coschedule.probes import Probes, probes_app
from coschedule.server.https_app import HttpsApp
from coschedule.server.pod_endpoint import PodEndpoint
from coschedule.server.webhook_metrics import WebhookMetrics
from tests.fixtures import FIXTURE_NAMES, admission_review, load_pod

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=6,
)
MODES = ("workspaces", "pipelineruns", "isolate-pipelinerun", "disabled")


def paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            found += paths(value, (*prefix, index))
    return found


@st.composite
def mutated_reviews(draw: st.DrawFn) -> dict[str, Any]:
    pod = load_pod(draw(st.sampled_from(FIXTURE_NAMES)))
    pod["metadata"].setdefault("labels", {})
    if draw(st.booleans()):
        pod["metadata"]["labels"]["coschedule.dev/mode"] = draw(st.sampled_from(MODES))
    review = admission_review(pod, dry_run=draw(st.booleans()))
    for _ in range(draw(st.integers(0, 4))):
        candidates = paths(review)[1:]
        if not candidates:
            break
        path = draw(st.sampled_from(candidates))
        parent = review
        for token in path[:-1]:
            parent = parent[token]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(json_values)
    return review


def app() -> HttpsApp:
    metrics = WebhookMetrics()
    handler = PodEndpoint(SettingsStore(None, {}), metrics)
    return HttpsApp(handler, probes_app(Probes(), None))


def check(review: dict[str, Any], status: int, body: bytes) -> None:
    assert status in (200, 400), status
    doc = orjson.loads(body)
    assert isinstance(doc, dict)
    if status == 400:
        assert isinstance(doc["error"], str)
        assert doc["error"]
        return
    response = doc["response"]
    assert response["uid"] == review["request"]["uid"]
    if response.get("patch"):
        ops = orjson.loads(base64.b64decode(response["patch"]))
        patched = reference_jsonpatch.apply_patch(copy.deepcopy(review["request"]["object"]), ops)
        assert patched["metadata"]["labels"]["coschedule.dev/placeholder"]


@settings(max_examples=2500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(review=mutated_reviews())
def test_mutated_reviews_never_break_the_server(review: dict[str, Any]) -> None:
    async def run() -> tuple[int, bytes]:
        transport = httpx.ASGITransport(app=app())
        async with httpx.AsyncClient(transport=transport, base_url="https://test") as client:
            answer = await client.post(
                "/mutate",
                content=orjson.dumps(review),
                headers={"Content-Type": "application/json"},
            )
            return answer.status_code, answer.content

    status, body = asyncio.run(run())
    check(review, status, body)


@settings(max_examples=500, deadline=None)
@given(
    body=st.binary(max_size=64)
    | json_values.map(orjson.dumps)
    | st.just(b'{"apiVersion":"admission.k8s.io/v1","kind":' + b"9" * 40 + b"}")
)
def test_arbitrary_bodies_get_400(body: bytes) -> None:
    handler = PodEndpoint(SettingsStore(None, {}), WebhookMetrics())
    status, payload = handler.handle(body)
    assert status == 400
    assert orjson.loads(payload)["error"]
