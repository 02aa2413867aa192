"""A budget's period starts from the ledger's spend in it, not from $0: a budget added
mid-period (a hot reload) is enforced on what its team already spent, as the budget
report shows it. The store's scripts on real Redis, then through the running gateway
over loopback HTTP."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from gateway.auth import Principal
from gateway.billing.tokens import PromptCounts
from gateway.ledger import RedisStore
from gateway.limits import Limiter
from gateway.limits.ledger_spend import LedgerSpend
from gateway.limits.redis_store import RedisLimitStore
from gateway.limits.rules import BudgetRule, Period, RuleBook, periods_at
from gateway.limits.store import Admitted, Ask, BudgetRefusal, Charge
from gateway.metrics import Metrics
from gateway.runtime import build_runtime
from policies import load_policy
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import ADMIN, AUTH, StartGateway, wait_for_record
from tests.gateway.ledger_fixtures import make_record
from tests.support import eventually_async

BUDGET = BudgetRule("team", "research", "day", 1_000_000, None, None)
PERIOD = Period("2031-01-31", time.time() + 86400)


@pytest.fixture
async def store(redis_url: str, redis_prefix: str) -> AsyncIterator[RedisLimitStore]:
    limits = RedisLimitStore(redis_url, redis_prefix)
    yield limits
    await limits.close()


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    connection = aioredis.Redis.from_url(redis_url, decode_responses=True)
    yield connection
    await connection.aclose()


def ask(request_id: str, worst: int, seed: int) -> Ask:
    return Ask(request_id, (), (BUDGET,), (PERIOD,), (worst,), (0,), 0, 60_000, (seed,))


async def test_a_periods_first_admission_starts_from_its_seed(
    store: RedisLimitStore, client: aioredis.Redis
) -> None:
    key = store.budget_key("team", "research", PERIOD.id)
    assert await store.admit(ask("a", 400_000, seed=700_000)) == BudgetRefusal(
        0, 700_000, 400_000, 0
    )
    assert await client.hget(key, "spent") == "700000" and await client.ttl(key) > 0
    # Started: a later seed (a worker that read the ledger later) is not taken again.
    assert isinstance(await store.admit(ask("b", 300_000, seed=950_000)), Admitted)
    assert await store.spent([(BUDGET, PERIOD)]) == [700_000]


async def test_a_period_with_counters_takes_no_seed(store: RedisLimitStore) -> None:
    """Spend settled there (a request served unchecked during an outage) is in its
    counters already: a seed read since may hold it too, so none is taken."""
    unchecked = Charge("u", (), (BUDGET,), (PERIOD,), -1, 0, 200_000)
    await store.settle_many([unchecked])
    assert isinstance(await store.admit(ask("a", 800_000, seed=600_000)), Admitted)
    assert await store.spent([(BUDGET, PERIOD)]) == [200_000]


# --- through the gateway: a budget added by a hot reload ------------------------------

POLICY = """
deployments:
  premium:
    api_base: ${PREMIUM_URL}
    model: big-model
    price: {input_per_mtok: 10, output_per_mtok: 10}
routes:
  auto: {strategy: fixed, deployments: [premium]}
keys:
  k: {secret: "${GATEWAY_TEST_KEY}", team: research}
teams:
  research: {}
