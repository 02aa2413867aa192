"""The limits store's scripts on real Redis, and the arithmetic around them: expired
holds, exactly-once settlement, token corrections across a window change, amounts
past Lua's number formatting, worst cases, rate-limit waits and refusal messages,
and a hung Redis."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.limits.budgets import budget_exceeded, dollars, output_tokens
from gateway.limits.rate_limits import rate_limited, wait_s
from gateway.limits.redis_store import RedisLimitStore
from gateway.limits.rules import BudgetRule, Period, RateRule, periods_at
from gateway.limits.store import (
    Admitted,
    Ask,
    BudgetRefusal,
    Charge,
    LimitsStoreUnavailable,
    RateRefusal,
)
from tests.gateway.ledger_fixtures import RedisServer

BUDGET = BudgetRule("team", "research", "day", 1_000_000, None, None)
PERIOD = Period("2031-01-31", time.time() + 86400)
RATE = RateRule("key", "k", 100, 10_000)


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


def ask(request_id: str, worst: int, budget: BudgetRule = BUDGET, **kw: Any) -> Ask:
    fields: dict[str, Any] = {
        "rates": (),
        "budgets": (budget,),
        "periods": (PERIOD,),
        "options": (worst,),
        "downgrades": (0,),
        "tokens": 0,
        "hold_ms": 60_000,
    }
    fields.update(kw)
    return Ask(request_id, **fields)


def charge(request_id: str, cost: int, budget: BudgetRule = BUDGET, **kw: Any) -> Charge:
    fields: dict[str, Any] = {"rates": (), "window": -1, "token_delta": 0}
    fields.update(kw)
    return Charge(request_id, budgets=(budget,), periods=(PERIOD,), cost_nanos=cost, **fields)


async def test_holds_of_dead_workers_expire(store: RedisLimitStore, client: aioredis.Redis) -> None:
    key = store.budget_key("team", "research", PERIOD.id)
    assert isinstance(await store.admit(ask("dead", 600_000, hold_ms=1)), Admitted)
    time.sleep(0.01)  # the worker holding "dead" never settles
    assert isinstance(await store.admit(ask("alive", 600_000)), Admitted)
    assert await client.hget(key, "reserved") == "600000"
    assert await client.zrange(key + ":held", 0, -1) == ["alive"]
    refused = await store.admit(ask("third", 600_000))
    assert refused == BudgetRefusal(0, 600_000, 600_000, 0)


async def test_a_settlement_counts_once(store: RedisLimitStore, client: aioredis.Redis) -> None:
    await store.admit(ask("r1", 500_000))
    first, again = await store.settle_many([charge("r1", 123_456), charge("r1", 123_456)])
    assert first is not None and (first[0].spent_nanos, first[0].reserved_nanos) == (123_456, 0)
    assert again is None
    key = store.budget_key("team", "research", PERIOD.id)
    assert await client.hmget(key, "spent", "reserved", "h:r1") == ["123456", "0", None]


async def test_amounts_beyond_fourteen_digits_stay_exact(
    store: RedisLimitStore, client: aioredis.Redis
) -> None:
    big = BudgetRule("team", "research", "day", 900_000_000_000_000, None, None)  # $900k
    worst, cost = 123_456_789_012_345, 98_765_432_109_876
    assert isinstance(await store.admit(ask("big", worst, budget=big)), Admitted)
    key = store.budget_key("team", "research", PERIOD.id)
    assert await client.hget(key, "reserved") == str(worst)
    await store.settle_many([charge("big", cost, budget=big)])
    assert await client.hmget(key, "spent", "reserved") == [str(cost), "0"]


async def test_a_token_correction_follows_its_window(
    store: RedisLimitStore, client: aioredis.Redis
) -> None:
    verdict = await store.admit(ask("t1", 0, rates=(RATE,), tokens=500))
    assert isinstance(verdict, Admitted)
    assert verdict.remaining == ((99, 9_500),)
    rate_key = store.rate_key("key", "k")
    await client.hset(rate_key, mapping={"w": verdict.window + 1, "pt": 500, "t": 0})
    await store.settle_many(
        [charge("t1", 0, rates=(RATE,), window=verdict.window, token_delta=-480)]
    )
    assert await client.hmget(rate_key, "pt", "t") == ["20", "0"]  # the minute it was counted in


async def test_the_first_refusal_is_the_rate_limit(store: RedisLimitStore) -> None:
    tight = RateRule("key", "k", 1, None)
    assert isinstance(await store.admit(ask("a", 0, rates=(tight,))), Admitted)
    refused = await store.admit(ask("b", 2_000_000, rates=(tight,)))  # over budget too
    assert isinstance(refused, RateRefusal) and (refused.kind, refused.current) == ("requests", 1)


@pytest.mark.parametrize(
    ("previous", "current", "elapsed_ms", "cost", "limit", "expected"),
    [
        (0, 10, 30_000, 1, 10, 30 + 6),  # full now; next minute 10 weighs 0.9 at 6 s
        (10, 0, 0, 1, 10, 6),  # the previous minute fades: 10 * (1 - f) <= 9 at 6 s
    ],
)
def test_rate_limit_waits(
    previous: int, current: int, elapsed_ms: int, cost: int, limit: int, expected: float
) -> None:
    refusal = RateRefusal(0, "requests", previous, current, elapsed_ms)
    assert wait_s(refusal, cost, limit) == pytest.approx(expected)


def test_a_refusal_says_whether_waiting_helps() -> None:
    tight = RateRule("key", "k", 100, 300)
    later = rate_limited(tight, RateRefusal(0, "tokens", 0, 200, 30_000), 150)
    assert later.headers["retry-after"] == "45"  # next minute: 200 * (1 - f) + 150 <= 300
    assert "x-should-retry" not in later.headers
    never = rate_limited(tight, RateRefusal(0, "tokens", 0, 0, 0), 4107)
    assert "retry-after" not in never.headers
    assert never.headers["x-should-retry"] == "false"
    assert "request too large for key 'k': it counts 4107 tokens" in never.message
    assert "the key's limit of 300 tokens per minute" in never.message


@pytest.mark.parametrize(
    ("nanos", "text"),
    [
        (0, "$0.00"),
        (12_500_000_000, "$12.50"),
        (500_000_000_000, "$500.00"),
        (1_234_567_800_000, "$1234.57"),
        (12_345_600_000, "$12.3456"),
        (300_000, "$0.0003"),
        (123_456_789, "$0.123457"),
        (1, "$0.000000001"),
    ],
)
def test_dollar_amounts_keep_small_ones_readable(nanos: int, text: str) -> None:
    assert dollars(nanos) == text


def test_a_small_budget_is_not_rounded_to_cents() -> None:
    tiny = BudgetRule("key", "k", "day", 300_000, None, None)  # $0.0003
    error = budget_exceeded(tiny, PERIOD, 250_000, 70_000, time.time())
    assert "$0.00025 of $0.0003 is spent or reserved" in error.message
    assert "may cost up to $0.00007 ($0.00005 left)" in error.message


def test_output_tokens_cover_every_choice() -> None:
    assert output_tokens("chat", {"max_tokens": 7}, 4096) == 7
    assert output_tokens("chat", {"max_completion_tokens": 9, "max_tokens": 7}, 4096) == 9
    assert output_tokens("chat", {"n": 3}, 100) == 300
    assert output_tokens("embeddings", {"max_tokens": 7}, 4096) == 0


def test_periods_are_utc_days_and_months() -> None:
    periods = periods_at(datetime(2030, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp())
    assert (periods["day"].id, periods["day"].ends_iso) == ("2030-12-31", "2031-01-01T00:00:00Z")
    assert (periods["month"].id, periods["month"].ends_iso) == ("2030-12", "2031-01-01T00:00:00Z")


async def test_a_charge_redis_refuses_is_dropped_alone(
    store: RedisLimitStore, client: aioredis.Redis
) -> None:
    """A script error for one charge (here its budget key holds the wrong type) must not
    hold the others, nor the queue, behind it: it is logged and dropped."""
    broken = BudgetRule("team", "broken", "day", 1_000_000, None, None)
    await client.set(store.budget_key("team", "broken", PERIOD.id), "not a hash")
    await store.admit(ask("ok", 500_000))
    bad, good = await store.settle_many([charge("bad", 1, broken), charge("ok", 42)])
    assert bad is None
    assert good is not None and good[0].spent_nanos == 42


async def test_a_passing_refusal_keeps_the_batch_for_later(redis_server: RedisServer) -> None:
    """OOM (like LOADING or READONLY) means "not now": the whole batch is sent again later."""
    limits = RedisLimitStore(redis_server.url, "cgtest-oom:")
    admin = aioredis.Redis.from_url(redis_server.url)
    try:
        await admin.config_set("maxmemory", "1")
        await admin.config_set("maxmemory-policy", "noeviction")
        with pytest.raises(LimitsStoreUnavailable):
            await limits.settle_many([charge("r1", 7)])
    finally:
        await limits.close()
        await admin.aclose()


async def test_a_hung_redis_fails_within_one_timeout(redis_server: RedisServer) -> None:
    """SIGSTOP: the connection opens but nothing answers. No retry doubles the wait."""
    limits = RedisLimitStore(redis_server.url, "cgtest-hung:", socket_timeout=0.3)
    try:
        await limits.probe()
        redis_server.pause()
        for call in (lambda: limits.admit(ask("r1", 1)), limits.probe):
            started = time.monotonic()
            with pytest.raises(LimitsStoreUnavailable):
                await call()
            assert time.monotonic() - started < 0.55
        redis_server.resume()
        await limits.probe()
    finally:
        redis_server.resume()
        await limits.close()
