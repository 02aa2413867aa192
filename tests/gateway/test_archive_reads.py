"""The archive's reads and its lease under the failures a review found: a read whose
reply was lost, a lease that lapsed and was taken straight back, a group made by a call
whose reply was lost; and the exporter's own client, which retries nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import pytest

from gateway.ledger import RedisStore
from gateway.ledger.archive import GROUP, ArchiveExporter, ArchiveOptions, build, build_exporter
from gateway.ledger.archive.commit import LeaseLost
from gateway.ledger.archive.lease import Claim, Lease
from gateway.ledger.archive.stream_export import StreamExport
from gateway.redis_client import redis_client
from gateway.spend.commands import SIDECAR_READ_COUNT
from tests.gateway.archive_support import FAST, archived_rows, assert_exactly_once, varied_record
from tests.gateway.ledger_fixtures import delete_prefix


@pytest.fixture
async def prefix(redis_url: str) -> AsyncIterator[str]:
    prefix = f"cgtest-{uuid.uuid4().hex[:10]}:"
    yield prefix
    await delete_prefix(redis_url, prefix)


async def test_a_read_whose_reply_was_lost_loses_no_record(
    redis_url: str, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second page of new entries is delivered (so pending) but its reply is lost,
    and a retry reads the third: the batch around the gap must not become a file whose
    range claims the lost page, which would then be acked as archived."""
    store = RedisStore(redis_url, prefix=prefix)
    recs = [varied_record(i) for i in range(300)]
    await store.record_many(recs)
    [key] = store.event_stream_keys()
    exporter = ArchiveExporter(
        store.client, [key], tmp_path, dataclasses.replace(FAST, read_count=100)
    )
    [stream] = exporter.streams
    read = stream._read
    new_reads = 0

    async def second_reply_lost(start: str, count: int) -> Any:
        nonlocal new_reads
        page = await read(start, count)
        new_reads += start == ">"
        return await read(start, count) if new_reads == 2 and start == ">" else page

    monkeypatch.setattr(stream, "_read", second_reply_lost)
    assert await exporter.drain() == 300
    await store.close()
    assert_exactly_once(tmp_path, {rec.record_id for rec in recs})


async def test_the_exporter_reads_through_a_client_of_its_own_that_retries_nothing(
    redis_url: str, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[dict[str, Any]] = []
    real = redis_client

    def recording(url: str, **options: Any) -> Any:
        made.append({"url": url, **options})
        return real(url, **options)

    monkeypatch.setattr(build, "redis_client", recording)
    store = RedisStore(redis_url, prefix=prefix, shards=4, stream_maxlen=1000)
    exporter = build_exporter(store, tmp_path, FAST)
    assert exporter.client is not store.client
    [options] = made
    assert (options["url"], options["retry_on"], options["cluster"]) == (redis_url, (), False)
    assert [stream.key for stream in exporter.streams] == store.event_stream_keys()
    await store.record_many([varied_record(i) for i in range(40)])
    assert await exporter.drain() == 40
    await exporter.close()
    assert exporter.client.connection_pool._in_use_connections == set()  # type: ignore[union-attr]
    await store.close()


def test_a_cluster_ledger_s_exporter_gets_a_cluster_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flags: list[bool] = []

    def recording(url: str, **options: Any) -> Any:
        flags.append(options["cluster"])
        return MagicMock()

    monkeypatch.setattr(build, "redis_client", recording)
    store = RedisStore("redis://127.0.0.1:6379", cluster=True, shards=16)
    exporter = build_exporter(store, tmp_path)
    assert flags == [True] and len(exporter.streams) == 16


async def test_a_lapsed_lease_taken_back_drops_the_batch_in_hand(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """While the lease was lapsed another exporter may have claimed the entries: taking
    it back is not a renewal, and the batch read before is not committed."""
    store = RedisStore(redis_url, prefix=prefix)
    [key] = store.event_stream_keys()
    recs = [varied_record(i) for i in range(50)]
    await store.record_many(recs)
    a = StreamExport(store.client, key, tmp_path, FAST, "exporter-a")
    assert await a.lease.claim() is Claim.TAKEN
    assert await a.lease.claim() is Claim.RENEWED
    assert await Lease(store.client, a.lease.key, "b", 1.0).claim() is Claim.HELD_BY_ANOTHER
    await a.take_over()
    batch, _ = await a._gather(asyncio.Event(), _nothing, True)
    assert len(batch) == 50

    await store.client.delete(a.lease.key)  # lapsed while A stalled
    with pytest.raises(LeaseLost, match="lapsed"):
        await a._commit(batch)
    assert not a.holding and archived_rows(tmp_path) == []
    await a.take_over()  # what the exporter does next
    assert (await a.step(asyncio.Event(), _nothing, drain=True))[0] == 50
    await store.close()
    assert_exactly_once(tmp_path, {rec.record_id for rec in recs})


async def test_the_exporter_takes_over_again_when_its_lease_was_taken_afresh(
    redis_url: str, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RedisStore(redis_url, prefix=prefix)
    exporter = ArchiveExporter(store.client, store.event_stream_keys(), tmp_path, FAST)
    [stream] = exporter.streams
    take_over = stream.take_over
    taken: list[bool] = []

    async def counting() -> None:
        taken.append(True)
        await take_over()

    monkeypatch.setattr(stream, "take_over", counting)
    await exporter._turn(stream)
    await exporter._turn(stream)  # renewed: nothing to take over
    assert len(taken) == 1
    await store.client.delete(stream.lease.key)  # lapsed between two turns
    await exporter._turn(stream)
    assert len(taken) == 2
    await stream.lease.release()
    await store.close()


async def test_a_group_made_by_a_call_whose_reply_was_lost_still_gets_its_baseline(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """XGROUP CREATE ran but its reply was lost, so the next try meets BUSYGROUP: what
    the stream lost before the archive began must still not count as dropped."""
    store = RedisStore(redis_url, prefix=prefix, stream_maxlen=100)
    await store.record_many([varied_record(i) for i in range(500)])
    [key] = store.event_stream_keys()
    await store.client.xgroup_create(key, GROUP, id="0")
    length = await store.client.xlen(key)
    exporter = ArchiveExporter(store.client, [key], tmp_path, FAST)
    assert await exporter.drain() == length
    stats = await exporter.streams[0].stats()
    assert (stats.backlog, stats.dropped) == (0, 0)
    await store.close()


async def test_a_gateway_reads_small_pages_off_its_event_loop_s_back(
    redis_url: str, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each XREADGROUP reply is parsed on the event loop the gateway's requests share."""
    assert ArchiveOptions().read_count == 200 < SIDECAR_READ_COUNT
    store = RedisStore(redis_url, prefix=prefix)
    await store.record_many([varied_record(i) for i in range(450)])
    counts: list[int] = []
    xreadgroup = store.client.xreadgroup

    async def recording(*args: Any, **kwargs: Any) -> Any:
        counts.append(kwargs["count"])
        return await xreadgroup(*args, **kwargs)

    monkeypatch.setattr(store.client, "xreadgroup", recording)
    options = dataclasses.replace(FAST, read_count=ArchiveOptions().read_count)
    assert (
        await ArchiveExporter(store.client, store.event_stream_keys(), tmp_path, options).drain()
        == 450
    )
    assert max(counts) == 200
    await store.close()


async def _nothing() -> None:
    return None
