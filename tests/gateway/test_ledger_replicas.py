"""`CASCADE_LEDGER_MIN_REPLICAS`: a batch of spend counts as written once a replica has
it (Redis WAIT on the connection that wrote it). On the real cluster (tests/cluster.py),
a master that crashes with writes its replica never got loses them; a ledger that asks
for a replica kept them spooled and writes them to the promoted replica, exactly once."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import redis

from gateway.ledger import CostLedger, LedgerUnavailable, RedisStore, SpendRecord, Spool
from gateway.settings import CLUSTER_LEDGER_SHARDS, Settings
from tests.cluster import LocalCluster, cluster_prefix, redis_cluster
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import AUTH, StartGateway, openai_compatible_policy
from tests.gateway.ledger_fixtures import (
    DAY0,
    OUTAGE_DB,
    RedisServer,
    expected_rows,
    make_record,
)
from tests.support import eventually, eventually_async

__all__ = ["cluster_prefix", "redis_cluster"]

WIDE = (DAY0 - timedelta(days=30), DAY0 + timedelta(days=30))


def test_the_settings_name_the_replicas_and_the_wait() -> None:
    store = RedisStore.from_settings(
        Settings(redis_url="redis://127.0.0.1:6379/0", ledger_min_replicas=1)
    )
    assert store.replica_ack == (1, 100)
    assert RedisStore("redis://127.0.0.1:6379/0").replica_ack is None
    with pytest.raises(ValueError, match="WAIT needs a replica and a timeout"):
        RedisStore("redis://127.0.0.1:6379/0", min_replicas=1, replica_wait_ms=0)
    with pytest.raises(ValueError, match="over half the socket timeout"):
        RedisStore("redis://127.0.0.1:6379/0", min_replicas=1, replica_wait_ms=501)


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[tuple[RedisServer, RedisServer]]:
    """A private Redis and its replica, in sync."""
    master = RedisServer(tmp_path / "master")
    master.start()
    replica = RedisServer(tmp_path / "replica", replica_of=master.port)
    replica.start()
    with redis.Redis(port=replica.port) as client:
        eventually(lambda: client.info("replication")["master_link_status"] == "up", 10)
    yield master, replica
    replica.stop()
    master.stop()


@pytest.mark.parametrize("batch", [1, 5], ids=["one record", "a batch"])
async def test_a_single_redis_confirms_a_write_once_its_replica_has_it(
    replicated: tuple[RedisServer, RedisServer], batch: int
) -> None:
    """With the replica in sync the write is confirmed; with the replica cut off (paused,
    its link dropped) WAIT answers 0 and the write is refused as unconfirmed (the ledger
    spools it). Sent again once the replica is back, as a replay is, it is confirmed
    and counted once."""
    master, replica = replicated
    waiting = RedisStore(master.url, min_replicas=1, replica_wait_ms=200)
    assert await _until_acked(waiting, [make_record(100 + i) for i in range(batch)])
    records = [make_record(i) for i in range(batch)]
    replica.pause()
    with redis.Redis(port=master.port) as client:
        client.client_kill_filter(_type="replica")
    with pytest.raises(LedgerUnavailable, match="fewer than 1 replica"):
        await waiting.record_many(records)
    replica.resume()
    assert await _until_acked(waiting, records) == [False] * batch  # written before, once
    with redis.Redis(port=replica.port, db=OUTAGE_DB) as client:  # and on the replica
        assert all(client.exists(f"cg:{{ledger}}:rec:{r.record_id}") for r in records)
    assert await waiting.aggregate(*WIDE, ["day"]) == expected_rows(
        [*records, *(make_record(100 + i) for i in range(batch))], ["day"]
    )
    await waiting.close()


async def test_the_gateway_spools_spend_its_redis_replica_has_not_taken(
    replicated: tuple[RedisServer, RedisServer],
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    redis_prefix: str,
) -> None:
    """The running gateway with CASCADE_LEDGER_MIN_REPLICAS=1: while its Redis's replica
    is cut off it answers as ever, its ledger reports degraded and keeps the spend in
    the spool; with the replica back every answer is recorded once, on the replica too."""
    master, replica = replicated
    server = start_gateway(
        openai_compatible_policy(),
        redis=master.url,
        UPSTREAM_BASE_URL=fake_openai.url,
        CASCADE_LEDGER_MIN_REPLICAS="1",
        CASCADE_LEDGER_REPLICA_WAIT_MS="200",
    )
    store = RedisStore(master.url, prefix=redis_prefix)

    async def chat(client: httpx.AsyncClient, text: str) -> str:
        body = {"model": "auto", "messages": [{"role": "user", "content": text}]}
        response = await client.post("/v1/chat/completions", json=body, headers=AUTH)
        assert response.status_code == 200
        return response.headers["x-request-id"]

    async def ledger_state(client: httpx.AsyncClient) -> str:
        return str((await client.get("/readyz")).json()["ledger"])

    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        answered = [await chat(client, f"hello {i}") for i in range(3)]
        replica.pause()
        with redis.Redis(port=master.port) as node:
            node.client_kill_filter(_type="replica")
        answered += [await chat(client, f"while cut off {i}") for i in range(3)]
        await eventually_async(
            lambda: _is(ledger_state(client), "degraded"), 10, "the ledger degraded"
        )
        replica.resume()
        await eventually_async(lambda: _is(ledger_state(client), "ok"), 30, "the ledger ok")

    recorded = [event.request_id for event in await store.events(limit=100)]
    await store.close()
    assert sorted(recorded) == sorted(answered)
    with redis.Redis(port=replica.port, db=OUTAGE_DB, decode_responses=True) as node:
        assert all(node.exists(f"{redis_prefix}{{ledger}}:rec:{rid}") for rid in answered)


async def _is(value: Awaitable[str], expected: str) -> bool:
    return await value == expected


async def test_a_redis_without_the_replicas_asked_for_leaves_every_write_unconfirmed(
    redis_server: RedisServer,
) -> None:
    waiting = RedisStore(redis_server.url, min_replicas=1, replica_wait_ms=20)
    with pytest.raises(LedgerUnavailable, match="fewer than 1 replica"):
        await waiting.record_many([make_record(1), make_record(2)])
    assert await waiting.record_many([]) == []
    await waiting.close()


async def _until_acked(store: RedisStore, records: list[SpendRecord]) -> list[bool]:
    """`record_many`, again until a replica confirms it (a replica just (re)synced
    acknowledges its first write after a few hundred ms)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return await store.record_many(records)
        except LedgerUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


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
    warm_up = RedisStore(
        url, prefix=cluster_prefix + "warm-up:", cluster=True, shards=shards, min_replicas=1
    )
    assert await _until_acked(warm_up, [make_record(i) for i in range(shards * 4)])
    await warm_up.close()
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
        await asyncio.sleep(1.0)  # replays meanwhile: the new master has no replica yet
        assert ledgers["acked"].degraded and ledgers["acked"].spooled_count > 0
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


