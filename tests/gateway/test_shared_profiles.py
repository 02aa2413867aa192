"""Select routes' learning shared through real Redis: workers see each other's
observations, concurrent ones all count and compose as the local rule, the bound and
the TTL hold, a lost key is seeded, a Redis Cluster keeps them in one slot, and
without Redis learning stays local and quiet."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis

from gateway.pipeline.selector import MAX_SHIFT, TrafficProfiles, select_deployments
from gateway.pipeline.shared_profiles import PROFILE_TTL_S, SharedTrafficProfiles
from gateway.runtime import Runtime
from tests.cluster import LocalCluster, redis_cluster
from tests.gateway.select_runtime import runtime, select_route
from tests.support import eventually_async

__all__ = ["redis_cluster"]

Worker = Callable[[], SharedTrafficProfiles]


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """The test's own view of Redis."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
async def worker(redis_url: str, redis_prefix: str) -> AsyncIterator[Worker]:
    """worker() -> a worker's profiles, on its own connections, under the test's prefix."""
    started: list[SharedTrafficProfiles] = []

    def start() -> SharedTrafficProfiles:
        started.append(SharedTrafficProfiles.connect(redis_url, redis_prefix))
        return started[-1]

    yield start
    for traffic in started:
        await traffic.stop()


def local(times: int, predicted: float, observed: float) -> TrafficProfiles:
    """One worker alone (no Redis) after `times` such observations."""
    traffic = TrafficProfiles()
    for _ in range(times):
        traffic.observe("d", predicted, observed)
    return traffic


async def test_workers_see_each_other_s_observations_after_a_sync(worker: Worker) -> None:
    first, second = worker(), worker()
    for _ in range(3):
        first.observe("d", predicted=0.8, observed=0.0)
    await first.flush()
    assert second.offset("d") == 0.0  # nothing until it syncs
    await second.sync(["d", "unseen"])
    assert second.offset("d") == pytest.approx(local(3, 0.8, 0.0).offset("d"))
    assert second.observations("d") == 3 and second.observations("unseen") == 0
    second.observe("d", predicted=0.8, observed=0.0)  # the shared offset moves on
    await second.flush()
    await first.sync(["d"])
    assert first.observations("d") == second.observations("d") == 4
    assert first.offset("d") == second.offset("d") == pytest.approx(local(4, 0.8, 0.0).offset("d"))


async def test_concurrent_observations_of_two_workers_all_count(
    worker: Worker, client: aioredis.Redis
) -> None:
    first, second = worker(), worker()
    for _ in range(30):  # all in flight at once, on each worker's own connections
        first.observe("d", predicted=0.7, observed=0.5)
        second.observe("d", predicted=0.7, observed=0.5)
    await asyncio.gather(first.flush(), second.flush())
    stored = await client.hgetall(first.key("d"))
    assert int(stored["observations"]) == 60
    # As if one worker had made all 60 (59 would be 1e-4 off).
    assert float(stored["offset"]) == pytest.approx(local(60, 0.7, 0.5).offset("d"), abs=1e-12)
    await first.sync(["d"])
    await second.sync(["d"])
    assert first.observations("d") == second.observations("d") == 60
    assert first.offset("d") == second.offset("d") == float(stored["offset"])


async def test_the_bound_holds_on_the_shared_offset(worker: Worker, client: aioredis.Redis) -> None:
    first, second = worker(), worker()
    for _ in range(150):
        first.observe("up", predicted=0.2, observed=1.0)
        second.observe("down", predicted=0.9, observed=0.0)
    await asyncio.gather(first.flush(), second.flush())
    assert float((await client.hgetall(first.key("up")))["offset"]) == MAX_SHIFT
    assert float((await client.hgetall(first.key("down")))["offset"]) == -MAX_SHIFT
    await first.sync(["up", "down"])
    assert (first.offset("up"), first.offset("down")) == (MAX_SHIFT, -MAX_SHIFT)


async def test_a_profile_expires_after_a_month_refreshed_on_write(
    worker: Worker, client: aioredis.Redis
) -> None:
    traffic = worker()
    traffic.observe("d", predicted=0.5, observed=0.0)
    await traffic.flush()
    assert PROFILE_TTL_S - 5 <= await client.ttl(traffic.key("d")) <= PROFILE_TTL_S
    await client.expire(traffic.key("d"), 60)
    traffic.observe("d", predicted=0.5, observed=0.0)
    await traffic.flush()
    assert await client.ttl(traffic.key("d")) > PROFILE_TTL_S - 5


