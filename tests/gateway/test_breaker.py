"""Circuit breakers: transitions, half-open probes (and the slots the executor's
attempts hold), and ejections shared through real Redis between two workers' breaker
sets."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from gateway.errors import RateLimited, UpstreamTimeout
from gateway.health.breaker import BreakerSettings, CircuitBreakers
from gateway.upstreams.base import UpstreamConnectFailed, UpstreamReply, UpstreamStatus
from tests.gateway.scripted import (
    BODY,
    ScriptedClient,
    answers,
    deployment,
    due_for_a_probe,
    executor,
    fails,
)

BROKEN = UpstreamStatus("boom", status=500)
BUSY = UpstreamStatus("queue full", status=503)
SLOW_DOWN = UpstreamStatus("slow down", status=429, retry_after_s=0.1)


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


def test_is_ejected_only_reads() -> None:
    breakers = CircuitBreakers(BreakerSettings(failure_threshold=1, cooldown_s=10))
    breakers.record_failure("a", BROKEN)
    probed_at = time.time() + 11
    assert breakers.allows("a", now=probed_at)
    assert not breakers.is_ejected("a", now=probed_at + 11)  # that probe would be stale
    assert breakers.is_ejected("a", now=probed_at + 1)  # ...but asking freed nothing


def test_release_hands_back_only_the_slot_it_was_given() -> None:
    breakers = CircuitBreakers(BreakerSettings(failure_threshold=1, cooldown_s=10))
    closed = breakers.allows("a")  # let through before the breaker opened: no slot
    breakers.record_failure("a", BROKEN)
    t = time.time() + 11
    stale = breakers.allows("a", now=t)
    fresh = breakers.allows("a", now=t + 11)  # stale never reported back: its slot is reused
    assert closed and stale and fresh and not closed.probe and fresh.probe
    breakers.release(closed)
    breakers.release(stale)
    assert breakers.is_ejected("a", now=t + 12)  # fresh still holds the slot
    breakers.release(fresh)
    assert not breakers.is_ejected("a", now=t + 12)


def probe_taken() -> CircuitBreakers:
    """a's breaker half-open, its one probe slot held by another request."""
    breakers = due_for_a_probe()
    assert breakers.allows("a")
    return breakers


async def test_a_cancelled_last_resort_leaves_the_probe_slot_to_its_holder() -> None:
    breakers = probe_taken()
    run, _ = executor(ScriptedClient({"a": answers(1.0)}), breakers)
    with pytest.raises(UpstreamTimeout):  # tried anyway, as the only deployment, then cancelled
        await run.complete([deployment("a")], "chat", BODY, 0.05)
    assert breakers.is_ejected("a")


async def test_a_busy_last_resort_leaves_the_probe_slot_to_its_holder() -> None:
    breakers = probe_taken()
    client = ScriptedClient({"a": fails(SLOW_DOWN)})
    run, _ = executor(client, breakers)
    with pytest.raises(RateLimited):
        await run.complete([deployment("a", retries=1)], "chat", BODY, 5.0)
    assert client.calls == ["a", "a"] and breakers.is_ejected("a")


async def test_a_probe_keeps_its_slot_while_it_waits_to_retry() -> None:
    answered_busy = asyncio.Event()

    async def busy() -> UpstreamReply:
        answered_busy.set()
        raise SLOW_DOWN

    breakers = due_for_a_probe()
    run, _ = executor(ScriptedClient({"a": busy, "b": answers()}), breakers)
    candidates = [deployment("a", retries=1), deployment("b")]
    request = asyncio.create_task(run.complete(candidates, "chat", BODY, 5.0))
    await answered_busy.wait()  # the request waits to ask a again
    assert breakers.is_ejected("a")  # its probe is still out
    assert (await request).deployment.name == "b"
    assert breakers.state("a") == "half_open" and not breakers.is_ejected("a")


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
