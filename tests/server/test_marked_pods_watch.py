"""The webhook's watch of marked pods runs only while ``rewrite-claims`` asks for it.

Through the whole ``coschedule serve`` process (real HTTPS, its caches fed by the kmock
emulator): with ``rewrite-claims`` off no run pod's events are watched (every one would
cost kube-apiserver an encoding and the webhook a decode, for no decision); a reload that
turns it on starts the watch, the replica stays ready, and a pod whose claims it rewrites
waits for the watch's first list and follows the decision an earlier pod of its run carries.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from coschedule.marks import (
    ANNOTATION_CLAIM_TEMPLATES,
    LABEL_PLACEHOLDER,
    ClaimTemplate,
    encode_claim_templates,
    placeholder_claim,
    run_placeholder,
)
from tests.concurrency.test_runs_https import (
    ENABLED,
    Obj,
    https,
    is_ready,
    namespace,
    patched,
    readyz,
    until,
)
from tests.conftest import launch_server, stop_server, write_kubeconfig
from tests.fixtures import admission_review, load_pod
from tests.reconcile.apiserver import MiniApi
from tests.reconcile.conftest import eventually
from tests.server.test_bind_wait_https import run_claim
from tests.server.test_cache_sync import post_pod

CONFIG = {"coschedule": "pipelineruns"}
MARKED = LABEL_PLACEHOLDER  # the marked pods' selector: every pod that carries the label


def marked_pods_calls(api: MiniApi, verb: str) -> int:
    """Lists or watches of the marked pods (the placeholder cache watches its own pods)."""
    return sum(
        1 for _, _, params in api.calls(verb, "pods") if params.get("labelSelector") == MARKED
    )


def claim_names(pod: Obj) -> list[str]:
    return [
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    ]


async def test_rewrite_claims_turned_on_by_a_reload_starts_the_watch_and_pods_wait_for_it(
    api: MiniApi, tmp_path: Path
) -> None:
    api.put("namespaces", namespace("ci", ENABLED))
    pod = load_pod("tekton-taskrun")  # run pr-7f3k2; mounts a template claim of its run
    [claim] = claim_names(pod)
    api.put("persistentvolumeclaims", run_claim(claim))
    placeholder = run_placeholder("ci", "pr-7f3k2")
    # An earlier pod of the run (admitted by another replica) carries a template name of
    # its own: the pod must follow it, which only the marked pods' watch tells.
    chosen = ClaimTemplate("chosen", claim, {"accessModes": ["ReadWriteOnce"]})
    earlier = load_pod("tekton-taskrun")
    meta = earlier["metadata"]
    meta.update(name="earlier-pod", creationTimestamp="2026-11-21T06:00:00Z")
    meta["labels"][LABEL_PLACEHOLDER] = placeholder
    meta.setdefault("annotations", {})[ANNOTATION_CLAIM_TEMPLATES] = encode_claim_templates(
        [chosen]
    )
    api.put("pods", earlier)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    server = await asyncio.to_thread(launch_server, tmp_path, kubeconfig=kubeconfig, config=CONFIG)
    listed = asyncio.Event()  # the watch's first list, held until the pod is posted
    try:
        await until(server, lambda: is_ready(server))
        async with https(server) as http:  # served before: the caches were read
            before = await post_pod(http, admission_review(pod))
        assert before.json()["response"]["allowed"] is True
        assert claim_names(patched(admission_review(pod), before.json()["response"])) == [claim]
        assert marked_pods_calls(api, "GET") == 0
        assert marked_pods_calls(api, "WATCH") == 0

        api.holds[("GET", "pods")] = listed
        (tmp_path / "config" / "rewrite-claims").write_text("true")
        await eventually(lambda: marked_pods_calls(api, "GET") == 1, within=15)  # a reload: 2 s
        status, body = await readyz(server)
        assert status == 200, body  # still serving while the watch lists
        review = admission_review(pod)
        async with https(server) as http:
            posted = asyncio.create_task(post_pod(http, review))
            await asyncio.sleep(0.5)
            assert not posted.done()  # waiting for the marked pods, not deciding without
            listed.set()
            answer = await posted
        assert answer.status_code == 200, answer.text
        response: Obj = answer.json()["response"]
        assert response["allowed"] is True, response
        assert claim_names(patched(review, response)) == [placeholder_claim("chosen", placeholder)]
        await eventually(lambda: marked_pods_calls(api, "WATCH") == 1)
        assert "claim-cache-not-synced" not in server.log()
    finally:
        listed.set()
        await asyncio.to_thread(stop_server, server)
