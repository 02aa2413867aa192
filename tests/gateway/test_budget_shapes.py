"""The budget invariant for every request shape: 500 concurrent requests through two
gateway servers sharing one Redis spend no more than the limit, whatever form the
prompt takes (token ids, lists of prompts x n, tool schemas, images), with no
max_tokens, and streamed. The fake upstream bills as providers do (structured parts
and tool schemas by size, token ids one each, every prompt x n answers) and honours
the max_tokens it is sent; each accepted request is in the ledger exactly once."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from gateway.billing.tokens import count_prompt
from gateway.ledger import RedisStore
from gateway.limits.budgets import output_of
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import AUTH, StartGateway
from tests.gateway.shared_budget import ledger_until, wait_until_settled

log = logging.getLogger(__name__)  # the figures per shape, for `--log-cli-level=INFO`
REQUESTS = 500
ADMITTED = 120  # the budget has room for about this many worst cases
NANOS_PER_TOKEN = 10_000  # $10 per million tokens, in and out
ROUTE_MAX_OUTPUT = 16  # sent upstream when a request sets no max_tokens
UPSTREAM_TOKENS = 32  # what the fake answers when nothing caps it

TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Look an order up by its id and return its state. " * 20,
        "parameters": {
            "type": "object",
            "properties": {f"field_{i}": {"type": "string"} for i in range(40)},
        },
    },
}
PIXELS = base64.b64encode(bytes(range(256)) * 24).decode()  # a 6 KB inline "image"
IMAGE_PARTS = [
    {"type": "text", "text": "What is in these pictures?"},
    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXELS}"}},
    {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
]


@dataclass(frozen=True)
class Shape:
    endpoint: str  # "chat" or "completions"
    body: dict[str, Any]

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"

    def worst_nanos(self) -> int:
        """What the gateway reserves for one request of this shape."""
        prompt = count_prompt("big-model", self.endpoint, self.body)
        output = output_of(self.endpoint, self.body, ROUTE_MAX_OUTPUT)  # type: ignore[arg-type]
        return (prompt + output.per_choice * output.choices) * NANOS_PER_TOKEN


SHAPES = {
    "token_ids": Shape("completions", {"prompt": list(range(2_000)), "max_tokens": 1}),
    "prompts_x_n": Shape(
        "completions", {"prompt": ["tell me a story"] * 4, "n": 3, "max_tokens": 5}
    ),
    "token_id_lists": Shape("completions", {"prompt": [[7] * 300, [9] * 500], "max_tokens": 2}),
    "tools": Shape(
        "chat",
        {
            "messages": [{"role": "user", "content": "where is order 7?"}],
            "tools": [TOOL] * 3,
            "max_tokens": 5,
        },
    ),
    "images": Shape(
        "chat", {"messages": [{"role": "user", "content": IMAGE_PARTS}], "max_tokens": 5}
    ),
    "no_max_tokens": Shape("chat", {"messages": [{"role": "user", "content": "hi there"}]}),
    "streamed": Shape(
        "chat",
        {"messages": [{"role": "user", "content": "hi there"}], "tools": [TOOL], "stream": True},
    ),
}


def policy(limit_usd: float) -> str:
    # `closed`: the invariant is promised while the limits store answers (see
    # test_budgets_concurrency); `max_output_tokens` is what a request without
    # max_tokens reserves and is sent.
    return f"""
gateway: {{limits_when_redis_down: closed}}
deployments:
  premium:
    api_base: ${{PREMIUM_URL}}
    model: big-model
    tier: premium
    price: {{input_per_mtok: 10, output_per_mtok: 10}}
routes:
  auto: {{deployments: [premium], max_output_tokens: {ROUTE_MAX_OUTPUT}}}
keys:
  k: {{secret: "${{GATEWAY_TEST_KEY}}", team: research}}
teams:
  research: {{}}
budgets:
  - {{scope: team, name: research, period: day, limit_usd: {limit_usd!r}}}
"""


@pytest.mark.parametrize("name", list(SHAPES))
async def test_no_request_shape_overspends_a_shared_budget(
    name: str,
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    ledger_store: RedisStore,
    redis_url: str,
    redis_prefix: str,
) -> None:
    shape = SHAPES[name]
    worst = shape.worst_nanos()
    limit_nanos = worst * ADMITTED
    fake_openai.tokens, fake_openai.delay_s = UPSTREAM_TOKENS, 0.02
    text = policy(limit_nanos / 1e9)
    servers = [start_gateway(text, PREMIUM_URL=fake_openai.url) for _ in range(2)]
    body = {"model": "auto", **shape.body}

    async def send(client: httpx.AsyncClient, i: int) -> tuple[int, str, str]:
        await asyncio.sleep(0 if i % 2 else i / REQUESTS * 1.5)  # bursts, and a trickle
        url = servers[i % 2].url + shape.path
        response = await client.post(url, json=body, headers=AUTH)
        await response.aread()
        code = "" if response.status_code == 200 else response.json()["error"]["code"]
        return response.status_code, code, response.headers.get("x-request-id", "")

    limits = httpx.Limits(max_connections=REQUESTS, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        results = await asyncio.gather(*(send(client, i) for i in range(REQUESTS)))
    accepted = [rid for status, _, rid in results if status == 200]
    refusals = Counter((status, code) for status, code, _ in results if status != 200)
    # Spent (no room left) or busy (room, held by requests in flight): 429s either way.
    assert accepted and refusals, refusals
    assert set(refusals) <= {(429, "budget_exceeded"), (429, "budget_busy")}, refusals

    spent = await asyncio.to_thread(wait_until_settled, redis_url, redis_prefix)
    log.info(
        "%s: %d accepted, %d refused; spent $%.6f of $%.6f (%.1f%%)",
        name,
        len(accepted),
        sum(refusals.values()),
        spent / 1e9,
        limit_nanos / 1e9,
        100 * spent / limit_nanos,
    )
    assert spent <= limit_nanos  # the invariant: admitted only when the worst case fits
    assert spent > limit_nanos / 4  # and the budget was really used, not refused early

    ledger = await ledger_until(ledger_store, len(accepted))
    counts = Counter(record.request_id for record in ledger)
    assert sorted(counts) == sorted(accepted) and set(counts.values()) == {1}
    assert sum(record.cost_nanos for record in ledger) == spent
    # What the fake billed never passed what was reserved: no overrun was counted.
    for server in servers:
        metrics = httpx.get(f"{server.url}/metrics").text
        assert "cascade_budget_overrun_usd_total{" not in metrics
