"""The ledger seen through the gateway: many concurrent requests, and Redis dying and
coming back under traffic. Spend is recorded once and only once."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import httpx

from gateway.ledger import RedisStore, SpendRecord
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import (
    AUTH,
    StartGateway,
    openai_compatible_policy,
    wait_for_record,
)
from tests.gateway.ledger_fixtures import RedisServer


async def send(client: httpx.AsyncClient, base: str, i: int) -> httpx.Response:
    body = {"model": "auto", "messages": [{"role": "user", "content": "word " * (i % 17 + 1)}]}
    if i % 3 == 0:
        body["stream"] = True
    return await client.post(f"{base}/v1/chat/completions", json=body, headers=AUTH)


async def test_200_concurrent_requests_are_200_records_summing_to_the_aggregates(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, ledger_store: RedisStore
) -> None:
    base = start_gateway(openai_compatible_policy(), UPSTREAM_BASE_URL=fake_openai.url).url
    fake_openai.delay_s = 0.05  # keep them all in flight together
    limits = httpx.Limits(max_connections=200)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        responses = await asyncio.gather(*(send(client, base, i) for i in range(200)))
    assert [r.status_code for r in responses] == [200] * 200
    ids = {r.headers["x-request-id"] for r in responses}
    assert len(ids) == 200

    records = [await wait_for_record(ledger_store, request_id) for request_id in ids]
    events = await ledger_store.events(limit=1000)
    assert sorted(e.record_id for e in events) == sorted(ids)
    today = datetime.now(UTC).date()
    [total] = await ledger_store.aggregate(today, today, [])
    assert total.requests == 200
    assert total.cost_nanos == sum(r.cost_nanos for r in records)
    assert total.reference_cost_nanos == sum(r.reference_cost_nanos for r in records)
    assert total.prompt_tokens == sum(r.prompt_tokens for r in records)
    assert total.completion_tokens == sum(r.completion_tokens for r in records)
    # to the cent, in dollars, as finance reads it
    assert round(total.cost_nanos / 1e9, 2) == round(sum(r.cost_nanos for r in records) / 1e9, 2)
    [by_team] = await ledger_store.aggregate(today, today, ["team", "route"])
    assert by_team.group == {"team": "test", "route": "auto"}
    assert by_team.cost_nanos == total.cost_nanos


async def test_redis_dies_under_traffic_and_spend_is_replayed_exactly_once(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, redis_server: RedisServer
) -> None:
    server = start_gateway(
        openai_compatible_policy(), redis=redis_server.url, UPSTREAM_BASE_URL=fake_openai.url
    )
    store = RedisStore(redis_server.url, prefix=server.services.settings.redis_prefix)
    ids: list[str] = []
    async with httpx.AsyncClient(timeout=30) as client:
        for phase in ("before", "during", "after"):
            if phase == "during":
                redis_server.kill()
            if phase == "after":
                redis_server.start()
            for i in range(10):
                response = await send(client, server.url, i)
                assert response.status_code == 200, (phase, response.text)
                ids.append(response.headers["x-request-id"])
            if phase == "during":
                assert server.services.ledger.degraded

    deadline = time.monotonic() + 15
    records: list[SpendRecord] = []
    while time.monotonic() < deadline:
        records = await store.events(limit=1000)
        if len(records) >= len(ids):
            break
        await asyncio.sleep(0.1)
    assert sorted(r.record_id for r in records) == sorted(ids)  # all there, none twice
    await store.close()


async def test_shutdown_finishes_in_flight_requests_and_flushes_the_ledger(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, ledger_store: RedisStore
) -> None:
    server = start_gateway(openai_compatible_policy(), UPSTREAM_BASE_URL=fake_openai.url)
    fake_openai.delay_s = 1.0
    async with httpx.AsyncClient(timeout=30) as client:
        in_flight = [asyncio.create_task(send(client, server.url, i)) for i in range(6)]
        while len(fake_openai.requests) < 6:  # all six reached the upstream
            await asyncio.sleep(0.01)
        await asyncio.to_thread(server.stop)  # graceful: waits for them
        responses = await asyncio.gather(*in_flight)
    assert [r.status_code for r in responses] == [200] * 6
    for response in responses:  # written before the process would have exited
        assert await ledger_store.get(response.headers["x-request-id"]) is not None


async def test_a_request_that_gets_no_answer_is_recorded_once_as_an_error(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, ledger_store: RedisStore
) -> None:
    """Finance's `errors` and request counts include requests the upstreams failed (and
    ones they refused): one `error` record each, no tokens, no cost, no reference."""
    base = start_gateway(openai_compatible_policy(), UPSTREAM_BASE_URL=fake_openai.url).url
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
    fake_openai.fail(500, times=None)
    failed = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    fake_openai.fail(400, times=None)
    refused = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert (failed.status_code, refused.status_code) == (502, 400)
    for response in (failed, refused):
        record = await wait_for_record(ledger_store, response.headers["x-request-id"])
        assert (record.status, record.deployment, record.route) == ("error", "upstream", "auto")
        assert (record.prompt_tokens, record.cost_nanos, record.reference_cost_nanos) == (0, 0, 0)
    fake_openai.fail(500, times=0)
    answered = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert answered.status_code == 200
    await wait_for_record(ledger_store, answered.headers["x-request-id"])
    today = datetime.now(UTC).date()
    [total] = await ledger_store.aggregate(today, today, [])
    assert (total.requests, total.errors) == (3, 2)
    events = await ledger_store.events()
    assert sorted(e.status for e in events) == ["error", "error", "ok"]


async def test_a_request_nothing_may_serve_is_recorded_as_an_error(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, ledger_store: RedisStore
) -> None:
    """Refused before any upstream is asked (every deployment ejected by its breaker):
    still one `error` record, as for one the upstreams failed."""
    policy = openai_compatible_policy().read_text() + (
        "gateway:\n  circuit_breaker: {failure_threshold: 1, cooldown_s: 600}\n"
    )
    base = start_gateway(policy, UPSTREAM_BASE_URL=fake_openai.url).url
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
    fake_openai.fail(500, times=None)
    tripped = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    ejected = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert (tripped.status_code, ejected.status_code) == (502, 503)
    asked = len(fake_openai.requests)
    record = await wait_for_record(ledger_store, ejected.headers["x-request-id"])
    assert (record.status, record.deployment, record.cost_nanos) == ("error", "upstream", 0)
    assert len(fake_openai.requests) == asked  # the ejected one reached no upstream
