"""How long an upstream is waited for. A non-streamed answer comes whole, at the end
of its generation: it is waited for until the request's deadline, not the
deployment's per-read `timeout_s` (which would cut, retry and pay again for every
answer slower than it), and one that timed out is not retried on the same deployment.
`timeout_s` still bounds a stream's silences, its first byte included.

Through the real gateway over loopback, in front of fake upstreams with delays and
stalls, on both connection pools; the ledger on real Redis."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.errors import UpstreamTimeout
from gateway.health.breaker import BreakerSettings, CircuitBreakers
from gateway.ledger import RedisStore
from gateway.upstreams.base import UpstreamTarget, UpstreamTimedOut
from gateway.upstreams.litellm_impl import LiteLLMClient
from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.fakes.openai_upstream import Behaviour, FakeOpenAI
from tests.gateway.cascade_scenario import GOOD, QUESTION
from tests.gateway.conftest import AUTH, StartGateway, wait_for_record
from tests.gateway.scripted import BODY, ScriptedClient, answers, deployment, executor, fails

POLICY = """
deployments:
  first:
    api_base: ${FIRST_URL}
    model: first-model
    tier: local
    timeout_s: 0.3
    max_retries: 2
    retry_backoff_s: 0.01
    price: {input_per_mtok: 1, output_per_mtok: 2}
  second:
    api_base: ${SECOND_URL}
    model: second-model
    tier: premium
    max_retries: 0
    price: {input_per_mtok: 10, output_per_mtok: 20}
routes:
  auto: {strategy: fallback, deployments: [first, second], reference_model: second}
  only-first: {strategy: fixed, deployments: [first]}
  careful:
    strategy: cascade
    deployments: [first, second]
    verify_threshold: 0.5
    max_escalations: 1
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
gateway:
  request_timeout_s: ${REQUEST_TIMEOUT_S:-10}
"""
SLOWER_THAN_TIMEOUT_S = 1.0  # first's timeout_s is 0.3


@pytest.fixture
def second() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture(params=["aiohttp", "httpcore"])
def start(
    request: pytest.FixtureRequest,
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    second: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
) -> Any:
    monkeypatch.setenv("CASCADE_UPSTREAM_TRANSPORT", request.param)

    def run(**env: str) -> str:
        urls = {"FIRST_URL": fake_openai.url, "SECOND_URL": second.url}
        return start_gateway(POLICY, **urls, **env).url

    return run


def post(base: str, model: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": [QUESTION], **extra}
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)


async def test_a_non_streamed_answer_slower_than_timeout_s_is_answered_once(
    start: Any, fake_openai: FakeOpenAI, second: FakeOpenAI, ledger_store: RedisStore
) -> None:
    base = start()
    fake_openai.delay_s = SLOWER_THAN_TIMEOUT_S
    response = post(base, "auto")
    assert response.status_code == 200
    assert response.headers["x-cascade-deployment"] == "first"
    assert response.headers["x-cascade-attempts"] == "1"
    assert len(fake_openai.requests) == 1 and second.requests == []  # one paid generation
    record = await wait_for_record(ledger_store, response.headers["x-request-id"])
    assert record.status == "ok" and record.latency_ms >= SLOWER_THAN_TIMEOUT_S * 1000
    assert len(await ledger_store.events()) == 1  # no attempt cut off


def test_a_streaming_client_of_a_cascade_gets_a_slow_tier_answer_once(
    start: Any, fake_openai: FakeOpenAI, second: FakeOpenAI
) -> None:
    """A cascade asks its tiers non-streamed (it verifies the whole answer), streaming
    client or not: the slow cheap tier's answer is waited for, verified and streamed."""
    base = start()
    fake_openai.reply_text, fake_openai.delay_s = GOOD, SLOWER_THAN_TIMEOUT_S
    with httpx.stream(
        "POST",
        f"{base}/v1/chat/completions",
        json={"model": "careful", "messages": [QUESTION], "stream": True},
        headers=AUTH,
        timeout=30,
    ) as response:
        body = response.read()
    assert response.status_code == 200
    assert response.headers["x-cascade-deployment"] == "first"
    assert b"391" in body and body.endswith(b"data: [DONE]\n\n")
    assert len(fake_openai.requests) == 1 and second.requests == []


def test_a_stalled_stream_still_times_out_at_timeout_s(start: Any, fake_openai: FakeOpenAI) -> None:
    base = start()
    fake_openai.script(Behaviour(tokens=20, stall_after_chunks=2))
    began = time.monotonic()
    with httpx.stream(
        "POST",
        f"{base}/v1/chat/completions",
        json={"model": "only-first", "messages": [QUESTION], "stream": True},
        headers=AUTH,
        timeout=30,
    ) as response:
        body = response.read()
    assert response.status_code == 200
    assert b'"error"' in body and b"did not answer within 0.3s" in body
    assert time.monotonic() - began < 3  # the stall's timeout_s, not the 10 s deadline


