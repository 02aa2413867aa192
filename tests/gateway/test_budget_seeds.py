"""A budget's period starts from the ledger's spend in it, not from $0: a budget added
mid-period (a hot reload) is enforced on what its team already spent, as the budget
report shows it. The store's scripts on real Redis, then through the running gateway
over loopback HTTP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
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
from gateway.limits.seeds import FRESH_S
from gateway.limits.store import Admitted, Ask, BudgetRefusal, Charge
from gateway.metrics import Metrics
from gateway.runtime import Runtime, build_runtime
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
        0, 700_000, 400_000, 0, spent_nanos=700_000, limit_nanos=1_000_000
    )
    assert await client.hget(key, "spent") == "700000" and await client.ttl(key) > 0
    # Started: a later seed (a worker that read the ledger later) is not taken again.
    assert isinstance(await store.admit(ask("b", 300_000, seed=950_000)), Admitted)
    assert await store.spent([(BUDGET, PERIOD)]) == [700_000]


async def test_counters_without_a_seed_take_the_larger_once(store: RedisLimitStore) -> None:
    """Spend settled there (a request served unchecked during an outage) is in the
    ledger too: a seed read since holds it, so the larger is kept, not the sum; and
    once seeded, the counters take no other seed."""
    unchecked = Charge("u", (), (BUDGET,), (PERIOD,), -1, 0, 200_000)
    await store.settle_many([unchecked])
    unseeded = await store.admit(ask("a", 100_000, seed=-1))
    assert isinstance(unseeded, Admitted) and unseeded.unseeded == (True,)
    seeded = await store.admit(ask("b", 100_000, seed=600_000))
    assert isinstance(seeded, Admitted) and seeded.unseeded == ()
    await store.admit(ask("c", 100_000, seed=900_000))
    assert await store.spent([(BUDGET, PERIOD)]) == [600_000]


async def test_a_smaller_seed_keeps_what_the_counters_hold(store: RedisLimitStore) -> None:
    settled = Charge("u", (), (BUDGET,), (PERIOD,), -1, 0, 300_000)
    await store.settle_many([settled])
    await store.admit(ask("a", 100_000, seed=250_000))
    assert await store.spent([(BUDGET, PERIOD)]) == [300_000]


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


# --- one worker's reads: the limiter on real Redis ------------------------------------

KEY_BUDGETS = """
deployments:
  premium:
    api_base: http://127.0.0.1:9/v1
    model: big-model
    price: {input_per_mtok: 10, output_per_mtok: 10}
routes:
  auto: {strategy: fixed, deployments: [premium]}
keys:
  k: {secret: "${K_SECRET}", team: research}
  j: {secret: "${J_SECRET}", team: research}
teams:
  research: {}
budgets:
  - {scope: key, name: k, period: month, limit_usd: 1}
  - {scope: key, name: j, period: month, limit_usd: 1}
"""
BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}


class CountedReads:
    """A spend reader that counts its reads; `gate`, while clear, holds them."""

    def __init__(self, read: Callable[[str, Period], Any]) -> None:
        self.reads: list[tuple[str, str]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self._read = read

    async def __call__(self, scope: str, period: Period) -> Mapping[str, int] | None:
        self.reads.append((scope, period.id))
        await self.gate.wait()
        spend: Mapping[str, int] | None = await self._read(scope, period)
        return spend


def runtime_of(tmp_path: Path, policy: str) -> Runtime:
    path = tmp_path / "limits-policy.yaml"
    path.write_text(policy)
    env = {"K_SECRET": "fake-key-k", "J_SECRET": "fake-key-j"}
    return build_runtime(load_policy(path, env=env))


async def admit(limiter: Limiter, runtime: Runtime, key: str, request_id: str) -> None:
    """One request of `key`, admitted and settled at $0."""
    admission = await limiter.admit(
        runtime,
        Principal(key, "research", None),
        runtime.routes["auto"],
        "chat",
        BODY,
        [runtime.deployments["premium"]],
        "fixed",
        request_id,
        PromptCounts(),
    )
    admission.settle([])


async def test_each_worker_reads_the_ledger_once_per_budget_and_period(
    tmp_path: Path, store: RedisLimitStore, redis_url: str, redis_prefix: str, spent_before: int
) -> None:
    """The first admission reads the ledger; the rest of the period offers no seed."""
    ledger = RedisStore(redis_url, prefix=redis_prefix)
    counted = CountedReads(LedgerSpend(ledger))
    runtime = runtime_of(
        tmp_path, with_budget(1.0).replace("${PREMIUM_URL}", "http://127.0.0.1:9/v1")
    )
    limiter = Limiter(store, Metrics(), ledger_spend=counted)
    for n in range(3):
        await admit(limiter, runtime, "k", f"r{n}")
    await limiter.stop()
    await ledger.close()
    today = periods_at(time.time())["day"]
    assert counted.reads == [("team", today.id)]
    [rule] = RuleBook.build(runtime.policy).budgets["team", "research"]
    assert await store.spent([(rule, today)]) == [spent_before]  # the seed, then $0 each


async def test_concurrent_first_admissions_of_a_scope_share_one_read(
    tmp_path: Path, store: RedisLimitStore, redis_url: str, redis_prefix: str
) -> None:
    """50 first requests of two keys arriving while the ledger is read wait on one read
    of scope `key`, which seeds both keys' budgets."""
    ledger = RedisStore(redis_url, prefix=redis_prefix)
    now = time.time()
    await ledger.record_many(
        [
            make_record(1, ts=now, key="k", cost_nanos=300_000_000, status="ok"),
            make_record(2, ts=now, key="j", cost_nanos=100_000_000, status="ok"),
        ]
    )
    counted = CountedReads(LedgerSpend(ledger))
    counted.gate.clear()
    runtime = runtime_of(tmp_path, KEY_BUDGETS)
    limiter = Limiter(store, Metrics(), ledger_spend=counted)
    requests = [
        asyncio.create_task(admit(limiter, runtime, "kj"[n % 2], f"r{n}")) for n in range(50)
    ]
    await asyncio.sleep(0.05)
    counted.gate.set()
    await asyncio.gather(*requests)
    await limiter.stop()
    await ledger.close()
    month = periods_at(now)["month"]
    assert counted.reads == [("key", month.id)]
    rules = RuleBook.build(runtime.policy).budgets
    pairs = [(rules["key", name][0], month) for name in ("k", "j")]
    assert await store.spent(pairs) == [300_000_000, 100_000_000]


