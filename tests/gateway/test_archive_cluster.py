"""The archive of a ledger spread over a Redis Cluster's masters (tests/cluster.py):
one stream per shard, each with its own lease, group and figures; every record archived
exactly once, and the report equal to the cluster ledger's."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from gateway.ledger import RedisStore
from gateway.ledger.archive import build_exporter
from gateway.settings import CLUSTER_LEDGER_SHARDS
from gateway.spend.archive_report import ArchiveAggregates
from tests.cluster import LocalCluster, redis_cluster
from tests.gateway.archive_support import FAST, assert_exactly_once, varied_record
from tests.gateway.ledger_fixtures import DAY0

__all__ = ["redis_cluster"]


@pytest.fixture
def prefix(redis_cluster: LocalCluster) -> Iterator[str]:
    prefix = f"cgtest-{uuid.uuid4().hex[:10]}:"
    yield prefix
    redis_cluster.delete_prefix(prefix)


async def test_a_sharded_cluster_ledger_is_archived_once_per_record(
    redis_cluster: LocalCluster, prefix: str, tmp_path: Path
) -> None:
    store = RedisStore(redis_cluster.url, prefix=prefix, cluster=True, shards=CLUSTER_LEDGER_SHARDS)
    recs = [varied_record(i, day=i % 3) for i in range(800)]
    await store.record_many(recs)
    streams = store.event_stream_keys()
    assert len(streams) == CLUSTER_LEDGER_SHARDS
    exporter = build_exporter(store, tmp_path, FAST)  # its own cluster client, as deployed
    assert await exporter.drain() == 800
    for stream in exporter.streams:
        stats = await stream.stats()
        assert (stats.backlog, stats.dropped) == (0, 0)

    days = (DAY0, DAY0 + timedelta(days=2))
    for group_by in ([], ["team", "day"], ["model", "route"]):
        assert await ArchiveAggregates(tmp_path).aggregate(*days, group_by) == (
            await store.aggregate(*days, group_by)
        )
    await exporter.close()
    await store.close()
    assert_exactly_once(tmp_path, {rec.record_id for rec in recs})
