"""A stream the upstream breaks after its first events (silent past the deployment's
`timeout_s`, its connection reset, its own failure event) is a failed attempt for the
deployment's circuit breaker and in `cascade_upstream_attempts_total`, as a timeout
before the first byte is; the client still gets its in-band error and the ledger its
`partial` record. A stream its client abandons is no verdict on the upstream.

Over real sockets: the gateway under uvicorn, fake upstreams that stall, reset or fail
in-band mid-stream, the ledger in real Redis."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.ledger import RedisStore
from tests.fakes.openai_upstream import Behaviour, FakeOpenAI
from tests.fakes.responses_upstream import FakeResponses
from tests.gateway.conftest import AUTH, StartGateway, metric, wait_for_record

THRESHOLD = 3
POLICY = f"""
deployments:
  hang:
    api_base: ${{HANG_URL}}
    model: hang-model
    tier: local
    timeout_s: ${{TIMEOUT_S:-0.5}}
    max_retries: 0
    price: {{input_per_mtok: 1, output_per_mtok: 2}}
  native:
    api_base: ${{RESPONSES_URL}}
    model: native-model
    tier: local
    max_retries: 0
    capabilities: [chat, responses]
    price: {{input_per_mtok: 1, output_per_mtok: 2}}
  spare:
    api_base: ${{SPARE_URL}}
    model: spare-model
    tier: premium
    max_retries: 0
    price: {{input_per_mtok: 10, output_per_mtok: 20}}
routes:
  auto: {{strategy: fallback, deployments: [hang, spare]}}
  only-hang: {{strategy: fixed, deployments: [hang]}}
  native: {{strategy: fallback, deployments: [native, spare]}}
keys:
  k: {{secret: "${{GATEWAY_TEST_KEY}}"}}
gateway:
  circuit_breaker: {{failure_threshold: {THRESHOLD}, cooldown_s: 60, half_open_probes: 1}}