admin_keys: ["${GATEWAY_ADMIN_KEY}"]
finance_keys: ["${FINANCE_KEY}"]
"""
FINANCE = {"authorization": "Bearer fake-finance-key"}


def with_budget(limit_usd: float) -> str:
    budget = f"  - {{scope: team, name: research, period: day, limit_usd: {limit_usd}}}\n"
    return f"{POLICY}budgets:\n{budget}"


@pytest.fixture
async def spent_before(redis_url: str, redis_prefix: str) -> int:
    """What team research spent today before its budget existed, in the ledger."""
    ledger = RedisStore(redis_url, prefix=redis_prefix)
    now = time.time()
    records = [
        make_record(i, ts=now, team="research", cost_nanos=300_000_000, status="ok") for i in (1, 2)
    ]
    await ledger.record_many(records)
    await ledger.close()
    return 600_000_000


def served(tmp_path: Path, start_gateway: StartGateway, premium: FakeOpenAI) -> str:
    """A gateway on POLICY (no budget), then its policy file given a $1 daily budget and
    reloaded: the budget appears mid-period."""
    base = start_gateway(POLICY, PREMIUM_URL=premium.url, FINANCE_KEY="fake-finance-key").url
    (tmp_path / "policy-0.yaml").write_text(with_budget(1.0))
    reply = httpx.post(f"{base}/admin/reload", headers=ADMIN, timeout=10)
    assert reply.status_code == 200, reply.text
    return base


def chat(base: str, max_tokens: int) -> httpx.Response:
    body: dict[str, Any] = {
        "model": "auto",
        "messages": [{"role": "user", "content": "hi there"}],
        "max_tokens": max_tokens,
    }
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)


def budget_row(base: str) -> dict[str, Any]:
    reply = httpx.get(f"{base}/v1/spend/budgets", headers=FINANCE, timeout=10)
    assert reply.status_code == 200, reply.text
    [row] = reply.json()["data"]
    return dict(row)


async def test_a_budget_added_mid_period_is_enforced_on_the_periods_spend(
    tmp_path: Path,
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    spent_before: int,
    redis_url: str,
    redis_prefix: str,
) -> None:
    """$0.60 spent before the $1 budget appeared: a request that may cost $0.50 more is
    refused (from $0 it was admitted, and the team spent 110%); a smaller one fits."""
    base = served(tmp_path, start_gateway, fake_openai)
    refused = chat(base, max_tokens=50_000)  # $10 a million tokens: $0.50 of output
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "budget_exceeded"
    assert "$0.60 of $1.00 is spent or reserved" in refused.json()["error"]["message"]
    assert fake_openai.requests == []
    answered = chat(base, max_tokens=10)
    assert answered.status_code == 200, answered.text
    ledger = RedisStore(redis_url, prefix=redis_prefix)
    record = await wait_for_record(ledger, answered.headers["x-request-id"])
    await ledger.close()
    total = spent_before + record.cost_nanos
    period = periods_at(time.time())["day"].id
    key = f"{redis_prefix}{{limits}}:budget:team:research:{period}"
    limits = aioredis.Redis.from_url(redis_url, decode_responses=True)

    async def settled() -> bool:
        return bool(await limits.hget(key, "spent") == str(total))

    try:
        await eventually_async(settled, 5, "the request's settlement")
    finally:
        await limits.aclose()
    # The report (the ledger's period) and the enforcement (the counters) agree.
    assert budget_row(base)["spent_nanos"] == total


async def test_each_worker_reads_the_ledger_once_per_budget_and_period(
    tmp_path: Path, store: RedisLimitStore, redis_url: str, redis_prefix: str, spent_before: int
) -> None:
    """The first admission reads the ledger; the rest of the period offers no seed."""
    reads: list[str] = []
    ledger = RedisStore(redis_url, prefix=redis_prefix)
    read = LedgerSpend(ledger)

    async def counted(budget: BudgetRule, period: Period) -> int | None:
        reads.append(period.id)
        return await read(budget, period)

    path = tmp_path / "policy.yaml"
    path.write_text(with_budget(1.0).replace("${PREMIUM_URL}", "http://127.0.0.1:9/v1"))
    runtime = build_runtime(load_policy(path, env={}))
    limiter = Limiter(store, Metrics(), ledger_spend=counted)
    principal, route = Principal("k", "research", None), runtime.routes["auto"]
    candidates = [runtime.deployments["premium"]]
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}

    async def admit(n: int) -> None:
        admission = await limiter.admit(
            runtime, principal, route, "chat", body, candidates, "fixed", f"r{n}", PromptCounts()
        )
        admission.settle([])

    for n in range(3):
        await admit(n)
    await limiter.stop()
    await ledger.close()
    today = periods_at(time.time())["day"]
    assert reads == [today.id]
    [rule] = RuleBook.build(runtime.policy).budgets["team", "research"]
    assert await store.spent([(rule, today)]) == [spent_before]  # the seed, then $0 each


def test_a_period_is_read_from_its_first_day_to_its_last() -> None:
    """Periods are read whole from the ledger: a day's from itself, a month's from its
    first day to its last (days yet to come hold nothing)."""
    moment = datetime(2031, 1, 31, 23, 59, tzinfo=UTC).timestamp()
    periods = periods_at(moment)
    assert (periods["day"].first_day.isoformat(), periods["day"].last_day.isoformat()) == (
        "2031-01-31",
        "2031-01-31",
    )
    month = periods["month"]
    assert (month.first_day.isoformat(), month.last_day.isoformat()) == ("2031-01-01", "2031-01-31")
