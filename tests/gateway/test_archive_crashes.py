"""The archive through crashes: an exporter killed after its files appeared but before
its ack, or in the middle of a file; two exporters on one stream and directory, one
killed, one paused past its lease; Redis killed and restarted mid-export. Every record
ends up in the archive exactly once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from gateway.ledger import CostLedger, RedisStore, Spool
from gateway.ledger.archive import ArchiveExporter
from gateway.ledger.archive import commit as commit_module
from gateway.ledger.archive.commit import LeaseLost, commit
from gateway.ledger.archive.files import write_durably
from gateway.ledger.archive.stream_export import StreamExport
from tests.gateway.archive_support import (
    FAST,
    REPO,
    archived_rows,
    assert_exactly_once,
    export_and_die,
    varied_record,
)
from tests.gateway.ledger_fixtures import RedisServer, delete_prefix
from tests.support import eventually_async


@pytest.fixture
async def prefix(redis_url: str) -> AsyncIterator[str]:
    prefix = f"cgtest-{uuid.uuid4().hex[:10]}:"
    yield prefix
    await delete_prefix(redis_url, prefix)


@pytest.mark.parametrize("point", ["after-rename", "mid-file"])
async def test_an_exporter_killed_before_its_ack_loses_and_repeats_nothing(
    redis_url: str, prefix: str, tmp_path: Path, point: str
) -> None:
    store = RedisStore(redis_url, prefix=prefix)
    recs = [varied_record(i, day=i % 2) for i in range(300)]
    await store.record_many(recs)
    assert export_and_die(redis_url, prefix, tmp_path, point) == -signal.SIGKILL
    if point == "after-rename":  # its files are on disk, every entry still pending
        assert len(archived_rows(tmp_path)) == 300
        [key] = store.event_stream_keys()
        assert (await store.client.xpending(key, "archive"))["pending"] == 300
    else:  # a temporary file, never a file the reports read
        assert archived_rows(tmp_path) == [] and list(tmp_path.glob("day=*/.*.tmp"))

    more = [varied_record(i) for i in range(300, 350)]
    await store.record_many(more)
    # A new exporter takes over once the dead one's lease (1 s) lapses.
    archived = await ArchiveExporter(
        store.client, store.event_stream_keys(), tmp_path, FAST
    ).drain()
    await store.close()
    assert archived == 350  # acked and counted, whoever wrote the files
    assert_exactly_once(tmp_path, {rec.record_id for rec in recs + more})
    assert not list(tmp_path.rglob("*.tmp"))  # the unfinished file was cleared


async def test_an_exporter_paused_past_its_lease_writes_nothing_its_successor_wrote(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """A holds the stream and reads a batch, then stalls (a GC pause, a stopped VM)
    while its lease lapses; B takes over, claims A's entries and archives them. A wakes:
    its commit refuses (the lease is gone), and a commit that got past that check finds
    every entry covered already and writes nothing."""
    store = RedisStore(redis_url, prefix=prefix)
    [key] = store.event_stream_keys()
    recs = [varied_record(i) for i in range(120)]
    await store.record_many(recs)
    a = StreamExport(store.client, key, tmp_path, FAST, "exporter-a")
    b = StreamExport(store.client, key, tmp_path, FAST, "exporter-b")
    assert await a.lease.claim()
    await a.take_over()
    batch = await a._read_pending() or (await a._gather(asyncio.Event(), _nothing, True))[0]
    assert len(batch) == 120

    await store.client.delete(a.lease.key)  # A's lease lapsed while it stalled
    assert await b.lease.claim()
    await b.take_over()
    archived, _ = await b.step(asyncio.Event(), _nothing)
    assert archived == 120

    with pytest.raises(LeaseLost):
        await a._commit(batch)
    files = sorted(tmp_path.rglob("*.parquet"))
    late = commit(tmp_path, a.slug, a._entries(batch), lambda: True)  # past the check
    assert late.covered == 120 and sorted(tmp_path.rglob("*.parquet")) == files
    await store.close()
    assert_exactly_once(tmp_path, {rec.record_id for rec in recs})


def _export_process(redis_url: str, prefix: str, root: Path) -> subprocess.Popen[bytes]:
    """`cascade-gateway spend export` as a fleet would run it beside each gateway."""
    env = {**os.environ, "REDIS_URL": redis_url, "CASCADE_REDIS_PREFIX": prefix}
    command = [sys.executable, "-m", "gateway.cli", "spend", "export", "--archive", str(root)]
    command += ["--flush-interval", "0.1", "--lease-ttl", "1", "--batch-max", "150"]
    return subprocess.Popen(command, cwd=REPO, env=env, stderr=subprocess.DEVNULL)


async def test_two_exporter_processes_on_one_stream_and_directory_archive_each_record_once(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """Both run while records arrive; the one holding the lease is SIGKILLed mid-run,
    the other takes over; then it is stopped with SIGTERM (a clean exit)."""
    store = RedisStore(redis_url, prefix=prefix)
    [key] = store.event_stream_keys()
    exporters = [_export_process(redis_url, prefix, tmp_path) for _ in range(2)]
    recs = [varied_record(i, day=i % 3) for i in range(1500)]
    try:
        for start in range(0, 750, 50):
            await store.record_many(recs[start : start + 50])
            await asyncio.sleep(0.02)
        owner = str(await eventually_async(lambda: store.client.get(f"{key}:archive:lease"), 10))
        holder = next(p for p in exporters if f":{p.pid}:" in owner)
        holder.kill()
        for start in range(750, 1500, 50):
            await store.record_many(recs[start : start + 50])
            await asyncio.sleep(0.02)
        [survivor] = [p for p in exporters if p is not holder]

        async def drained() -> bool:
            return await store.client.xlen(key) == 0

        await eventually_async(drained, 30, "the survivor to archive everything")
        survivor.send_signal(signal.SIGTERM)
        assert survivor.wait(timeout=20) == 0
    finally:
        for process in exporters:
            process.kill()
            process.wait()
    await store.close()
    assert_exactly_once(tmp_path, {rec.record_id for rec in recs})


async def test_redis_restarted_during_export_loses_and_repeats_nothing(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """The ledger spools while Redis is away and replays after; the exporter logs,
    waits and resumes; nothing is lost from, or repeated in, the archive."""
    prefix = f"cgtest-{uuid.uuid4().hex[:10]}:"
    store = RedisStore(redis_server.url, prefix=prefix)
    ledger = CostLedger(store, Spool(tmp_path / "spool"), replay_interval_s=0.1)
    ledger.start()
    root = tmp_path / "archive"
    exporter = ArchiveExporter(store.client, store.event_stream_keys(), root, FAST)
    exporter.start()
    recs = [varied_record(i, day=i % 2) for i in range(900)]
    for n, start in enumerate(range(0, 900, 30)):
        if n == 10:
            redis_server.kill()
        if n == 20:
            redis_server.start()
        for rec in recs[start : start + 30]:
            ledger.submit(rec)
        await asyncio.sleep(0.05)

    async def archived_all() -> bool:
        return ledger.spooled_count == 0 and len(archived_rows(root)) >= len(recs)

    await eventually_async(archived_all, 30, "every record archived", every_s=0.2)
    await exporter.stop()
    await ledger.stop()
    await store.close()
    assert_exactly_once(root, {rec.record_id for rec in recs})


async def test_redis_killed_between_a_file_and_its_ack_repeats_nothing(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis dies right after the first file appears: the ack fails, the exporter
    retries until Redis is back (its AOF kept the entries pending), then finds them
    archived already and only acks them."""
    prefix = f"cgtest-{uuid.uuid4().hex[:10]}:"
    store = RedisStore(redis_server.url, prefix=prefix)
    recs = [varied_record(i) for i in range(200)]
    await store.record_many(recs)
    killed = threading.Event()

    def write_then_kill(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
        write_durably(path, rows)
        if not killed.is_set():
            killed.set()
            redis_server.kill()

    monkeypatch.setattr(commit_module, "write_durably", write_then_kill)
    exporter = ArchiveExporter(store.client, store.event_stream_keys(), tmp_path, FAST)
    exporter.start()
    await eventually_async(killed.is_set, 10, "the first file")
    assert len(archived_rows(tmp_path)) == 200  # written, not acked
    await asyncio.sleep(0.5)  # the exporter fails and retries meanwhile
    redis_server.start()
    [key] = store.event_stream_keys()

    async def acked() -> bool:
        return await store.client.xlen(key) == 0

    await eventually_async(acked, 10, "the entries acked")
    await exporter.stop()
    await store.close()
    assert_exactly_once(tmp_path, {rec.record_id for rec in recs})


async def _nothing() -> None:
    return None
