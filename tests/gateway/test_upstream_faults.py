"""Retries, fallback and upstream failures, through the real gateway over loopback,
against fake upstreams with fault knobs. Spend is recorded for answers, and for the prompt of an
attempt a timeout cut off after it was sent."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.ledger import RedisStore
from tests.fakes.openai_upstream import Behaviour, FakeOpenAI
from tests.gateway.conftest import AUTH, StartGateway, wait_for_record

TWO_DEPLOYMENTS = """
deployments:
  first:
    api_base: ${FIRST_URL}
    model: first-model
    tier: local
    timeout_s: ${TIMEOUT_S:-5}
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
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
admin_keys: ["${GATEWAY_ADMIN_KEY}"]
gateway:
  request_timeout_s: ${REQUEST_TIMEOUT_S:-30}
"""


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
    """Starts the gateway; every fault test runs over both connection pools."""
    monkeypatch.setenv("CASCADE_UPSTREAM_TRANSPORT", request.param)

    def run(**env: str) -> str:
        urls = {"FIRST_URL": fake_openai.url, "SECOND_URL": second.url}
        return start_gateway(TWO_DEPLOYMENTS, **{**urls, **env}).url

    return run


def post(base: str, model: str = "auto", **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hello there"}], **extra}
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


async def test_retry_then_success_on_same_deployment(
    start: Any, fake_openai: FakeOpenAI, second: FakeOpenAI, ledger_store: RedisStore
) -> None:
    base = start()
    fake_openai.fail(500, times=2)
    response = post(base)
    assert response.status_code == 200
    assert response.headers["x-cascade-deployment"] == "first"
    assert response.headers["x-cascade-attempts"] == "3"
    assert second.requests == []
    record = await wait_for_record(ledger_store, response.headers["x-request-id"])
    assert record.deployment == "first"
    assert len(await ledger_store.events()) == 1  # failed attempts cost nothing


def test_fallback_to_the_next_deployment(
    start: Any, fake_openai: FakeOpenAI, second: FakeOpenAI
) -> None:
    base = start()
    fake_openai.fail(500, times=None)
    response = post(base)
    assert response.status_code == 200
    assert response.headers["x-cascade-deployment"] == "second"
    assert response.headers["x-cascade-tier"] == "premium"
    assert len(fake_openai.requests) == 3 and len(second.requests) == 1
    assert second.requests[0]["body"]["model"] == "second-model"


def test_busy_503_goes_elsewhere_at_once(
    start: Any, fake_openai: FakeOpenAI, second: FakeOpenAI
) -> None:
    """vLLM answers 503 when its queue limits are hit: not retried there (and, on
    routes with an SLA, avoided for a while rather than ejected)."""
    base = start()
    fake_openai.fail(503, times=1)
    first = post(base)
    assert first.headers["x-cascade-deployment"] == "second"
    assert len(fake_openai.requests) == 1 and len(second.requests) == 1
    assert first.headers["x-cascade-attempts"] == "2"


def test_retry_after_is_honoured(start: Any, fake_openai: FakeOpenAI) -> None:
    base = start()
    fake_openai.fail(429, times=1, retry_after="1")
    began = time.monotonic()
    response = post(base, model="only-first")
    assert response.status_code == 200
    assert time.monotonic() - began >= 0.9


def test_all_rate_limited_is_429_with_retry_after(
    start: Any, fake_openai: FakeOpenAI, second: FakeOpenAI
) -> None:
    base = start()
    fake_openai.fail(429, times=None, retry_after="30")  # longer than the wait cap: move on
    second.fail(429, times=None, retry_after="7")
    response = post(base)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7"
    assert response.json()["error"]["type"] == "rate_limit_error"


def test_every_deployment_busy_is_503_with_their_retry_after(
    start: Any, fake_openai: FakeOpenAI, second: FakeOpenAI
) -> None:
    base = start()
    fake_openai.fail(503, times=None, retry_after="4")
    second.fail(503, times=None, retry_after="2")
    response = post(base)
    assert response.status_code == 503
    assert response.headers["retry-after"] == "2"  # the first one expected back


def test_all_failing_is_502_and_unreachable_is_503(
    start: Any, fake_openai: FakeOpenAI, second: FakeOpenAI
) -> None:
    base = start()
    fake_openai.fail(500, times=None)
    second.fail(500, times=None)
    response = post(base)
    assert response.status_code == 502
    assert response.json()["error"]["type"] == "upstream_error"

    base = start(FIRST_URL=closed_port_url(), SECOND_URL=closed_port_url())
    response = post(base)
    assert response.status_code == 503
    assert "cannot connect" in response.json()["error"]["message"]
    assert "retry-after" not in response.headers  # nothing says when they come back


def test_timeout_is_504(start: Any, fake_openai: FakeOpenAI) -> None:
    """A stream silent past `timeout_s` before its first byte, every try. (A non-streamed
    answer is waited for until the request's deadline: test_answer_timeouts.)"""
    base = start(TIMEOUT_S="0.3")
    fake_openai.delay_s = 2
    response = post(base, model="only-first", stream=True)
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "upstream_timeout"


def test_client_fault_from_upstream_is_not_retried(
    start: Any, fake_openai: FakeOpenAI, second: FakeOpenAI
) -> None:
    base = start()
    fake_openai.fail(400, times=1)
    response = post(base)
    assert response.status_code == 400
    assert len(fake_openai.requests) == 1 and second.requests == []


def test_malformed_upstream_json_falls_back(
    start: Any, fake_openai: FakeOpenAI, second: FakeOpenAI
) -> None:
    base = start()
    fake_openai.malformed_json = True
    response = post(base)
    assert response.status_code == 200
    assert response.headers["x-cascade-deployment"] == "second"


def test_a_stream_event_that_is_not_json_ends_the_stream_with_an_error_event(
    start: Any, fake_openai: FakeOpenAI
) -> None:
    """Relayed, the broken event would make the client's parser fail (a bare
    JSONDecodeError in the OpenAI SDK); after the first bytes went out the stream ends
    with the gateway's in-band error event instead, which the SDK raises as APIError."""
    base = start()
    fake_openai.malformed_json = True  # the first content chunk, after the role's
    with httpx.stream(
        "POST",
        f"{base}/v1/chat/completions",
        json={"model": "auto", "messages": [{"role": "user", "content": "x"}], "stream": True},
        headers=AUTH,
    ) as response:
        body = response.read()
    assert b"broken" not in body
    assert b'"code":"upstream_stream_error"' in body
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=AUTH["authorization"][7:])
    stream = client.chat.completions.create(
        model="auto", messages=[{"role": "user", "content": "x"}], stream=True
    )
    with pytest.raises(openai.APIError, match="not JSON"):
        list(stream)


