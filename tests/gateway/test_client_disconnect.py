"""A client that hangs up before its answer: the gateway stops there, rather than retry,
fall back to other (dearer) deployments and pay for answers nobody reads. What was in
flight is priced as cut off (the upstream had the prompt), and the request recorded
once, as `cancelled`: a request, not an error of the gateway's
(`gateway.http.disconnects`).

Over real sockets: the gateway under uvicorn, a client that writes its request and
closes the connection while the first deployment is slow and failing (a fake), and
the ledger read from real Redis."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import pytest

from gateway.ledger import RedisStore, SpendRecord
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import CLIENT_KEY, StartGateway
from tests.support import eventually, eventually_async

POLICY = """
deployments:
  first:
    api_base: ${FIRST_URL}
    model: first-model
    tier: local
    max_retries: ${FIRST_RETRIES:-0}
    retry_backoff_s: 1
    price: {input_per_mtok: 1, output_per_mtok: 2}
  second:
    api_base: ${SECOND_URL}
    model: second-model
    tier: premium
    price: {input_per_mtok: 10, output_per_mtok: 20}
routes:
  auto: {strategy: fallback, deployments: [first, second]}
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
"""
SLOW_S = 1.0  # the first deployment's delay before it fails
AFTER_FALLBACK_S = 2.0  # by then a gateway still going would have asked `second`


@pytest.fixture
def second() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def port(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, second: FakeOpenAI, request: Any
) -> int:
    retries = getattr(request, "param", "0")
    server = start_gateway(
        POLICY, FIRST_URL=fake_openai.url, SECOND_URL=second.url, FIRST_RETRIES=retries
    )
    return server.port


def hang_up(port: int, upstream: FakeOpenAI, **extra: Any) -> None:
    """Send a chat request, and close the connection once the upstream has it."""
    payload = orjson.dumps(
        {"model": "auto", "messages": [{"role": "user", "content": "hi"}]} | extra
    )
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        f"authorization: Bearer {CLIENT_KEY}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(payload)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head.encode() + payload)
        eventually(lambda: upstream.requests, what="the first upstream call")
        time.sleep(0.2)


async def records_of(store: RedisStore, count: int) -> list[SpendRecord]:
    """The ledger's records, once there are `count` (and a moment for any more)."""
    await eventually_async(lambda: _at_least(store, count), what=f"{count} records")
    return sorted(await store.events(), key=lambda r: r.record_id)


async def _at_least(store: RedisStore, count: int) -> bool:
    return len(await store.events()) >= count


@pytest.mark.parametrize("stream", [False, True], ids=["reply", "stream"])
async def test_a_client_gone_during_a_slow_failing_attempt_stops_the_request(
    port: int,
    fake_openai: FakeOpenAI,
    second: FakeOpenAI,
    ledger_store: RedisStore,
    stream: bool,
) -> None:
    """Gone before the first deployment failed: the second is never asked; the attempt
    in flight is priced once (its prompt), the request recorded once, as `cancelled`:
    a request and a call in the spend rows, no error; status 499 in the metrics."""
    fake_openai.fail(500, times=None)
    fake_openai.delay_s = SLOW_S
    hang_up(port, fake_openai, stream=stream)
    time.sleep(AFTER_FALLBACK_S)
    assert len(fake_openai.requests) == 1 and second.requests == []
    request, cut = await records_of(ledger_store, 2)
    assert cut.record_id == f"{request.request_id}:t1"
    assert (request.status, request.cost_nanos) == ("cancelled", 0)
    assert (cut.deployment, cut.status, cut.completion_tokens) == ("first", "partial", 0)
    assert cut.prompt_tokens > 0
    assert len(await ledger_store.events()) == 2
    today = datetime.now(UTC).date()
    (row,) = await ledger_store.aggregate(today, today, ["route"])
    assert (row.requests, row.errors, row.calls, row.cost_nanos) == (1, 0, 1, cut.cost_nanos)
    (line,) = _requests_lines(f"http://127.0.0.1:{port}")
    assert 'route="auto"' in line and 'status="499"' in line and line.endswith(" 1.0")


@pytest.mark.parametrize("port", ["2"], indirect=True)
async def test_a_client_gone_while_its_request_waits_to_retry_is_recorded_once(
    port: int, fake_openai: FakeOpenAI, second: FakeOpenAI, ledger_store: RedisStore
) -> None:
    """Gone while the first deployment's retry waits out its backoff (nothing in flight):
    no retry, no fallback, one ledger record."""
    fake_openai.fail(500, times=None)
    hang_up(port, fake_openai)
    time.sleep(AFTER_FALLBACK_S + 1)  # the backoffs (1 s, then 1 s at most) and fallback
    assert len(fake_openai.requests) == 1 and second.requests == []
    (record,) = await records_of(ledger_store, 1)
    assert (record.record_id, record.status, record.deployment) == (
        record.request_id,
        "cancelled",
        "first",
    )


def _requests_lines(base: str) -> list[str]:
    text = httpx.get(f"{base}/metrics").text
    return [line for line in text.splitlines() if line.startswith("cascade_requests_total")]
