"""The cost ledger the gateway talks to: a store, with a disk spool for outages.

The gateway calls `submit`, which only queues: a writer task sends what has queued up
in one pipelined batch (`record_many`), so under load many records share one Redis
round trip and no request ever waits on Redis. Neither `submit` nor `record` raises
because the store is down: the records go to the spool, the ledger turns `degraded`
and stops trying the store (so an outage costs no per-request timeouts); a background
task pings the store every interval and, once it answers, goes back to writing through
and replays the spool. Outages and recoveries are logged once each, not per request.
A ledger laid out over another shard count (`LedgerLayoutError`, which the gateway
checks at startup too) is handled as an outage: spooled, logged once, retried.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import date

from gateway.ledger.record import AggregateRow, SpendRecord
from gateway.ledger.shards import LedgerLayoutError
from gateway.ledger.spool import Spool
from gateway.ledger.store import LedgerStore, LedgerUnavailable
from gateway.tasks import start_background, stop_tasks

log = logging.getLogger(__name__)

# Records per pipelined write. Packing a record costs ~0.1 ms of event-loop time, so a
# batch blocks the loop for BATCH_MAX times that: small batches keep tail latency low.
BATCH_MAX = 32
# How long the writer lets records gather before a write: no request waits for it, and
# at a few hundred requests per second it turns one round trip per record into one
# per several.
LINGER_S = 0.005


class CostLedger:
    """Records spend exactly once, through store outages.

    >>> ledger = CostLedger(RedisStore(url), Spool(Path("spool.jsonl")))
    >>> ledger.start(); await ledger.record(rec); await ledger.stop()

    `aggregate`, `events` and `get` read the store directly and raise
    `LedgerUnavailable` while it is down (records still in the spool are not counted).
    """

    def __init__(
        self,
        store: LedgerStore,
        spool: Spool,
        replay_interval_s: float = 2.0,
        on_lost: Callable[[int], None] | None = None,
    ) -> None:
        self._store = store
        self._on_lost = on_lost  # told of each loss as it happens (a metrics counter)
        self._spool = spool
        self._interval = replay_interval_s
        self._store_down = False  # the store failed and has not answered a ping since
        self._in_episode = False  # an outage was logged and its recovery not yet
        self._layout_reported = False  # a shard-count mismatch is logged once
        self._dropped = 0
        self._task: asyncio.Task[None] | None = None
        self._queue: deque[SpendRecord] = deque()
        self._wakeup = asyncio.Event()
        self._in_flight: list[SpendRecord] = []  # taken off the queue, not yet written
        self._writer: asyncio.Task[None] | None = None
        self._stopped = False
        self._written_at = -math.inf  # time.monotonic() of the last batch the store took

    @property
    def degraded(self) -> bool:
        """True while the store is down or spooled records wait to be replayed."""
        return self._store_down or self._spool.pending > 0

    @property
    def spooled_count(self) -> int:
        return self._spool.pending

    @property
    def expired_count(self) -> int:
        """Spooled records too old to replay exactly once (`Spool.expired`)."""
        return self._spool.expired

    @property
    def dropped_count(self) -> int:
        """Records lost because the store was down and the spool could not be written."""
        return self._dropped

    def submit(self, rec: SpendRecord) -> None:
        """Queue `rec` for the writer task; returns at once (needs a running loop).
        After `stop()` (a stream settled late at shutdown) it goes to the spool."""
        if self._stopped:
            try:
                self._spool.append(rec)
            except OSError:
                self._lost(1)
                log.exception("cannot spool spend to %s after shutdown", self._spool.path)
            return
        self._queue.append(rec)
        self._wakeup.set()
        if self._writer is None or self._writer.done():
            self._writer = start_background(self._write_loop())

    async def record(self, rec: SpendRecord) -> None:
        """Write `rec` now, to the store or, if it is unreachable, to the spool."""
        await self._write([rec])

    async def flush(self, timeout_s: float) -> bool:
        """Wait until every submitted record is written or spooled; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self._queue or self._in_flight:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.005)
        return True

    async def _write_loop(self) -> None:
        while self._queue or not self._stopped:  # `stop` flushes the queue through here
            await self._wakeup.wait()
            await asyncio.sleep(LINGER_S)
            self._wakeup.clear()
            while self._queue:
                size = min(BATCH_MAX, len(self._queue))
                batch = self._in_flight = [self._queue.popleft() for _ in range(size)]
                try:
                    await self._write(batch)
                except Exception:  # a bug must not end the writer and strand the queue
                    log.exception("writing %d spend record(s) failed", len(batch))
                    await self._to_spool(batch)
                self._in_flight = []

    async def _write(self, batch: list[SpendRecord]) -> None:
        """Only `LedgerUnavailable` is absorbed; any other store error is a bug."""
        if not self._store_down:
            try:
                await self._store.record_many(batch)
                self._written_at = time.monotonic()
                return
            except (LedgerUnavailable, LedgerLayoutError) as exc:
                self._enter_outage(exc)
        await self._to_spool(batch)

    async def _to_spool(self, batch: list[SpendRecord]) -> None:
        try:
            await asyncio.to_thread(self._spool.append_many, batch)
        except OSError:
            self._lost(len(batch))
            log.exception(
                "cannot spool spend to %s; %d record(s) lost so far",
                self._spool.path,
                self._dropped,
            )

    def _lost(self, count: int) -> None:
        self._dropped += count
        if self._on_lost is not None:
            self._on_lost(count)

    async def aggregate(
        self, day_from: date, day_to: date, group_by: Sequence[str]
    ) -> list[AggregateRow]:
        return await self._store.aggregate(day_from, day_to, group_by)

    async def events(self, limit: int = 1000) -> list[SpendRecord]:
        return await self._store.events(limit)

    async def get(self, record_id: str) -> SpendRecord | None:
        return await self._store.get(record_id)

    def start(self) -> None:
        """Start the replay task (idempotent); needs a running event loop."""
        self._stopped = False
        if self._task is None:
            if self._spool.pending:
                log.info("%d spooled spend record(s) to replay", self._spool.pending)
            self._task = start_background(self._run())

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Write what is queued (or spool it), then stop the background tasks; spooled
        records stay on disk for the next start."""
        self._stopped = True  # from now on `submit` spools synchronously
        if not await self.flush(timeout_s):
            log.error("ledger writes did not finish in %.0fs; spooling the rest", timeout_s)
        tasks = (self._writer, self._task)
        self._writer = self._task = None
        self._wakeup.set()  # a writer that missed its cancel sees `_stopped` and ends
        await stop_tasks(*tasks)
        # A batch cut off mid-write may be in the store already: replay dedupes it.
        leftover = self._in_flight + list(self._queue)
        self._in_flight = []
        self._queue.clear()
        await self._to_spool(leftover)

    async def _run(self) -> None:
        while not self._stopped:
            try:
                if self.degraded:
                    await self.catch_up()
                else:
                    await self.check()
            except Exception:  # a bug here must not end the task and strand the spool
                log.exception("checking the store or replaying %s failed", self._spool.path)
            await asyncio.sleep(self._interval)

    async def check(self) -> None:
        """Ping the store while all is well and no batch has been written for a while,
        so that an outage shows (`degraded`, the log, /readyz) from startup on, before
        a record meets it. Under traffic the writes tell already, and a ping queued
        behind them could time out and fake an outage."""
        if time.monotonic() - self._written_at < self._interval:
            return
        if not await self._store.ping():
            self._enter_outage(LedgerUnavailable("it does not answer a ping"))

    async def catch_up(self) -> int:
        """One replay attempt if degraded and the store answers; returns records replayed."""
        if not self.degraded or not await self._store.ping():
            return 0
        self._store_down = False
        try:
            replayed = await self._spool.replay(self._store)
        except (LedgerUnavailable, LedgerLayoutError) as exc:
            self._enter_outage(exc)
            return 0
        if replayed:
            log.info("replayed %d spooled spend record(s) from %s", replayed, self._spool.path)
        if self._in_episode and not self.degraded:
            self._in_episode = False
            log.warning("ledger store is reachable again; spend is written through")
        return replayed

    def _enter_outage(self, exc: LedgerUnavailable | LedgerLayoutError) -> None:
        self._store_down = True
        if isinstance(exc, LedgerLayoutError):  # a misconfiguration, not an outage: said
            if not self._layout_reported:  # once, even inside an outage logged before it
                self._layout_reported = self._in_episode = True
                log.error("ledger store refused (%s); spooling spend to %s", exc, self._spool.path)
        elif not self._in_episode:
            self._in_episode = True
            log.warning(
                "ledger store unreachable (%s); spooling spend to %s", exc, self._spool.path
            )
