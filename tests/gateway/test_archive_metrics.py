"""The archive's backlog and dropped figures, against what was written, read and
trimmed: MAXLEN trimming unread entries, and entries trimmed while a dead exporter held
them."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from gateway.ledger import RedisStore
from gateway.ledger.archive import GROUP, ArchiveExporter
from gateway.metrics import ArchiveMetrics
from tests.gateway.archive_support import FAST, archived_rows, varied_record
from tests.gateway.ledger_fixtures import delete_prefix

ALERTS = Path(__file__).resolve().parents[2] / "dashboards" / "alerts" / "budgets.yaml"


@pytest.fixture
async def prefix(redis_url: str) -> AsyncIterator[str]:
    prefix = f"cgtest-{uuid.uuid4().hex[:10]}:"
    yield prefix
    await delete_prefix(redis_url, prefix)


class Gauges:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.metrics = ArchiveMetrics(self.registry)

    def value(self, name: str, stream: str) -> float | None:
        return self.registry.get_sample_value(name, {"stream": stream})


async def test_backlog_and_dropped_count_what_maxlen_trimmed_before_export(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    store = RedisStore(redis_url, prefix=prefix, stream_maxlen=250)
    [key] = store.event_stream_keys()
    gauges = Gauges()
    exporter = ArchiveExporter(store.client, [key], tmp_path, FAST, gauges.metrics, 250)
    assert await exporter.drain() == 0  # the group exists from here on
    [stream] = exporter.streams
    await store.record_many([varied_record(i) for i in range(1000)])

    length = await store.client.xlen(key)
    assert 250 <= length < 1000  # MAXLEN ~ trims whole nodes
    stats = await stream.stats()
    assert (stats.backlog, stats.pending, stats.dropped) == (length, 0, 1000 - length)

    assert await exporter.drain() == length
    assert len(archived_rows(tmp_path)) == length
    stats = await stream.stats()
    assert (stats.backlog, stats.dropped) == (0, 1000 - length)  # dropped stays dropped
    assert gauges.value("cascade_ledger_archive_backlog_records", key) == 0
    assert gauges.value("cascade_ledger_archive_dropped_records", key) == 1000 - length
    assert gauges.value("cascade_ledger_archive_stream_cap", key) == 250
    assert gauges.value("cascade_ledger_archived_records_total", key) == length

    await store.record_many([varied_record(i) for i in range(1000, 1100)])
    stats = await stream.stats()
    assert (stats.backlog, stats.dropped) == (100, 1000 - length)  # nothing new lost
    await store.close()


async def test_entries_trimmed_while_a_dead_exporter_held_them_count_as_dropped(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """Pending entries are not archived yet: backlog while they may still be written,
    dropped once the successor finds their content gone."""
    store = RedisStore(redis_url, prefix=prefix)
    [key] = store.event_stream_keys()
    exporter = ArchiveExporter(store.client, [key], tmp_path, FAST)
    await exporter.drain()
    [stream] = exporter.streams
    await store.record_many([varied_record(i) for i in range(40)])
    await store.client.xreadgroup(GROUP, "dead-exporter", {key: ">"}, count=10)
    await store.client.xtrim(key, maxlen=25, approximate=False)  # 10 pending, 5 unread

    stats = await stream.stats()
    assert (stats.length, stats.pending, stats.backlog, stats.dropped) == (25, 10, 35, 5)
    assert await exporter.drain() == 25
    stats = await stream.stats()
    assert (stats.length, stats.pending, stats.backlog, stats.dropped) == (0, 0, 0, 15)
    await store.close()


async def test_what_the_stream_lost_before_the_archive_began_is_not_dropped(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    store = RedisStore(redis_url, prefix=prefix, stream_maxlen=100)
    await store.record_many([varied_record(i) for i in range(500)])
    [key] = store.event_stream_keys()
    length = await store.client.xlen(key)
    exporter = ArchiveExporter(store.client, [key], tmp_path, FAST)
    assert await exporter.drain() == length
    stats = await exporter.streams[0].stats()
    assert (stats.backlog, stats.dropped) == (0, 0)
    await store.close()


def backlog_alert_share() -> float:
    """The share of the stream's cap at which CascadeLedgerArchiveBacklogNearCap fires."""
    [rules] = [group["rules"] for group in yaml.safe_load(ALERTS.read_text())["groups"]]
    [rule] = [rule for rule in rules if rule["alert"] == "CascadeLedgerArchiveBacklogNearCap"]
    found = re.fullmatch(
        r"max by \(stream\) \(cascade_ledger_archive_backlog_records\)\s*"
        r"> ([\d.]+) \* max by \(stream\) \(cascade_ledger_archive_stream_cap\)",
        rule["expr"].strip(),
    )
    assert found, rule["expr"]
    return float(found.group(1))


async def test_the_backlog_alert_fires_before_maxlen_drops_anything(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """An exporter that stopped: the backlog passes the alert's share of the cap while
    the dropped count is still 0."""
    cap = 1000
    store = RedisStore(redis_url, prefix=prefix, stream_maxlen=cap)
    exporter = ArchiveExporter(store.client, store.event_stream_keys(), tmp_path, FAST)
    await exporter.drain()
    await store.record_many([varied_record(i) for i in range(int(cap * 0.9))])
    stats = await exporter.streams[0].stats()
    assert stats.backlog > backlog_alert_share() * cap
    assert stats.dropped == 0
    await store.close()
