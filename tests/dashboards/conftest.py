"""A gateway with teams, keys, budgets and route SLAs, on real Redis behind fake
upstreams, and a ledger filled by real requests through it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx
import pytest

from gateway.ledger import RedisStore, SpendRecord
from tests.fakes.fixtures import fake_openai
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import (
    ADMIN_KEY,
    StartGateway,
    ledger_store,
    redis_prefix,
    start_gateway,
    wait_for_record,
)
from tests.gateway.server import GatewayServer

__all__ = ["fake_openai", "ledger_store", "redis_prefix", "start_gateway"]

FINANCE_KEY = "fake-finance-key"
CLIENT_KEYS = {  # key id -> (secret, team)
    "research-1": ("fake-research-1-key", "research"),
    "research-2": ("fake-research-2-key", "research"),
    "sales-1": ("fake-sales-1-key", "sales"),
}
ENV = {
    "FINANCE_KEY": FINANCE_KEY,
    **{f"KEY_{key_id.replace('-', '_').upper()}": s for key_id, (s, _) in CLIENT_KEYS.items()},
}

POLICY = """
deployments:
  cheap:
    api_base: ${UPSTREAM_BASE_URL}
    model: small-model
    tier: cheap
    price: {input_per_mtok: 0.15, output_per_mtok: 0.60}
  premium:
    api_base: ${UPSTREAM_BASE_URL}
    model: big-model
    tier: premium
    price: {input_per_mtok: 2.5, output_per_mtok: 10.0}
routes:
  auto:
    strategy: fallback
    deployments: [cheap, premium]
    reference_model: premium
    sla: {ttft_ms: 20000, timeout_ms: 60000, load_aware: false}
  strong:
    strategy: fixed
    deployments: [premium]
    reference_model: premium
  strict:
    strategy: fixed
    deployments: [cheap]
    reference_model: premium
    sla: {ttft_ms: 1, load_aware: false}
teams:
  research: {}
  sales: {}
keys:
  research-1: {secret: "${KEY_RESEARCH_1}", team: research}
  research-2: {secret: "${KEY_RESEARCH_2}", team: research}
  sales-1: {secret: "${KEY_SALES_1}", team: sales}
admin_keys: ["${GATEWAY_ADMIN_KEY}"]
finance_keys: ["${FINANCE_KEY}"]
budgets:
  - {scope: team, name: research, period: month, limit_usd: 100, soft_limit_usd: 0.000001}
  - {scope: key, name: sales-1, period: day, limit_usd: 100}
  - {scope: route, name: auto, period: month, limit_usd: 50, soft_limit_usd: 40}
"""

# (key id, route, words in the prompt, stream): a mix over teams, tiers and models.
TRAFFIC = [
    (key_id, route, 3 + 7 * i % 23, i % 3 == 0)
    for i, (key_id, route) in enumerate(
        [
            ("research-1", "auto"),
            ("research-1", "strong"),
            ("research-2", "auto"),
            ("sales-1", "auto"),
            ("sales-1", "strict"),
            ("research-2", "strong"),
        ]
        * 4
    )
]


@dataclass
class FilledGateway:
    server: GatewayServer
    records: list[SpendRecord]  # each request's record, read by its id
    events: list[SpendRecord]  # the ledger's events stream

    @property
    def url(self) -> str:
        return self.server.url


async def send(
    client: httpx.AsyncClient, base: str, key_id: str, route: str, words: int, stream: bool
) -> str:
    body: dict[str, object] = {
        "model": route,
        "messages": [{"role": "user", "content": "word " * words}],
    }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    secret = CLIENT_KEYS[key_id][0]
    reply = await client.post(
        f"{base}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {secret}"}
    )
    assert reply.status_code == 200, reply.text
    return reply.headers["x-request-id"]


@pytest.fixture
async def filled(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, ledger_store: RedisStore
) -> FilledGateway:
    """A gateway whose ledger holds the records of `TRAFFIC`, sent through it."""
    server = start_gateway(POLICY, UPSTREAM_BASE_URL=fake_openai.url, **ENV)
    async with httpx.AsyncClient(timeout=30) as client:
        ids = await asyncio.gather(*(send(client, server.url, *row) for row in TRAFFIC))
    records = [await wait_for_record(ledger_store, request_id) for request_id in ids]
    return FilledGateway(server, records, await ledger_store.events(limit=10_000))


def finance_headers(key: str = FINANCE_KEY) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


ADMIN_HEADERS = finance_headers(ADMIN_KEY)