async def test_a_key_redis_lost_is_seeded_with_the_worker_s_copy(
    worker: Worker, client: aioredis.Redis
) -> None:
    traffic = worker()
    for _ in range(5):
        traffic.observe("d", predicted=0.7, observed=0.0)
    await traffic.flush()
    await client.delete(traffic.key("d"))  # a Redis restarted without persistence
    await traffic.sync(["d"])
    assert traffic.observations("d") == 5  # no key: nothing to adopt, the copy stays
    traffic.observe("d", predicted=0.7, observed=0.0)
    await traffic.flush()
    assert int((await client.hgetall(traffic.key("d")))["observations"]) == 6
    assert traffic.offset("d") == pytest.approx(local(6, 0.7, 0.0).offset("d"))


async def test_an_expired_profile_starts_again_from_the_predictor(
    worker: Worker, client: aioredis.Redis
) -> None:
    """A month without a verdict: the key expires, and a long-running worker's copy
    must not seed it again (a review found the 30 days never ran out)."""
    traffic = worker()
    now = [1000.0]
    traffic.clock = lambda: now[0]
    traffic.observe("d", predicted=0.7, observed=0.0)
    await traffic.flush()
    await client.delete(traffic.key("d"))  # as Redis expires it
    now[0] += PROFILE_TTL_S + 1
    await traffic.sync(["d"])
    assert (traffic.offset("d"), traffic.observations("d")) == (0.0, 0)
    traffic.observe("d", predicted=0.7, observed=0.0)
    await traffic.flush()
    assert int((await client.hgetall(traffic.key("d")))["observations"]) == 1


async def test_a_key_lost_within_a_month_of_anyone_s_verdict_is_kept(
    worker: Worker, client: aioredis.Redis
) -> None:
    """first's own verdicts are a month old, but it saw second's, newer, in a poll: a
    key missing then was lost (Redis restarted), not expired."""
    first, second = worker(), worker()
    now = [1000.0]
    first.clock = second.clock = lambda: now[0]
    first.observe("d", predicted=0.7, observed=0.0)
    await first.flush()
    now[0] += PROFILE_TTL_S - 86400  # day 29: second answers
    second.observe("d", predicted=0.7, observed=0.0)
    await second.flush()
    await first.sync(["d"])  # first sees the count grow
    now[0] += 2 * 86400  # day 31
    await client.delete(first.key("d"))  # lost, not expired
    await first.sync(["d"])
    assert first.observations("d") == 2


async def test_a_zero_profile_resets_every_worker_s_learning(
    worker: Worker, client: aioredis.Redis
) -> None:
    first, second = worker(), worker()
    for _ in range(4):
        first.observe("d", predicted=0.7, observed=0.0)
    await first.flush()
    await second.sync(["d"])
    assert second.offset("d") < 0
    await client.hset(first.key("d"), mapping={"offset": 0, "observations": 0})  # the reset
    await first.sync(["d"])
    await second.sync(["d"])
    assert first.offset("d") == second.offset("d") == 0.0
    assert first.observations("d") == second.observations("d") == 0


