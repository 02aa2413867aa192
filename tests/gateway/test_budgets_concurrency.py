"""The budget invariant under concurrency: 500 requests at once against a small budget,
through two gateway servers sharing one Redis, never spend past the hard limit by
more than one request's worst case; every accepted request is in the ledger once."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx

from gateway.billing.tokens import count_prompt
from gateway.ledger import RedisStore
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import AUTH, StartGateway
from tests.gateway.shared_budget import (
    LIMIT_NANOS,
    MAX_TOKENS,
    MESSAGES,
    POLICY,
    REQUESTS,
    ledger_until,
    wait_until_settled,
)

PROMPT = count_prompt("big-model", "chat", {"messages": MESSAGES})
WORST = (PROMPT + MAX_TOKENS) * 10_000  # $10 per million tokens, in and out
SPREAD_S = 1.5


async def test_two_gateways_never_overspend_a_shared_budget(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    ledger_store: RedisStore,
    redis_url: str,
    redis_prefix: str,
) -> None:
    fake_openai.tokens, fake_openai.delay_s = 5, 0.02
    servers = [start_gateway(POLICY, PREMIUM_URL=fake_openai.url) for _ in range(2)]
    body = {"model": "auto", "messages": MESSAGES, "max_tokens": MAX_TOKENS}

    async def send(client: httpx.AsyncClient, i: int) -> httpx.Response:
        # Half arrive at once, half over a second: bursts, and settlements freeing room.
        await asyncio.sleep(0 if i % 2 else i / REQUESTS * SPREAD_S)
        url = f"{servers[i % 2].url}/v1/chat/completions"
        return await client.post(url, json=body, headers=AUTH)

    # Fresh connections: a keep-alive connection reused as uvicorn closes it reads an EOF.
    limits = httpx.Limits(max_connections=REQUESTS, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        responses = await asyncio.gather(*(send(client, i) for i in range(REQUESTS)))
    accepted = [r.headers["x-request-id"] for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code != 200]
    assert accepted and refused
    codes = {(r.status_code, r.json()["error"]["code"]) for r in refused}
    assert codes & {(429, "budget_exceeded"), (429, "budget_busy")}
    assert codes <= {(429, "budget_exceeded"), (429, "budget_busy"), (503, "limits_unavailable")}

    spent = await asyncio.to_thread(wait_until_settled, redis_url, redis_prefix)
    assert spent <= LIMIT_NANOS + WORST  # the invariant
    assert spent <= LIMIT_NANOS  # and in fact: a request is admitted only if its worst fits
    assert spent > LIMIT_NANOS / 2  # the budget was really used up, not refused early

    ledger = await ledger_until(ledger_store, len(accepted))
    counts = Counter(record.request_id for record in ledger)
    assert sorted(counts) == sorted(accepted)  # every accepted request, and no other ...
    assert set(counts.values()) == {1}  # ... exactly once
    assert sum(record.cost_nanos for record in ledger) == spent
