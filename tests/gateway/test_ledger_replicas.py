"""`CASCADE_LEDGER_MIN_REPLICAS`: a batch of spend counts as written once a replica has
it (Redis WAIT on the connection that wrote it). On the real cluster (tests/cluster.py),
a master that crashes with writes its replica never got loses them; a ledger that asks
for a replica kept them spooled and writes them to the promoted replica, exactly once."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from gateway.ledger import CostLedger, LedgerUnavailable, RedisStore, Spool
from gateway.settings import CLUSTER_LEDGER_SHARDS, Settings
from tests.cluster import LocalCluster, cluster_prefix, redis_cluster
from tests.gateway.ledger_fixtures import DAY0, delete_prefix, expected_rows, make_record
from tests.support import eventually_async

__all__ = ["cluster_prefix", "redis_cluster"]

WIDE = (DAY0 - timedelta(days=30), DAY0 + timedelta(days=30))


@pytest.fixture
async def prefix(redis_url: str) -> AsyncIterator[str]:
    prefix = f"cgtest-{uuid.uuid4().hex[:10]}:"
    yield prefix
    await delete_prefix(redis_url, prefix)


def test_the_settings_name_the_replicas_and_the_wait() -> None:
    store = RedisStore.from_settings(
        Settings(redis_url="redis://127.0.0.1:6379/0", ledger_min_replicas=1)
    )
    assert store.replica_ack == (1, 100)
    assert RedisStore("redis://127.0.0.1:6379/0").replica_ack is None
    with pytest.raises(ValueError, match="WAIT needs a replica and a timeout"):
        RedisStore("redis://127.0.0.1:6379/0", min_replicas=1, replica_wait_ms=0)
    with pytest.raises(ValueError, match="outlasts the socket's"):
        RedisStore("redis://127.0.0.1:6379/0", min_replicas=1, replica_wait_ms=1000)


@pytest.mark.parametrize("batch", [1, 5], ids=["one record", "a batch"])
async def test_a_redis_without_the_replicas_asked_for_leaves_the_write_unconfirmed(
    redis_url: str, prefix: str, batch: int
) -> None:
    """Redis here has no replica: WAIT answers 0, the write is refused as unconfirmed
    (the ledger spools it), and sending it again is a no-op, as a replay is."""
    records = [make_record(i) for i in range(batch)]
    waiting = RedisStore(redis_url, prefix=prefix, min_replicas=1, replica_wait_ms=20)
    with pytest.raises(LedgerUnavailable, match="fewer than 1 replica"):
        await waiting.record_many(records)
    plain = RedisStore(redis_url, prefix=prefix)
    assert await plain.record_many(records) == [False] * batch  # it was written, once
    assert await plain.aggregate(*WIDE, ["day"]) == expected_rows(records, ["day"])
    await waiting.close()
    await plain.close()


async def test_a_crashed_master_loses_no_spend_a_replica_was_asked_to_take(
    redis_cluster: LocalCluster, cluster_prefix: str, tmp_path: Path
) -> None:
    """Two ledgers, one with `min_replicas=1`, write while a master's replica is cut off
    (paused, its link dropped). The master is killed (SIGKILL), the replica resumes and
    takes over, and the old master comes back as its replica. The plain ledger's records
    on that master are gone; the other's stayed spooled until the new master had a
    replica to take them, and each is counted once."""
    victim = redis_cluster.masters()[0]
    replica = redis_cluster.replica_of(victim)
    url, shards = redis_cluster.url, CLUSTER_LEDGER_SHARDS
    stores = {
        "plain": RedisStore(url, prefix=cluster_prefix + "plain:", cluster=True, shards=shards),
        "acked": RedisStore(
            url,
            prefix=cluster_prefix + "acked:",
            cluster=True,
            shards=shards,
            min_replicas=1,
            replica_wait_ms=500,
        ),
    }
    ledgers = {
        name: CostLedger(store, Spool(tmp_path / f"{name}.spool"), replay_interval_s=0.1)
        for name, store in stores.items()
    }
    await _until_replicas_ack(url, cluster_prefix + "warm-up:")
    for ledger in ledgers.values():
        ledger.start()
    records = [make_record(i, day=i % 2) for i in range(120)]
    try:
        for rec in records[:40]:  # replicated as usual
            for ledger in ledgers.values():
                ledger.submit(rec)
        for ledger in ledgers.values():
            assert await ledger.flush(10)
        assert not ledgers["acked"].degraded
        assert redis_cluster.cut_off_replica(victim) == replica
        for rec in records[40:]:
            for ledger in ledgers.values():
                ledger.submit(rec)
        for ledger in ledgers.values():
            assert await ledger.flush(10)
        assert ledgers["acked"].spooled_count > 0 and not ledgers["plain"].degraded
        await asyncio.to_thread(redis_cluster.crash, victim)
        redis_cluster.resume(replica)
        await asyncio.to_thread(redis_cluster.take_over, replica)
        assert ledgers["acked"].degraded  # the new master has no replica yet
        await asyncio.to_thread(redis_cluster.restart, victim)  # now it has
        await eventually_async(
            lambda: not ledgers["acked"].degraded, 60, "the acked ledger to replay", 0.1
        )
    finally:
        redis_cluster.resume(replica)
        for ledger in ledgers.values():
            await ledger.stop()
        for store in stores.values():
            await store.close()
        await asyncio.to_thread(_rejoin, redis_cluster, victim)

    counted: dict[str, Counter[str]] = {}
    for name in stores:
        reader = RedisStore(url, prefix=cluster_prefix + name + ":", cluster=True, shards=shards)
        counted[name] = Counter(e.record_id for e in await reader.events(limit=10_000))
        totals = await reader.aggregate(*WIDE, ["day"])
        await reader.close()
        if name == "acked":
            assert totals == expected_rows(records, ["day"])
    assert counted["acked"] == Counter(r.record_id for r in records)
    lost = {r.record_id for r in records[40:]} - set(counted["plain"])
    assert lost and set(counted["plain"].values()) == {1}  # the hazard this setting closes
    assert ledgers["acked"].dropped_count == ledgers["acked"].expired_count == 0


async def _until_replicas_ack(url: str, prefix: str) -> None:
    """A replica just synced acknowledges its first write after a few hundred ms."""
    shards = CLUSTER_LEDGER_SHARDS
    waiting = RedisStore(
        url, prefix=prefix, cluster=True, shards=shards, min_replicas=1, replica_wait_ms=500
    )
    records = [make_record(i) for i in range(shards * 4)]  # every master

    async def acked() -> bool:
        try:
            return len(await waiting.record_many(records)) == len(records)
        except LedgerUnavailable:
            return False

    await eventually_async(acked, 30, "every master's replica to acknowledge a write")
    await waiting.close()


def _rejoin(cluster: LocalCluster, port: int) -> None:
    """The crashed master back, as its successor's replica: the session's cluster healthy."""
    cluster.restart(port)
    cluster.wait_healthy(60)
