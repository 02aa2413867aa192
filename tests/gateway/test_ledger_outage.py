"""Redis outages: spooling, exactly-once replay, and a damaged spool.

The outage tests run their own `redis-server` (see `RedisServer`) so they can kill,
pause and restart it without touching the shared Redis.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import threading
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import orjson
import pytest

from gateway.ledger import (
    CostLedger,
    LedgerStore,
    LedgerUnavailable,
    MemoryStore,
    RedisStore,
    SpendRecord,
    Spool,
)
from gateway.ledger.spool import _to_thread
from tests.gateway.ledger_fixtures import (
    DAY0,
    OUTAGE_DB,
    RedisServer,
    StoreFactory,
    expected_rows,
    make_record,
    store_factory,
)

WIDE = (DAY0 - timedelta(days=30), DAY0 + timedelta(days=30))


@pytest.fixture
async def private_store(redis_server: RedisServer) -> AsyncIterator[RedisStore]:
    store = RedisStore(redis_server.url)
    yield store
    await store.close()


@pytest.fixture(params=["redis", "memory"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[LedgerStore]:
    factory: StoreFactory
    async for factory in store_factory(request.param, OUTAGE_DB):
        yield await factory()


async def wait_until_recovered(ledger: CostLedger, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while ledger.degraded:
        assert time.monotonic() < deadline, f"still degraded, {ledger.spooled_count} spooled"
        await asyncio.sleep(0.05)


async def assert_exactly(store: LedgerStore, records: list[SpendRecord]) -> None:
    """`store` holds each of `records` once, and nothing else."""
    events = await store.events(limit=10_000)
    assert sorted(e.record_id for e in events) == sorted(r.record_id for r in records)
    for rec in records:
        assert await store.get(rec.record_id) == rec
    for group_by in ([], ["team", "model"], ["day", "deployment"]):
        assert await store.aggregate(*WIDE, group_by) == expected_rows(records, group_by)


def outage_messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_killed_redis_spools_then_replays_exactly_once(
    redis_server: RedisServer,
    private_store: RedisStore,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.ledger")
    ledger = CostLedger(private_store, Spool(tmp_path / "spool.jsonl"), replay_interval_s=0.1)
    ledger.start()
    records = [make_record(i, day=i % 3) for i in range(40)]
    try:
        for rec in records[:10]:
            await ledger.record(rec)
        assert not ledger.degraded

        redis_server.kill()
        for rec in records[10:30]:
            await ledger.record(rec)  # never raises
        assert ledger.degraded
        assert ledger.spooled_count == 20
        with pytest.raises(LedgerUnavailable):
            await ledger.aggregate(*WIDE, [])

        redis_server.start()
        await wait_until_recovered(ledger)
        for rec in records[30:]:
            await ledger.record(rec)
    finally:
        await ledger.stop()
    assert ledger.spooled_count == 0
    assert not (tmp_path / "spool.jsonl.replaying").exists()
    await assert_exactly(private_store, records)
    # One line for the outage, one for the recovery: not one per request.
    messages = outage_messages(caplog)
    assert len(messages) == 2, messages
    assert "unreachable" in messages[0]
    assert "reachable again" in messages[1]


async def test_hung_redis_times_out_and_in_flight_record_counts_once(
    redis_server: RedisServer, private_store: RedisStore, tmp_path: Path
) -> None:
    """A paused Redis still runs the EVALSHA that timed out once it resumes; the same
    record is also in the spool, and the replay must not count it twice."""
    ledger = CostLedger(private_store, Spool(tmp_path / "spool.jsonl"), replay_interval_s=0.1)
    ledger.start()
    records = [make_record(i) for i in range(12)]
    try:
        for rec in records[:4]:
            await ledger.record(rec)
        redis_server.pause()
        started = time.monotonic()
        for rec in records[4:8]:
            await ledger.record(rec)
        # The first call waits out the timeouts; the rest go straight to the spool.
        assert time.monotonic() - started < 5
        assert ledger.spooled_count == 4
        redis_server.resume()
        await wait_until_recovered(ledger)
        for rec in records[8:]:
            await ledger.record(rec)
    finally:
        await ledger.stop()
    await assert_exactly(private_store, records)


class FlakyStore:
    """Passes `fail_after` records through to `inner`, then acts unreachable."""

    def __init__(self, inner: LedgerStore, fail_after: int) -> None:
        self.inner = inner
        self.fail_after = fail_after

    async def record(self, rec: SpendRecord) -> bool:
        if self.fail_after <= 0:
            raise LedgerUnavailable("flaky store is down")
        self.fail_after -= 1
        return await self.inner.record(rec)

    async def record_many(self, recs: list[SpendRecord]) -> list[bool]:
        """Writes what it can before failing, as a pipeline cut off mid-way would."""
        return [await self.record(rec) for rec in recs]


async def test_replay_after_partial_replay_does_not_double_count(
    store: LedgerStore, tmp_path: Path
) -> None:
    spool = Spool(tmp_path / "spool.jsonl")
    records = [make_record(i, day=i % 2) for i in range(20)]
    for rec in records:
        spool.append(rec)

    flaky = FlakyStore(store, fail_after=8)
    with pytest.raises(LedgerUnavailable):
        await spool.replay(flaky)  # type: ignore[arg-type]
    # Nothing is forgotten until everything was accepted.
    assert spool.pending == 20
    assert spool.replaying_path.exists()

    # Records spooled meanwhile wait in a fresh file behind the interrupted one.
    late = [make_record(i) for i in range(20, 25)]
    for rec in late:
        spool.append(rec)
    restarted = Spool(tmp_path / "spool.jsonl")  # as after a process restart
    assert restarted.pending == 25
    assert await restarted.replay(store) == 25
    assert restarted.pending == 0
    assert not spool.replaying_path.exists()
    assert not spool.path.exists()
    await assert_exactly(store, records + late)


async def test_a_rename_never_lands_on_a_file_still_to_be_replayed(
    store: LedgerStore, tmp_path: Path
) -> None:
    """A replay cancelled at shutdown leaves its thread to finish the rename while the
    next replay starts: that one must replay the renamed file first, never rename the
    new live file over it."""
    spool = Spool(tmp_path / "spool.jsonl")
    first = [make_record(i) for i in range(5)]
    for rec in first:
        spool.append(rec)
    spool.path.rename(spool.replaying_path)  # the cancelled replay's thread
    later = [make_record(i) for i in range(5, 8)]
    for rec in later:  # a record spooled at shutdown: a fresh live file
        spool.append(rec)
    assert spool._rotate()  # the next replay: what waits first, nothing renamed over it
    assert len(spool.replaying_path.read_bytes().splitlines()) == 5
    assert await Spool(spool.path).replay(store) == 8
    await assert_exactly(store, first + later)


def test_rotate_renames_only_the_file_it_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between opening the live file and locking it, another process may replay and
    remove that file and an append start a fresh one: the rename must not move the
    fresh file, whose appender holds the lock on it and may still be writing."""
    spool = Spool(tmp_path / "spool.jsonl")
    spool.append(make_record(0))
    real_flock = fcntl.flock
    swapped = False

    def replayed_by_another_process_first(fd: int, operation: int) -> None:
        nonlocal swapped
        if not swapped:
            swapped = True
            spool.path.unlink()  # the other process replayed it
            Spool(spool.path).append(make_record(1))  # a fresh live file
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", replayed_by_another_process_first)
    assert not spool._rotate()
    assert swapped
    assert not spool.replaying_path.exists()
    assert len(spool.path.read_bytes().splitlines()) == 1