async def test_a_batch_redirected_by_a_failover_is_not_confirmed_until_sent_again(
    redis_cluster: LocalCluster, cluster_prefix: str
) -> None:
    """After a planned failover the store's map is stale: its scripts for that master are
    answered MOVED and run nowhere, so the batch is refused, not redirected past its
    WAIT. Sent again (the map patched), it is confirmed and counted once."""
    shards = CLUSTER_LEDGER_SHARDS
    store = RedisStore(
        redis_cluster.url, prefix=cluster_prefix, cluster=True, shards=shards, min_replicas=1
    )
    warm = [make_record(1000 + i) for i in range(shards * 4)]
    assert await _until_acked(store, warm)
    await asyncio.to_thread(redis_cluster.failover, redis_cluster.masters()[1])
    records = [make_record(i) for i in range(shards * 4)]
    with pytest.raises(LedgerUnavailable, match="slots moved"):
        await store.record_many(records)
    await _until_acked(store, records)
    assert await store.aggregate(*WIDE, ["day"]) == expected_rows([*warm, *records], ["day"])
    await store.close()


async def test_a_dropped_connection_is_tried_again_before_a_batch_counts_unconfirmed(
    redis_cluster: LocalCluster, cluster_prefix: str
) -> None:
    """Every master closes the store's pooled connections (a restart, an idle timeout):
    the next batch goes again, WAIT and all, on fresh ones, and is confirmed."""
    shards = CLUSTER_LEDGER_SHARDS
    store = RedisStore(
        redis_cluster.url, prefix=cluster_prefix, cluster=True, shards=shards, min_replicas=1
    )
    first = [make_record(i) for i in range(shards * 4)]
    assert await _until_acked(store, first)
    for port in redis_cluster.masters():
        with redis_cluster.node(port) as node:
            assert node.client_kill_filter(_type="normal") >= 1  # ours among them
    later = [make_record(i) for i in range(shards * 4, shards * 8)]
    assert await store.record_many(later) == [True] * len(later)
    assert await store.aggregate(*WIDE, ["day"]) == expected_rows(first + later, ["day"])
    await store.close()


def _rejoin(cluster: LocalCluster, port: int) -> None:
    """The crashed master back, as its successor's replica: the session's cluster healthy."""
    cluster.restart(port)
    cluster.wait_healthy(60)