"""
BROKEN = {
    "stall": Behaviour(tokens=20, stall_after_chunks=2),  # silent past timeout_s
    "reset": Behaviour(tokens=20, reset_after_chunks=2),  # the connection cut
}
CHAT = {"messages": [{"role": "user", "content": "count to twenty"}], "stream": True}


@pytest.fixture
def spare() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def start(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    fake_responses: FakeResponses,
    spare: FakeOpenAI,
) -> Any:
    def run(**env: str) -> str:
        urls = {
            "HANG_URL": fake_openai.url,
            "RESPONSES_URL": fake_responses.url,
            "SPARE_URL": spare.url,
        }
        return start_gateway(POLICY, **{**urls, **env}).url

    return run


def stream(base: str, model: str = "auto") -> tuple[httpx.Headers, bytes]:
    """A chat stream read to its end: its headers and body."""
    body = {"model": model, **CHAT}
    url = f"{base}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, headers=AUTH, timeout=30) as response:
        assert response.status_code == 200
        return response.headers, response.read()


def abandon(base: str) -> str:
    """A chat stream whose client hangs up after its first bytes: its request id."""
    with httpx.Client(timeout=30) as client:
        body = {"model": "auto", **CHAT}
        url = f"{base}/v1/chat/completions"
        with client.stream("POST", url, json=body, headers=AUTH) as response:
            assert response.status_code == 200
            next(response.iter_raw())
            return response.headers["x-request-id"]


def breaker(base: str, deployment: str) -> float:
    return metric(base, f'cascade_breaker_state{{deployment="{deployment}"}}')


def attempts(base: str, deployment: str, outcome: str) -> float:
    labels = f'deployment="{deployment}",outcome="{outcome}"'
    return metric(base, f"cascade_upstream_attempts_total{{{labels}}}")


@pytest.mark.parametrize("transport", ["aiohttp", "httpcore"])
@pytest.mark.parametrize("fault", sorted(BROKEN))
async def test_streams_broken_midway_eject_the_deployment(
    start: Any,
    fake_openai: FakeOpenAI,
    spare: FakeOpenAI,
    ledger_store: RedisStore,
    monkeypatch: pytest.MonkeyPatch,
    fault: str,
    transport: str,
) -> None:
    monkeypatch.setenv("CASCADE_UPSTREAM_TRANSPORT", transport)
    base = start()
    fake_openai.script(*[BROKEN[fault]] * THRESHOLD)
    for n in range(THRESHOLD):
        assert breaker(base, "hang") == 0, f"ejected after {n} broken streams"
        headers, body = stream(base)
        assert headers["x-cascade-deployment"] == "hang"
        assert b"upstream_stream_error" in body and b"[DONE]" not in body  # told in-band
        record = await wait_for_record(ledger_store, headers["x-request-id"])
        assert record.status == "partial" and record.deployment == "hang"
    assert breaker(base, "hang") == 2  # open
    assert spare.requests == []  # bytes had reached the clients: never retried there
    headers, body = stream(base)
    assert headers["x-cascade-deployment"] == "spare" and body.endswith(b"data: [DONE]\n\n")
    assert len(fake_openai.requests) == THRESHOLD
    only = httpx.post(
        f"{base}/v1/chat/completions", json={"model": "only-hang", **CHAT}, headers=AUTH
    )
    assert only.status_code == 503  # its only deployment ejected
    assert "circuit breaker" in only.json()["error"]["message"]


async def test_a_broken_stream_is_a_failed_attempt_in_the_metrics(
    start: Any, fake_openai: FakeOpenAI
) -> None:
    base = start()
    stream(base)
    assert attempts(base, "hang", "ok") == 1
    assert attempts(base, "hang", "stream_error") == 0
    fake_openai.script(BROKEN["stall"])
    stream(base)
    assert attempts(base, "hang", "stream_error") == 1  # the one counted ok when it opened
    assert attempts(base, "hang", "ok") == 2


async def test_a_finished_stream_ends_the_streak_its_first_events_do_not(
    start: Any, fake_openai: FakeOpenAI
) -> None:
    """Consecutive failures: a stream that finishes resets them, one that opens and
    then breaks does not (it used to, on its first events)."""
    base = start()
    fake_openai.script(*[BROKEN["reset"]] * (THRESHOLD - 1), Behaviour(), BROKEN["reset"])
    for _ in range(THRESHOLD + 1):
        stream(base)
    assert breaker(base, "hang") == 0  # 2 broken, 1 finished, 1 broken: no streak of 3
    fake_openai.script(*[BROKEN["reset"]] * (THRESHOLD - 1))
    for _ in range(THRESHOLD - 1):
        stream(base)
    assert breaker(base, "hang") == 2


async def test_streams_their_clients_abandon_are_no_verdict(
    start: Any, fake_openai: FakeOpenAI, spare: FakeOpenAI, ledger_store: RedisStore
) -> None:
    """Clients gone from streams that had stalled (within `timeout_s`): nothing against
    the upstream, which keeps serving."""
    base = start(TIMEOUT_S="10")
    fake_openai.script(*[BROKEN["stall"]] * (THRESHOLD + 1))
    for _ in range(THRESHOLD + 1):
        record = await wait_for_record(ledger_store, abandon(base))
        assert record.status == "partial" and record.deployment == "hang"
    assert breaker(base, "hang") == 0
    assert attempts(base, "hang", "stream_error") == 0
    headers, body = stream(base)
    assert headers["x-cascade-deployment"] == "hang" and body.endswith(b"data: [DONE]\n\n")
    assert spare.requests == []


async def test_native_streams_failed_in_band_eject_the_deployment(
    start: Any, fake_responses: FakeResponses, spare: FakeOpenAI, ledger_store: RedisStore
) -> None:
    """The Responses API's `response.failed` (a `server_error`): relayed as it came,
    recorded `partial`, and a failure of the deployment."""
    base = start()
    fake_responses.script(*[Behaviour(fail_in_stream=True)] * THRESHOLD)
    body = {"model": "native", "input": "count to five", "stream": True}
    for _ in range(THRESHOLD):
        url = f"{base}/v1/responses"
        with httpx.stream("POST", url, json=body, headers=AUTH, timeout=30) as response:
            events = [line for line in response.iter_lines() if line.startswith("event:")]
        assert response.headers["x-cascade-deployment"] == "native"
        assert events[-1] == "event: response.failed"
        record = await wait_for_record(ledger_store, response.headers["x-request-id"])
        assert record.status == "partial"
    assert breaker(base, "native") == 2
    assert attempts(base, "native", "stream_error") == THRESHOLD
    response = httpx.post(f"{base}/v1/responses", json=body, headers=AUTH, timeout=30)
    assert response.headers["x-cascade-deployment"] == "spare"
