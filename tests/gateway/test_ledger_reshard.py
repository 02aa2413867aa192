"""`spend reshard`: a one-slot ledger moved onto N shards on real Redis keeps its totals
and events, still refuses a replayed record (its marker moved to its shard), refuses
to move past an archive that has not drained, and can be run again if cut short."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
import redis.asyncio as aioredis

from gateway.ledger import RedisStore
from gateway.ledger.archive.group import GROUP
from gateway.ledger.reshard import ReshardRefused, reshard
from gateway.ledger.shards import LedgerLayoutError
from gateway.redis_client import redis_client
from tests.cluster import LocalCluster, redis_cluster
from tests.gateway.archive_support import REPO
from tests.gateway.ledger_fixtures import DAY0, expected_rows, make_record

RECORDS = [make_record(i, day=i % 3) for i in range(60)]
WIDE = (DAY0 - timedelta(days=1), DAY0 + timedelta(days=5))
GROUPS = ["day", "team", "deployment"]

__all__ = ["redis_cluster"]


@pytest.fixture
def prefix(redis_prefix: str) -> str:
    return redis_prefix


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    connection = aioredis.Redis.from_url(redis_url)
    yield connection
    await connection.aclose()


async def written(redis_url: str, prefix: str) -> None:
    store = RedisStore(redis_url, prefix=prefix)
    try:
        assert all(await store.record_many(RECORDS))
    finally:
        await store.close()


async def test_the_moved_ledger_keeps_its_totals_events_and_markers(
    redis_url: str, prefix: str, client: aioredis.Redis
) -> None:
    await written(redis_url, prefix)
    moved = await reshard(client, prefix, 4)
    assert (moved.markers, moved.events) == (60, 60) and moved.day_keys > 3
    assert await client.keys(f"{prefix}{{ledger}}:*") == [f"{prefix}{{ledger}}:shards".encode()]
    store = RedisStore(redis_url, prefix=prefix, shards=4)
    try:
        await store.check_layout()
        assert await store.aggregate(*WIDE, GROUPS) == expected_rows(RECORDS, GROUPS)
        assert len(await store.events(limit=1000)) == 60
        assert await store.record_many(RECORDS[:5]) == [False] * 5  # replays: counted once
        assert await store.record(make_record(1000)) is True
        assert await store.aggregate(*WIDE, GROUPS) == expected_rows(
            [*RECORDS, make_record(1000)], GROUPS
        )
    finally:
        await store.close()
    one_slot = RedisStore(redis_url, prefix=prefix)
    with pytest.raises(LedgerLayoutError, match="4 shard"):
        await one_slot.check_layout()
    await one_slot.close()


async def test_a_move_cut_short_is_finished_by_running_it_again(
    redis_url: str, prefix: str, client: aioredis.Redis
) -> None:
    """Killed between copying and deleting: some originals are still there beside their
    copies, and the count is not recorded yet. Running it again copies them again (the
    same content), deletes them, and counts nothing twice."""
    await written(redis_url, prefix)
    await reshard(client, prefix, 4)
    old, new = f"{prefix}{{ledger}}:", f"{prefix}{{ledger.0}}:"
    day = f"day:{DAY0}"
    await client.hset(old + day, mapping=await client.hgetall(new + day))
    marker = next(k for k in await client.keys(f"{prefix}{{ledger.*}}:rec:req-7"))
    await client.set(old + "rec:req-7", await client.get(marker))
    [(first_id, fields)] = await client.xrange(new + "events", count=1)
    await client.xadd(old + "events", fields, id=first_id)
    await client.delete(f"{prefix}{{ledger}}:shards")
    await reshard(client, prefix, 4)
    sharded = RedisStore(redis_url, prefix=prefix, shards=4)
    try:
        await sharded.check_layout()
        assert await sharded.aggregate(*WIDE, GROUPS) == expected_rows(RECORDS, GROUPS)
        assert len(await sharded.events(limit=1000)) == 60
        assert await sharded.record_many(RECORDS[:10]) == [False] * 10
    finally:
        await sharded.close()


async def test_an_archive_that_has_not_drained_refuses_the_move(
    redis_url: str, prefix: str, client: aioredis.Redis
) -> None:
    await written(redis_url, prefix)
    await client.xgroup_create(f"{prefix}{{ledger}}:events", GROUP, id="0")
    with pytest.raises(ReshardRefused, match="spend export --archive DIR --once"):
        await reshard(client, prefix, 4)
    assert await client.get(f"{prefix}{{ledger}}:shards") is None  # nothing moved
    assert await client.exists(f"{prefix}{{ledger}}:rec:req-0")


def test_the_command_line_moves_and_refuses(redis_url: str, prefix: str) -> None:
    import asyncio

    asyncio.run(written(redis_url, prefix))
    env = {**os.environ, "REDIS_URL": redis_url, "CASCADE_REDIS_PREFIX": prefix}
    command = [sys.executable, "-m", "gateway.cli", "spend", "reshard", "--shards"]
    bad = subprocess.run([*command, "0"], cwd=REPO, env=env, capture_output=True, text=True)
    assert bad.returncode == 1 and "--shards must be 1 or more" in bad.stderr
    idle = subprocess.run([*command, "1"], cwd=REPO, env=env, capture_output=True, text=True)
    assert idle.returncode == 1 and "nothing to move" in idle.stderr
    ok = subprocess.run([*command, "8"], cwd=REPO, env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "moved 60 marker(s)" in ok.stdout and "CASCADE_LEDGER_SHARDS=8" in ok.stdout


async def test_a_cluster_ledger_moves_from_one_slot_onto_sixteen(
    redis_cluster: LocalCluster,
) -> None:
    """On the 3-master cluster (tests/cluster.py): written in the one `{ledger}` slot,
    moved with a cluster client, read back spread over the masters."""
    prefix = f"cgtest-{uuid.uuid4().hex[:10]}:"
    one_slot = RedisStore(redis_cluster.url, prefix=prefix, cluster=True, shards=1)
    client = redis_client(
        redis_cluster.url, socket_timeout=5.0, connect_timeout=5.0, max_connections=4, cluster=True
    )
    try:
        assert all(await one_slot.record_many(RECORDS))
        await reshard(client, prefix, 16)
        sharded = RedisStore(redis_cluster.url, prefix=prefix, cluster=True, shards=16)
        try:
            assert await sharded.aggregate(*WIDE, GROUPS) == expected_rows(RECORDS, GROUPS)
            assert await sharded.record_many(RECORDS[:5]) == [False] * 5
        finally:
            await sharded.close()
        masters = [port for port, keys in redis_cluster.keys(prefix + "*").items() if keys]
        assert len(masters) == len(redis_cluster.masters())
    finally:
        await one_slot.close()
        await client.aclose()
        redis_cluster.delete_prefix(prefix)