async def test_without_redis_learning_is_local_and_nothing_raises(
    redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    changes: list[tuple[str, float]] = []
    traffic = SharedTrafficProfiles.connect(
        "redis://127.0.0.1:1/0",  # nothing listens there
        redis_prefix,
        on_change=lambda *change: changes.append(change),
    )
    with caplog.at_level(logging.DEBUG, logger="gateway.pipeline.shared_profiles"):
        for _ in range(3):
            traffic.observe("d", predicted=0.9, observed=0.0)
        await traffic.flush()
        traffic.start(lambda: runtime(select_route()))
        await asyncio.sleep(0.1)  # a poll round fails, quietly
        await traffic.stop()
    assert traffic.offset("d") == pytest.approx(local(3, 0.9, 0.0).offset("d"))
    assert traffic.observations("d") == 3
    assert [c[0] for c in changes] == ["d"] * 3
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "learning locally" in warnings[0].getMessage()


async def test_a_running_worker_adopts_the_select_routes_profiles(
    worker: Worker, redis_url: str, redis_prefix: str
) -> None:
    rt: Runtime = runtime(select_route())
    assert select_deployments(rt) == ["cheap", "dear"]
    assert select_deployments(runtime({"strategy": "fallback", "deployments": ["dear"]})) == []
    teacher = worker()
    changes: list[tuple[str, float]] = []
    pupil = SharedTrafficProfiles.connect(
        redis_url, redis_prefix, on_change=lambda *change: changes.append(change)
    )
    pupil.start(lambda: rt)
    try:
        teacher.observe("cheap", predicted=0.6, observed=0.0)
        await teacher.flush()
        await eventually_async(lambda: pupil.observations("cheap") == 1, 3, "the poll")
        assert pupil.offset("cheap") == teacher.offset("cheap") < 0
        assert ("cheap", teacher.offset("cheap")) in changes  # the gauge follows
    finally:
        await pupil.stop()


async def test_on_a_redis_cluster_the_profiles_share_one_slot(redis_cluster: LocalCluster) -> None:
    prefix = f"cgtest-{uuid.uuid4().hex[:10]}:"
    first, second = (
        SharedTrafficProfiles.connect(redis_cluster.url, prefix, cluster=True) for _ in range(2)
    )
    try:
        for deployment in ("a", "b", "c"):
            first.observe(deployment, predicted=0.6, observed=0.0)
        await first.flush()
        await second.sync(["a", "b", "c", "unseen"])  # one pipeline, one node
        assert [second.observations(d) for d in "abc"] == [1, 1, 1]
        assert second.offset("b") == first.offset("b") == pytest.approx(-0.06)
        assert len({redis_cluster.master_of_key(first.key(d)) for d in "abc"}) == 1
    finally:
        await first.stop()
        await second.stop()
        redis_cluster.delete_prefix(prefix)


async def test_a_key_redis_lost_and_another_worker_seeded_afresh_is_adopted(
    worker: Worker, client: aioredis.Redis
) -> None:
    """A long-running worker that confirmed 5 observations keeps listening after Redis
    lost the key and a fresh worker started it again from one: its poll adopts the
    lower count (none of its own observations is in flight)."""
    old, fresh = worker(), worker()
    for _ in range(5):
        old.observe("d", predicted=0.8, observed=0.0)
    await old.flush()
    await client.delete(old.key("d"))
    fresh.observe("d", predicted=0.2, observed=1.0)
    await fresh.flush()
    await old.sync(["d"])
    assert old.observations("d") == 1
    assert old.offset("d") == pytest.approx(fresh.offset("d")) and old.offset("d") > 0


async def test_a_shared_offset_belongs_to_the_profile_it_was_learned_against(
    worker: Worker, client: aioredis.Redis
) -> None:
    """The hash keeps the profile; an observation against another (a reload changed the
    deployment's quality_profile) starts the shared learning again, and every worker
    follows, though the count went down."""
    first, second = worker(), worker()
    for _ in range(5):
        first.observe("d", predicted=0.8, observed=0.0, quality_profile="old")
    await first.flush()
    await second.sync(["d"])
    assert second.offset("d", "old") < 0 and second.offset("d", "new") == 0.0
    assert (await client.hgetall(first.key("d")))["profile"] == "old"
    second.observe("d", predicted=0.4, observed=1.0, quality_profile="new")
    await second.flush()
    stored = await client.hgetall(first.key("d"))
    assert (stored["profile"], int(stored["observations"])) == ("new", 1)
    assert float(stored["offset"]) == pytest.approx(local(1, 0.4, 1.0).offset("d"))
    first.observe("d", predicted=0.4, observed=1.0, quality_profile="new")  # 5 -> 2 as well
    await first.flush()
    await second.sync(["d"])
    assert first.observations("d") == second.observations("d") == 2
    assert second.offset("d", "new") == pytest.approx(local(2, 0.4, 1.0).offset("d"))


async def test_a_hash_without_a_profile_is_adopted_and_stamped(
    worker: Worker, client: aioredis.Redis
) -> None:
    """Written before the profile was kept: taken for the current profile's learning."""
    traffic = worker()
    await client.hset(traffic.key("d"), mapping={"offset": -0.1, "observations": 5})
    await traffic.sync(["d"])
    assert traffic.offset("d", "p") == -0.1
    traffic.observe("d", predicted=0.5, observed=0.0, quality_profile="p")
    await traffic.flush()
    stored = await client.hgetall(traffic.key("d"))
    assert (stored["profile"], stored["observations"]) == ("p", "6")
    assert traffic.offset("d", "p") == pytest.approx(-0.1 + 0.1 * (0.0 - 0.5 + 0.1))


async def test_a_lost_key_is_not_seeded_with_another_profile_s_learning(
    worker: Worker, client: aioredis.Redis
) -> None:
    traffic = worker()
    for _ in range(3):
        traffic.observe("d", predicted=0.7, observed=0.0, quality_profile="old")
    await traffic.flush()
    await client.delete(traffic.key("d"))
    traffic.observe("d", predicted=0.7, observed=1.0, quality_profile="new")
    await traffic.flush()
    stored = await client.hgetall(traffic.key("d"))
    assert (stored["profile"], stored["observations"]) == ("new", "1")