async def test_appends_during_replay_are_not_lost(store: LedgerStore, tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.jsonl")
    records = [make_record(i) for i in range(10)]
    late = [make_record(i) for i in range(10, 13)]
    for rec in records:
        spool.append(rec)

    class AppendingStore:
        async def record(self, rec: SpendRecord) -> bool:
            if rec.record_id == "req-5":  # appends land mid-replay, from other threads
                await asyncio.gather(*(asyncio.to_thread(spool.append, r) for r in late))
            return await store.record(rec)

        async def record_many(self, recs: list[SpendRecord]) -> list[bool]:
            return [await self.record(rec) for rec in recs]

    # They went to a fresh live file, which the same replay sends after the first.
    assert await spool.replay(AppendingStore()) == 13  # type: ignore[arg-type]
    assert spool.pending == 0
    assert not spool.path.exists()
    await assert_exactly(store, records + late)


async def test_corrupt_trailing_line_is_skipped(
    store: LedgerStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "spool.jsonl"
    spool = Spool(path)
    records = [make_record(i) for i in range(5)]
    for rec in records:
        spool.append(rec)
    with path.open("ab") as file:
        file.write(b'{"record_id": "req-99", "request_id": "re')  # a write cut short
    assert await Spool(path).replay(store) == 6
    await assert_exactly(store, records)
    assert not path.exists()
    warnings = outage_messages(caplog)
    assert len(warnings) == 1
    assert "spool.jsonl.replaying:6" in warnings[0]


async def test_append_after_a_cut_short_line_starts_a_new_line(
    store: LedgerStore, tmp_path: Path
) -> None:
    path = tmp_path / "spool.jsonl"
    spool = Spool(path)
    spool.append(make_record(1))
    with path.open("ab") as file:
        file.write(b'{"record_id": "req-2", "tea')
    spool.append(make_record(3))  # e.g. after the crash, in the restarted process
    await spool.replay(store)
    await assert_exactly(store, [make_record(1), make_record(3)])


async def test_ledger_replays_a_spool_left_by_a_previous_run(tmp_path: Path) -> None:
    path = tmp_path / "spool.jsonl"
    records = [make_record(i) for i in range(6)]
    for rec in records:
        Spool(path).append(rec)
    store = MemoryStore()
    ledger = CostLedger(store, Spool(path), replay_interval_s=0.05)
    assert ledger.degraded
    assert ledger.spooled_count == 6
    ledger.start()
    try:
        await wait_until_recovered(ledger)
    finally:
        await ledger.stop()
    await assert_exactly(store, records)


@pytest.mark.parametrize("kind", ["redis", "memory"])
async def test_a_spooled_record_older_than_the_dedupe_window_is_kept_not_replayed(
    tmp_path: Path, kind: str
) -> None:
    """Its marker may be gone (here: written, then expired), so a replay could count it
    twice: it goes to the spool's .expired file, counted, and the ledger holds it once.
    A record spooled within the window is replayed, however old its own time."""
    async for make in store_factory(kind, OUTAGE_DB):
        store = await make(dedupe_ttl_s=1)
        stale, fresh = make_record(1), make_record(2)
        assert await store.record(stale)
        spool = Spool(tmp_path / "spool.jsonl", window_s=1)
        spool.append(stale)  # a write that failed after Redis took it
        await asyncio.sleep(1.2)  # its marker expires: a second write would count again
        spool.append(fresh)
        assert await spool.replay(store) == 2
        assert spool.expired == 1 and spool.pending == 0
        kept = spool.expired_path.read_bytes().splitlines()
        assert [SpendRecord.from_dict(orjson.loads(line)) for line in kept] == [stale]
        assert Spool(tmp_path / "spool.jsonl", window_s=1).expired == 1  # a restart sees it
        assert await store.get(fresh.record_id) == fresh
        rows = await store.aggregate(*WIDE, [])
        assert rows[0].requests == 2  # stale once (before the outage), fresh once


async def test_batch_after_redis_restart_reloads_the_script(
    redis_server: RedisServer, private_store: RedisStore
) -> None:
    first = [make_record(i) for i in range(5)]
    assert await private_store.record_many(first) == [True] * 5
    redis_server.kill()  # scripts live in memory only: the restarted server has none
    redis_server.start()
    second = [make_record(i) for i in range(5, 12)]
    assert await private_store.record_many(second) == [True] * 7
    await assert_exactly(private_store, first + second)


async def test_submitted_records_are_batched_and_flushed(tmp_path: Path) -> None:
    store = MemoryStore()
    ledger = CostLedger(store, Spool(tmp_path / "spool"))
    ledger.start()
    records = [make_record(i) for i in range(600)]
    for rec in records:
        ledger.submit(rec)
    assert await ledger.flush(10)
    await assert_exactly(store, records)
    ledger.submit(make_record(600))
    await ledger.stop()  # stop flushes what is still queued
    assert len(await store.events(limit=10_000)) == 601


class CancelEatingStore(MemoryStore):
    """A ping that eats the cancel meeting it, as `asyncio.timeout` can on Python 3.11
    when its deadline expires at the same moment (redis-py times its reads with it)."""

    async def ping(self) -> bool:
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            return False
        return True


async def test_stop_ends_the_ledger_s_tasks_even_if_a_store_call_eats_the_cancel(
    tmp_path: Path,
) -> None:
    store = CancelEatingStore()
    ledger = CostLedger(store, Spool(tmp_path / "spool"), replay_interval_s=0)
    ledger.start()
    ledger.submit(make_record(1))
    await asyncio.sleep(0.1)  # the replay task pings all the while
    await asyncio.wait_for(ledger.stop(), 5)
    assert await store.get("req-1") is not None and ledger.spooled_count == 0


async def test_a_cancelled_stop_is_cancelled(tmp_path: Path) -> None:
    """`stop` waits for the ledger's tasks without swallowing a cancel of its own."""
    ledger = CostLedger(MemoryStore(), Spool(tmp_path / "spool"))
    ledger.start()
    stopping = asyncio.ensure_future(ledger.stop())
    await asyncio.sleep(0)
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping


async def test_a_cancelled_replay_waits_for_its_file_work_to_end() -> None:
    """Cancelled, even twice, while its rename or unlink runs in a thread, a replay ends
    only after the thread has: the replay lock outlasts the file work."""
    started, release = threading.Event(), threading.Event()
    done: list[str] = []

    def file_work() -> None:
        started.set()
        release.wait(5)
        done.append("renamed")

    replay = asyncio.ensure_future(_to_thread(file_work))
    await asyncio.to_thread(started.wait, 5)
    replay.cancel()
    await asyncio.sleep(0.05)
    replay.cancel()
    await asyncio.sleep(0.05)
    assert not replay.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await replay
    assert done == ["renamed"]
