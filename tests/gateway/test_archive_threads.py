"""The archive's file work runs on the exporter's own thread, never the event loop's
default pool (the request path's prompt counting uses it), and a commit waiting for the
directory lock gives up when the exporter stops or its lease runs out."""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from gateway.ledger import RedisStore
from gateway.ledger.archive import GROUP, ArchiveExporter
from gateway.ledger.archive import commit as commit_module
from gateway.ledger.archive.commit import LeaseLost, commit
from gateway.ledger.archive.files import LockNotTaken, directory_lock, write_durably
from gateway.ledger.archive.layout import LOCK_NAME
from gateway.ledger.archive.stream_export import StreamExport
from tests.gateway.archive_support import FAST, archived_rows, varied_record
from tests.gateway.ledger_fixtures import delete_prefix


@pytest.fixture
async def prefix(redis_url: str) -> AsyncIterator[str]:
    prefix = f"cgtest-{uuid.uuid4().hex[:10]}:"
    yield prefix
    await delete_prefix(redis_url, prefix)


@pytest.fixture
def held_lock(tmp_path: Path) -> Iterator[None]:
    """The archive directory's lock, held as another process's stuck commit would."""
    fd = os.open(tmp_path / LOCK_NAME, os.O_WRONLY | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield
    os.close(fd)


async def test_files_are_written_on_the_exporter_s_own_thread(
    redis_url: str, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: set[str] = set()

    def recording(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
        threads.add(threading.current_thread().name)
        write_durably(path, rows)

    monkeypatch.setattr(commit_module, "write_durably", recording)
    store = RedisStore(redis_url, prefix=prefix)
    await store.record_many([varied_record(i, day=i % 2) for i in range(20)])
    exporter = ArchiveExporter(store.client, store.event_stream_keys(), tmp_path, FAST)
    assert await exporter.drain() == 20
    await exporter.close()
    await store.close()
    assert len(threads) == 1 and next(iter(threads)).startswith("ledger-archive")


async def test_stop_does_not_wait_for_a_directory_lock_held_elsewhere(
    redis_url: str, prefix: str, tmp_path: Path, held_lock: None
) -> None:
    store = RedisStore(redis_url, prefix=prefix)
    await store.record_many([varied_record(i) for i in range(20)])
    exporter = ArchiveExporter(store.client, store.event_stream_keys(), tmp_path, FAST)
    exporter.start()
    await asyncio.sleep(0.5)  # it holds the lease, and waits for the lock
    started = time.monotonic()
    await asyncio.wait_for(exporter.stop(), 5)
    assert time.monotonic() - started < 1
    [key] = store.event_stream_keys()
    assert archived_rows(tmp_path) == []
    assert await store.client.get(f"{key}:archive:lease") is None  # handed back
    await store.close()


async def test_a_commit_waiting_for_the_lock_stops_when_its_lease_runs_out(
    redis_url: str, prefix: str, tmp_path: Path, held_lock: None
) -> None:
    store = RedisStore(redis_url, prefix=prefix)
    [key] = store.event_stream_keys()
    await store.record_many([varied_record(i) for i in range(5)])
    stream = StreamExport(store.client, key, tmp_path, FAST, "exporter-a")
    assert await stream.lease.claim()
    await store.client.xgroup_create(key, GROUP, id="0")
    entries = stream._entries(await stream._read(">", 10))
    deadline = time.monotonic() + 0.3
    with pytest.raises(LeaseLost, match="ran out waiting"):
        commit(tmp_path, stream.slug, entries, lambda: time.monotonic() < deadline)
    with pytest.raises(LockNotTaken):
        commit(tmp_path, stream.slug, entries, lambda: True, stopping=lambda: True)
    with pytest.raises(LockNotTaken), directory_lock(tmp_path, lambda: False):
        pass
    await store.close()
