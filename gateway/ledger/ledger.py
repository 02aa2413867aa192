"""The cost ledger the gateway talks to: a store, with a disk spool for outages.

`record` never raises because the store is down: the record goes to the spool, the
ledger turns `degraded` and stops trying the store on the request path (so an outage
costs no per-request timeouts); a background task pings the store every interval and,
once it answers, goes back to writing through and replays the spool. Outages and
recoveries are logged once each, not per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from datetime import date

from gateway.ledger.record import AggregateRow, SpendRecord
from gateway.ledger.spool import Spool
from gateway.ledger.store import LedgerStore, LedgerUnavailable

logger = logging.getLogger(__name__)


class CostLedger:
    """Records spend exactly once, through store outages.

    >>> ledger = CostLedger(RedisStore(url), Spool(Path("spool.jsonl")))
    >>> ledger.start(); await ledger.record(rec); await ledger.stop()

    `aggregate`, `events` and `get` read the store directly and raise
    `LedgerUnavailable` while it is down (records still in the spool are not counted).
    """

    def __init__(self, store: LedgerStore, spool: Spool, replay_interval_s: float = 2.0) -> None:
        self._store = store
        self._spool = spool
        self._interval = replay_interval_s
        self._store_down = False  # the store failed and has not answered a ping since
        self._in_episode = False  # an outage was logged and its recovery not yet
        self._dropped = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def degraded(self) -> bool:
        """True while the store is down or spooled records wait to be replayed."""
        return self._store_down or self._spool.pending > 0

    @property
    def spooled_count(self) -> int:
        return self._spool.pending

    @property
    def dropped_count(self) -> int:
        """Records lost because the store was down and the spool could not be written."""
        return self._dropped

    async def record(self, rec: SpendRecord) -> None:
        """Write `rec` to the store, or to the spool if the store is unreachable.

        Only `LedgerUnavailable` is absorbed; any other store error is a bug and propagates.
        """
        if not self._store_down:
            try:
                await self._store.record(rec)
                return
            except LedgerUnavailable as exc:
                self._enter_outage(exc)
        try:
            await asyncio.to_thread(self._spool.append, rec)
        except OSError:
            self._dropped += 1
            if self._dropped == 1 or self._dropped % 1000 == 0:
                logger.exception(
                    "cannot spool spend to %s; %d record(s) lost", self._spool.path, self._dropped
                )

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
        if self._task is None:
            if self._spool.pending:
                logger.info("%d spooled spend record(s) to replay", self._spool.pending)
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop the replay task; spooled records stay on disk for the next start."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.catch_up()
            except Exception:  # a bug here must not end the task and strand the spool
                logger.exception("spend replay from %s failed", self._spool.path)

    async def catch_up(self) -> int:
        """One replay attempt if degraded and the store answers; returns records replayed."""
        if not self.degraded or not await self._store.ping():
            return 0
        self._store_down = False
        try:
            replayed = await self._spool.replay(self._store)
        except LedgerUnavailable as exc:
            self._enter_outage(exc)
            return 0
        if replayed:
            logger.info("replayed %d spooled spend record(s) from %s", replayed, self._spool.path)
        if self._in_episode and not self.degraded:
            self._in_episode = False
            logger.warning("ledger store is reachable again; spend is written through")
        return replayed

    def _enter_outage(self, exc: LedgerUnavailable) -> None:
        self._store_down = True
        if not self._in_episode:
            self._in_episode = True
            logger.warning(
                "ledger store unreachable (%s); spooling spend to %s", exc, self._spool.path
            )
