"""Circuit breakers: transitions, half-open probes, and ejections shared through real
Redis between two workers' breaker sets."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from gateway.breaker import BreakerSettings, CircuitBreakers
from gateway.upstreams.base import UpstreamConnectFailed, UpstreamStatus

BROKEN = UpstreamStatus("boom", status=500)
BUSY = UpstreamStatus("queue full", status=503)


def test_opens_after_consecutive_failures_only() -> None:
    breakers = CircuitBreakers(BreakerSettings(failure_threshold=3, cooldown_s=30))
    breakers.record_failure("a", BROKEN)
    breakers.record_failure("a", BROKEN)
    breakers.record_success("a")  # the streak is broken
    breakers.record_failure("a", BROKEN)
    breakers.record_failure("a", UpstreamConnectFailed("refused"))
    assert breakers.state("a") == "closed"
    breakers.record_failure("a", BROKEN)
    assert breakers.state("a") == "open" and not breakers.allows("a")


def test_busy_answers_do_not_trip_it() -> None:
    breakers = CircuitBreakers(BreakerSettings(failure_threshold=1))
    breakers.record_failure("a", BUSY)
    breakers.record_failure("a", UpstreamStatus("slow down", status=429))
    assert breakers.state("a") == "closed"


def test_half_open_lets_probes_through_and_closes_on_success() -> None:
    changes: list[tuple[str, str]] = []
    breakers = CircuitBreakers(
        BreakerSettings(failure_threshold=1, cooldown_s=10, half_open_probes=1),
        on_change=lambda name, state: changes.append((name, state)),
    )
    breakers.record_failure("a", BROKEN)
    later = time.time() + 11
    assert not breakers.is_ejected("a", now=later)
    assert breakers.allows("a", now=later)  # the probe
    assert not breakers.allows("a", now=later)  # only one
    assert breakers.is_ejected("a", now=later)
    breakers.record_success("a")
    assert breakers.state("a") == "closed"
    assert changes == [("a", "open"), ("a", "half_open"), ("a", "closed")]


def test_a_failed_probe_reopens() -> None:
    breakers = CircuitBreakers(BreakerSettings(failure_threshold=1, cooldown_s=10))
    breakers.record_failure("a", BROKEN)
    assert breakers.allows("a", now=time.time() + 11)
    breakers.record_failure("a", BROKEN)
    assert breakers.state("a") == "open"
    assert breakers.reopens_in(["a"]) == pytest.approx(10, abs=0.5)


@pytest.fixture
async def shared(redis_url: str) -> AsyncIterator[tuple[aioredis.Redis, str]]:
    client = aioredis.Redis.from_url(redis_url)
    prefix = f"cgtest-{uuid.uuid4().hex[:8]}:"
    yield client, prefix
    keys = [key async for key in client.scan_iter(match=f"{prefix}*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


async def _drain(breakers: CircuitBreakers) -> None:
    for task in list(breakers._pending):
        await task


async def test_an_ejection_reaches_other_workers_through_redis(
    shared: tuple[aioredis.Redis, str],
) -> None:
    client, prefix = shared
    settings = BreakerSettings(failure_threshold=2, cooldown_s=5)
    worker_1 = CircuitBreakers(settings, client, prefix)
    worker_2 = CircuitBreakers(settings, client, prefix)
    worker_1.record_failure("a", BROKEN)
    worker_1.record_failure("a", BROKEN)
    await _drain(worker_1)
    ttl = await client.pttl(f"{prefix}{{breaker}}:a")
    assert 4000 < ttl <= 5000  # expires with the cooldown
    await worker_2.sync(["a", "b"])
    assert worker_2.state("a") == "open" and worker_2.state("b") == "closed"
    # Recovery on one worker clears the shared key.
    assert worker_1.allows("a", now=time.time() + 6)
    worker_1.record_success("a")
    await _drain(worker_1)
    assert await client.exists(f"{prefix}{{breaker}}:a") == 0
