"""A gateway with teams, keys, budgets and route SLAs, on real Redis behind fake
upstreams, and a ledger filled by real requests through it; and a bare one (no budgets,
no SLA, a route without a reference model) whose ledger holds failed requests."""

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


# No budgets, no SLA, and `plain` has no reference_model: nothing to compare it with.
BARE_POLICY = """
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
  auto: {strategy: fixed, deployments: [cheap], reference_model: premium}
  plain: {strategy: fallback, deployments: [cheap, premium]}
teams:
  research: {}
  ops: {}
keys:
  research-1: {secret: "${KEY_RESEARCH_1}", team: research}
  ops-1: {secret: "${KEY_OPS_1}", team: ops}
admin_keys: ["${GATEWAY_ADMIN_KEY}"]
finance_keys: ["${FINANCE_KEY}"]
"""
BARE_KEYS = {"research-1": "fake-research-1-key", "ops-1": "fake-ops-1-key"}
BARE_REQUESTS = 10  # 3 on `auto`, 7 on `plain` of which REFUSED failed
REFUSED = 4


async def ask(client: httpx.AsyncClient, base: str, key_id: str, route: str) -> httpx.Response:
    body = {"model": route, "messages": [{"role": "user", "content": "word " * 9}]}
    headers = {"authorization": f"Bearer {BARE_KEYS[key_id]}"}
    return await client.post(f"{base}/v1/chat/completions", json=body, headers=headers)


@pytest.fixture
async def bare(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, ledger_store: RedisStore
) -> FilledGateway:
    """A gateway on `BARE_POLICY` whose ledger holds: research's 3 requests on `auto`;
    ops' 7 on `plain`: one that fell back from `cheap` (a 404) to `premium`, two that
    `cheap` answered, and REFUSED the upstream refused (400s: error records)."""
    env = {"FINANCE_KEY": FINANCE_KEY, "KEY_RESEARCH_1": BARE_KEYS["research-1"]}
    server = start_gateway(
        BARE_POLICY, UPSTREAM_BASE_URL=fake_openai.url, KEY_OPS_1=BARE_KEYS["ops-1"], **env
    )
    replies = []
    async with httpx.AsyncClient(timeout=30) as client:
        replies += [await ask(client, server.url, "research-1", "auto") for _ in range(3)]
        fake_openai.fail(404, times=1)  # `cheap` cannot: `premium` answers instead
        replies.append(await ask(client, server.url, "ops-1", "plain"))
        replies += [await ask(client, server.url, "ops-1", "plain") for _ in range(2)]
        fake_openai.fail(400, times=REFUSED)
        replies += [await ask(client, server.url, "ops-1", "plain") for _ in range(REFUSED)]
    assert [r.status_code for r in replies] == [200] * 6 + [400] * REFUSED
    assert replies[3].headers["x-cascade-deployment"] == "premium"
    ids = [reply.headers["x-request-id"] for reply in replies]
    records = [await wait_for_record(ledger_store, request_id) for request_id in ids]
    return FilledGateway(server, records, await ledger_store.events(limit=10_000))