def test_a_stream_silent_before_its_first_byte_moves_on_at_timeout_s(
    start: Any, fake_openai: FakeOpenAI, second: FakeOpenAI
) -> None:
    base = start()
    fake_openai.delay_s = 5
    began = time.monotonic()
    with httpx.stream(
        "POST",
        f"{base}/v1/chat/completions",
        json={"model": "auto", "messages": [QUESTION], "stream": True},
        headers=AUTH,
        timeout=30,
    ) as response:
        assert response.status_code == 200
        assert response.headers["x-cascade-deployment"] == "second"
        assert response.read().endswith(b"data: [DONE]\n\n")
    assert time.monotonic() - began < 3


async def test_the_request_deadline_bounds_a_non_streamed_wait(
    start: Any, fake_openai: FakeOpenAI, ledger_store: RedisStore
) -> None:
    base = start(REQUEST_TIMEOUT_S="0.8")
    fake_openai.delay_s = 5
    began = time.monotonic()
    response = post(base, "only-first")
    assert time.monotonic() - began < 3
    assert response.status_code == 504
    assert "within the request limit of" in response.json()["error"]["message"]
    assert len(fake_openai.requests) == 1  # waited for, not retried
    request_id = response.headers["x-request-id"]
    failed = await wait_for_record(ledger_store, request_id)
    cut = await wait_for_record(ledger_store, f"{request_id}:t1")
    assert (failed.status, failed.cost_nanos) == ("error", 0)
    assert (cut.status, cut.deployment, cut.completion_tokens) == ("partial", "first", 0)
    assert cut.prompt_tokens > 0


# --- the executor: a non-streamed timeout is not retried where it happened -----------


async def test_a_non_streamed_timeout_is_not_retried_on_the_same_deployment() -> None:
    """However it came (a write timeout, a client's own limit), the upstream had the
    prompt: a retry there would pay for a second generation. The next one is tried."""
    client = ScriptedClient({"a": fails(UpstreamTimedOut("timed out")), "b": answers()})
    run, _ = executor(client)
    with pytest.raises(UpstreamTimeout):
        await run.complete([deployment("a", retries=2)], "chat", BODY, 5.0)
    assert client.calls == ["a"]
    client.calls.clear()
    done = await run.complete([deployment("a", retries=2), deployment("b")], "chat", BODY, 5.0)
    assert (done.deployment.name, client.calls) == ("b", ["a", "b"])


async def test_a_non_streamed_call_waits_until_the_request_deadline() -> None:
    """What the clients are given: the request's time left (and a little more, so that
    the deadline ends the wait), not the deployment's `timeout_s`."""
    waits: list[float | None] = []

    class Noting(ScriptedClient):
        async def complete(self, target: Any, endpoint: Any, body: Any) -> Any:
            waits.append(target.answer_timeout_s)
            return await super().complete(target, endpoint, body)

    run, _ = executor(Noting({"a": answers()}))
    await run.complete([deployment("a")], "chat", BODY, 42.0)
    assert waits[0] is not None and 42.0 < waits[0] <= 43.0


@pytest.mark.parametrize(("timeout_s", "ejected"), [(0.05, True), (60.0, False)])
async def test_a_non_streamed_attempt_silent_past_timeout_s_counts_against_its_breaker(
    timeout_s: float, ejected: bool
) -> None:
    """Cut off by the deadline after waiting longer than its `timeout_s`: a timeout to
    its breaker, as before (a hung deployment is still ejected); a deadline shorter than
    `timeout_s` says nothing of it."""
    client = ScriptedClient({"a": answers(after_s=60)})
    run, guard = executor(client, CircuitBreakers(BreakerSettings(failure_threshold=1)))
    a = deployment("a")
    a = dataclasses.replace(a, target=dataclasses.replace(a.target, timeout_s=timeout_s))
    with pytest.raises(UpstreamTimeout):
        await run.complete([a], "chat", BODY, 0.2)
    assert guard.breakers.is_ejected("a") is ejected


async def test_litellm_waits_for_a_non_streamed_answer_as_long_as_it_is_told(
    fake_anthropic: FakeAnthropic,
) -> None:
    client = LiteLLMClient()
    try:
        fake_anthropic.delay_s = SLOWER_THAN_TIMEOUT_S
        target = UpstreamTarget(
            "claude", "anthropic", "claude-sonnet-4-5", fake_anthropic.url, fake_anthropic.api_key
        )
        target = dataclasses.replace(target, timeout_s=0.3)
        chat = {"model": "auto", "messages": [{"role": "user", "content": "one two three"}]}
        with pytest.raises(UpstreamTimedOut):  # told nothing: `timeout_s`, as before
            await client.complete(target, "chat", dict(chat))
        waiting = dataclasses.replace(target, answer_timeout_s=5.0)
        reply = await client.complete(waiting, "chat", dict(chat))
        assert reply.body["choices"][0]["finish_reason"] == "stop"
    finally:
        await client.close()