def test_stream_falls_back_before_first_byte(
    start: Any, fake_openai: FakeOpenAI, second: FakeOpenAI
) -> None:
    base = start()
    fake_openai.fail(503, times=None)
    with httpx.stream(
        "POST",
        f"{base}/v1/chat/completions",
        json={"model": "auto", "messages": [{"role": "user", "content": "x"}], "stream": True},
        headers=AUTH,
    ) as response:
        assert response.status_code == 200
        assert response.headers["x-cascade-deployment"] == "second"
        body = response.read()
    assert body.endswith(b"data: [DONE]\n\n")


async def test_stream_reset_midway_is_not_retried_and_is_priced(
    start: Any, fake_openai: FakeOpenAI, second: FakeOpenAI, ledger_store: RedisStore
) -> None:
    base = start()
    fake_openai.script(Behaviour(tokens=20, reset_after_chunks=5))
    with httpx.stream(
        "POST",
        f"{base}/v1/chat/completions",
        json={"model": "auto", "messages": [{"role": "user", "content": "x"}], "stream": True},
        headers=AUTH,
    ) as response:
        assert response.status_code == 200
        body = response.read()
        request_id = response.headers["x-request-id"]
    assert b'"error"' in body and b"[DONE]" not in body
    assert second.requests == []  # bytes were sent: no silent retry elsewhere
    record = await wait_for_record(ledger_store, request_id)
    assert record.status == "partial" and record.usage_source == "counted"
    assert 1 <= record.completion_tokens <= 10


async def test_missing_usage_is_counted(
    start: Any, fake_openai: FakeOpenAI, ledger_store: RedisStore
) -> None:
    base = start()
    fake_openai.omit_usage = True
    response = post(base, model="only-first")
    assert response.status_code == 200
    record = await wait_for_record(ledger_store, response.headers["x-request-id"])
    assert record.usage_source == "counted"
    assert record.prompt_tokens > 0 and record.completion_tokens > 0
    assert record.cost_nanos == record.prompt_tokens * 1000 + record.completion_tokens * 2000


@pytest.mark.parametrize("stream", [False, True], ids=["reply", "stream"])
async def test_a_count_above_the_cap_sent_is_billed_at_the_cap(
    start: Any, fake_openai: FakeOpenAI, ledger_store: RedisStore, stream: bool
) -> None:
    """Our tokenizer reads the fake's 30 words ("word1"...) as more than 30 tokens; an
    upstream honouring `max_tokens: 30` wrote no more than 30 of its own, and the
    budget held no more: the count is billed at most at the cap, for each answer."""
    base = start()
    fake_openai.script(*[Behaviour(tokens=30, omit_usage=True)] * 3)
    uncapped = post(base, model="only-first", stream=stream)
    capped = post(base, model="only-first", stream=stream, max_tokens=30)
    two = post(base, model="only-first", stream=stream, max_tokens=30, n=2)
    counts = []
    for response in (uncapped, capped, two):
        assert response.status_code == 200
        record = await wait_for_record(ledger_store, response.headers["x-request-id"])
        assert record.usage_source == "counted"
        counts.append(record.completion_tokens)
    assert counts[0] > 30 and counts[1] == 30 and 30 < counts[2] <= 60


