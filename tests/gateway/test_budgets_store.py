"""The limits store's scripts on real Redis, and the arithmetic around them: expired
holds, exactly-once settlement, token corrections across a window change, amounts
past Lua's number formatting, worst cases, rate-limit waits and refusal messages,
and a hung Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.limits.budgets import Output, budget_exceeded, capped_body, dollars, output_of
from gateway.limits.rate_limits import rate_limited, wait_s
from gateway.limits.redis_store import RedisLimitStore
from gateway.limits.rules import BudgetRule, Period, RateRule, periods_at
from gateway.limits.scripts import AMOUNT_CAP
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


async def test_a_spent_budget_is_named_before_a_busy_one(store: RedisLimitStore) -> None:
    """The team's budget is full of a request in flight (busy), the key's is spent: the
    refusal names the key's, whose clients must wait for its period's end, not retry."""
    key = BudgetRule("key", "k1", "day", 500_000, None, None)
    await store.settle_many([Charge("old", (), (key,), (PERIOD,), -1, 0, 500_000)])
    assert isinstance(await store.admit(ask("inflight", 900_000)), Admitted)
    both = Ask("new", (), (BUDGET, key), (PERIOD, PERIOD), (200_000,), (0, 0), 0, 60_000)
    refused = await store.admit(both)
    assert isinstance(refused, BudgetRefusal) and refused.rule == 1 and not refused.busy
    error = budget_exceeded(key, PERIOD, refused, time.time())
    assert error.code == "budget_exceeded" and error.headers["x-should-retry"] == "false"


async def test_holds_of_dead_workers_expire(store: RedisLimitStore, client: aioredis.Redis) -> None:
    key = store.budget_key("team", "research", PERIOD.id)
    assert isinstance(await store.admit(ask("dead", 600_000, hold_ms=1)), Admitted)
    time.sleep(0.01)  # the worker holding "dead" never settles
    assert isinstance(await store.admit(ask("alive", 600_000)), Admitted)
    assert await client.hget(key, "reserved") == "600000"
    assert await client.zrange(key + ":held", 0, -1) == ["alive"]
    refused = await store.admit(ask("third", 600_000))
    # Held by `alive` in flight, not spent: what the refusal says, for its retry.
    assert refused == BudgetRefusal(0, 600_000, 600_000, 0, 0, 1_000_000)
    assert refused.busy


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
    error = budget_exceeded(tiny, PERIOD, BudgetRefusal(0, 250_000, 70_000, 0), time.time())
    assert "$0.00025 of $0.0003 is spent or reserved" in error.message
    assert "may cost up to $0.00007 ($0.00005 left)" in error.message


def test_output_covers_every_choice() -> None:
    assert output_of("chat", {"max_tokens": 7}, 4096) == Output(7, 1)
    assert output_of("chat", {"max_completion_tokens": 9, "max_tokens": 7}, 4096) == Output(9, 1)
    assert output_of("chat", {"n": 3}, 100) == Output(100, 3)
    assert output_of("embeddings", {"max_tokens": 7}, 4096) == Output(0, 0)
    # A completion is billed for every prompt, and for best_of answers where above n.
    prompts = {"prompt": ["a", "b", "c"], "n": 2, "max_tokens": 5}
    assert output_of("completions", prompts, 4096) == Output(5, 6)
    assert output_of("completions", {**prompts, "best_of": 4}, 4096) == Output(5, 12)
    assert output_of("completions", {"prompt": [[1, 2], [3]], "max_tokens": 5}, 9) == Output(5, 2)
    assert output_of("completions", {"prompt": [1, 2, 3]}, 9) == Output(9, 1)


def test_capped_body_asks_for_no_more_than_was_reserved() -> None:
    assert capped_body("chat", {"messages": []}, 64) == {
        "messages": [],
        "max_completion_tokens": 64,
    }
    assert capped_body("completions", {"prompt": "x"}, 64) == {"prompt": "x", "max_tokens": 64}
    both = {"max_tokens": 1000, "max_completion_tokens": 5}
    assert capped_body("chat", both, 5) == {"max_tokens": 5, "max_completion_tokens": 5}
    asked = {"max_tokens": 7}
    assert capped_body("chat", asked, 7) is asked  # already within: the same body
    assert capped_body("embeddings", {"input": "x"}, 7) == {"input": "x"}


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


async def test_huge_amounts_are_clamped_not_overflowed(
    store: RedisLimitStore, client: aioredis.Redis
) -> None:
    """Amounts past int64 (2^63 - 1 tokens) are clamped as the scripts read them: the
    counters stay numbers HINCRBY takes, and the settlement is not lost."""
    huge = 2**63 - 1
    rich = BudgetRule("team", "research", "day", huge, None, None)
    verdict = await store.admit(ask("h1", huge, budget=rich, rates=(RATE,), tokens=huge))
    assert isinstance(verdict, RateRefusal)  # the clamped count is still over 10,000 tpm
    unlimited = RateRule("key", "k", None, None)
    verdict = await store.admit(ask("h1", huge, budget=rich, rates=(unlimited,), tokens=huge))
    assert isinstance(verdict, Admitted)
    key = store.budget_key("team", "research", PERIOD.id)
    assert await client.hget(key, "reserved") == str(AMOUNT_CAP)
    for i in range(3):  # each settlement adds the cap; three would overflow unclamped
        settled = await store.settle_many(
            [
                charge(
                    f"s{i}",
                    huge,
                    budget=rich,
                    rates=(unlimited,),
                    window=verdict.window,
                    token_delta=huge,
                )
            ]
        )
        assert settled[0] is not None
    assert await client.hget(key, "spent") == str(3 * AMOUNT_CAP)
    assert int(await client.hget(store.rate_key("key", "k"), "t")) == 4 * AMOUNT_CAP


async def test_a_busy_redis_is_waited_for_not_taken_for_down(store: RedisLimitStore) -> None:
    """A call queued behind others that Redis keeps answering (a burst, a busy loop) is
    no outage: it waits past the silence timeout (0.5 s), up to the busy one. Without
    answers to anyone, the same wait fails at the silence timeout."""

    async def chatter() -> None:  # other calls of the store keep being answered
        for _ in range(16):
            await asyncio.sleep(0.05)
            await store.spent([(BUDGET, PERIOD)])

    await store.probe()
    talk = asyncio.create_task(chatter())
    assert await store._patiently(asyncio.sleep(0.8, result="late")) == "late"
    await talk
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await store._patiently(asyncio.sleep(0.8))
    assert 0.45 < time.monotonic() - started < 0.75