def fixed_clock(at: list[float]) -> Callable[[], float]:
    return lambda: at[0]


async def test_a_month_is_read_once_across_its_days_and_again_in_the_next(
    tmp_path: Path, store: RedisLimitStore
) -> None:
    async def nothing_spent(scope: str, period: Period) -> Mapping[str, int] | None:
        return {}

    counted = CountedReads(nothing_spent)
    at = [datetime(2031, 1, 30, 23, 0, tzinfo=UTC).timestamp()]
    limiter = Limiter(store, Metrics(), clock=fixed_clock(at), ledger_spend=counted)
    runtime = runtime_of(tmp_path, KEY_BUDGETS)
    await admit(limiter, runtime, "k", "r1")
    at[0] += 2 * 3600  # the 31st: a new day, the same month
    await admit(limiter, runtime, "k", "r2")
    at[0] += 24 * 3600  # February
    await admit(limiter, runtime, "k", "r3")
    await limiter.stop()
    assert counted.reads == [("key", "2031-01"), ("key", "2031-02")]


async def test_a_budget_first_admitted_later_is_seeded_from_a_fresh_read(
    tmp_path: Path, store: RedisLimitStore
) -> None:
    """A read serves the budgets of its scope for `FRESH_S` only: key j, first admitted a
    day after key k's read, starts from what the ledger says then, not from that read."""
    spend = {"k": 0, "j": 0}

    async def ledger_now(scope: str, period: Period) -> Mapping[str, int] | None:
        return dict(spend)

    counted = CountedReads(ledger_now)
    at = [datetime(2031, 1, 10, 12, 0, tzinfo=UTC).timestamp()]
    limiter = Limiter(store, Metrics(), clock=fixed_clock(at), ledger_spend=counted)
    runtime = runtime_of(tmp_path, KEY_BUDGETS)
    await admit(limiter, runtime, "k", "r1")
    spend["j"] = 950_000_000  # j spends while its budget's counters do not exist yet
    at[0] += 24 * 3600
    await admit(limiter, runtime, "j", "r2")
    await limiter.stop()
    assert counted.reads == [("key", "2031-01"), ("key", "2031-01")]
    month = periods_at(at[0])["month"]
    [rule] = RuleBook.build(runtime.policy).budgets["key", "j"]
    assert await store.spent([(rule, month)]) == [950_000_000]


async def test_a_failed_read_is_retried_and_its_seed_still_taken(
    tmp_path: Path, store: RedisLimitStore
) -> None:
    """The ledger unreadable at the period's first admission: admissions go on without
    a seed, and one `FRESH_S` later reads it again and seeds the counters after all."""
    answers: list[Mapping[str, int] | None] = [None, {"k": 400_000_000}]

    async def flaky(scope: str, period: Period) -> Mapping[str, int] | None:
        return answers.pop(0)

    counted = CountedReads(flaky)
    at = [time.time()]
    limiter = Limiter(store, Metrics(), clock=fixed_clock(at), ledger_spend=counted)
    runtime = runtime_of(tmp_path, KEY_BUDGETS)
    month = periods_at(at[0])["month"]
    [rule] = RuleBook.build(runtime.policy).budgets["key", "k"]
    await admit(limiter, runtime, "k", "r1")
    at[0] += FRESH_S / 2
    await admit(limiter, runtime, "k", "r2")
    assert len(counted.reads) == 1
    at[0] += FRESH_S / 2
    await admit(limiter, runtime, "k", "r3")
    await admit(limiter, runtime, "k", "r4")
    await limiter.stop()
    assert len(counted.reads) == 2
    assert await store.spent([(rule, month)]) == [400_000_000]


async def test_lost_counters_are_seeded_again(
    tmp_path: Path, store: RedisLimitStore, client: aioredis.Redis
) -> None:
    """Counters lost mid-period (Redis flushed) are created again without a seed; the
    admission says so, and the worker reads the ledger and seeds them again."""

    async def spent(scope: str, period: Period) -> Mapping[str, int] | None:
        return {"k": 500_000_000}

    counted = CountedReads(spent)
    limiter = Limiter(store, Metrics(), ledger_spend=counted)
    runtime = runtime_of(tmp_path, KEY_BUDGETS)
    month = periods_at(time.time())["month"]
    [rule] = RuleBook.build(runtime.policy).budgets["key", "k"]
    await admit(limiter, runtime, "k", "r1")
    key = store.budget_key("key", "k", month.id)

    async def released() -> bool:
        return bool(await client.hget(key, "reserved") == "0")

    await eventually_async(released, 5, "r1's settlement")
    await client.delete(key, key + ":held")
    await admit(limiter, runtime, "k", "r2")  # finds them gone: created from $0
    await admit(limiter, runtime, "k", "r3")  # offers the seed read again
    await limiter.stop()
    assert len(counted.reads) == 2
    assert await store.spent([(rule, month)]) == [500_000_000]


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