async def test_client_disconnect_midstream_is_priced(
    start: Any, fake_openai: FakeOpenAI, ledger_store: RedisStore
) -> None:
    base = start()
    fake_openai.script(Behaviour(tokens=200, itl_s=0.02))
    async with (
        httpx.AsyncClient() as client,
        client.stream(
            "POST",
            f"{base}/v1/chat/completions",
            json={
                "model": "only-first",
                "messages": [{"role": "user", "content": "x"}],
                "stream": True,
            },
            headers=AUTH,
        ) as response,
    ):
        request_id = response.headers["x-request-id"]
        seen = b""
        async for chunk in response.aiter_bytes():
            seen += chunk
            if re.search(rb'"content":\s*"[^"]', seen):
                break  # hang up once some text came (the first chunk may be the role's)
    record = await wait_for_record(ledger_store, request_id)
    assert record.status == "partial"
    assert 0 < record.completion_tokens < 200


def test_refused_connection_falls_back_at_once(start: Any, second: FakeOpenAI) -> None:
    base = start(FIRST_URL=closed_port_url())
    response = post(base)
    assert response.status_code == 200
    assert response.headers["x-cascade-deployment"] == "second"
    assert response.headers["x-cascade-attempts"] == "2"  # no retries on a dead engine


def test_request_deadline_bounds_all_attempts(start: Any, fake_openai: FakeOpenAI) -> None:
    base = start(REQUEST_TIMEOUT_S="0.5")
    fake_openai.delay_s = 3  # each attempt would wait its 5 s timeout
    began = time.monotonic()
    response = post(base, model="only-first")
    assert response.status_code == 504
    assert "request limit" in response.json()["error"]["message"]
    assert time.monotonic() - began < 2


def test_upstream_credential_errors_do_not_echo_the_upstream(
    start: Any, fake_openai: FakeOpenAI, second: FakeOpenAI
) -> None:
    base = start()
    fake_openai.fail(401, times=None)  # the real API quotes part of the key it got
    second.fail(401, times=None)
    response = post(base)
    assert response.status_code == 502
    message = response.json()["error"]["message"]
    assert "rejected the gateway's credentials" in message
    assert "Incorrect API key" not in message


async def test_an_attempt_that_timed_out_is_charged_its_prompt(
    start: Any, fake_openai: FakeOpenAI, second: FakeOpenAI, ledger_store: RedisStore
) -> None:
    """The first deployment had the prompt when its timeout cut its stream off before the
    first byte: it is priced as a losing hedge is (`:t1`, partial, prompt only)."""
    base = start(TIMEOUT_S="0.3")
    fake_openai.delay_s = 2
    with httpx.stream(
        "POST",
        f"{base}/v1/chat/completions",
        json={"model": "auto", "messages": [{"role": "user", "content": "x"}], "stream": True},
        headers=AUTH,
    ) as response:
        assert response.status_code == 200
        assert response.read().endswith(b"data: [DONE]\n\n")
    assert response.headers["x-cascade-deployment"] == "second"
    request_id = response.headers["x-request-id"]
    answer = await wait_for_record(ledger_store, request_id)
    cut = await wait_for_record(ledger_store, f"{request_id}:t1")
    assert (answer.deployment, answer.status) == ("second", "ok")
    assert (cut.deployment, cut.status, cut.completion_tokens) == ("first", "partial", 0)
    assert cut.prompt_tokens > 0 and cut.cost_nanos > 0 and cut.reference_cost_nanos == 0


async def test_a_request_cut_off_by_its_deadline_is_charged_the_prompt_in_flight(
    start: Any, fake_openai: FakeOpenAI, ledger_store: RedisStore
) -> None:
    base = start(REQUEST_TIMEOUT_S="0.5")
    fake_openai.delay_s = 3
    response = post(base, model="only-first")
    assert response.status_code == 504
    request_id = response.headers["x-request-id"]
    failed = await wait_for_record(ledger_store, request_id)
    cut = await wait_for_record(ledger_store, f"{request_id}:t1")
    assert (failed.status, failed.cost_nanos) == ("error", 0)
    assert (cut.status, cut.deployment) == ("partial", "first") and cut.prompt_tokens > 0
