"""The Redis ledger store: one Lua script per record, Cluster-safe keys.

Keys (`P` is the prefix, default `cg:`; every key carries the `{ledger}` hash tag so a
Redis Cluster keeps them in one slot and the script may touch them all):

    P{ledger}:rec:<record_id>        string  the record's JSON; SET NX makes it the
                                             de-duplication marker too (dedupe_ttl_s,
                                             the dedupe window: 48 h by default)
    P{ledger}:day:<YYYY-MM-DD>       hash    `<metric>|<JSON [team,key,route,tier,
                                             deployment,model]>` -> int (aggregate_ttl_s)
    P{ledger}:day:<YYYY-MM-DD>:<dim> hash    `<metric>|<value>` -> int, one per dimension
                                             (aggregate_ttl_s)
    P{ledger}:days                   zset    days with data, score = date.toordinal()
                                             (aggregate_ttl_s)
    P{ledger}:events                 stream  `id`, `json` per record, MAXLEN ~ stream_maxlen

Metric names contain no `|`, so a field splits unambiguously at its first `|` whatever
the values hold; the full tuple is JSON so its parts cannot run into each other. Zero
amounts are not written, so a metric added later (`sla_met`, `sla_missed`) simply reads
as 0 for days written before it, and older readers skip metrics they do not know.
Expiries on aggregate keys are refreshed on every write.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import date
from typing import Any, TypeVar, cast

import orjson
from redis import exceptions as redis_errors
from redis.asyncio import Redis

from gateway.ledger.record import DIMENSIONS, AggregateRow, SpendRecord
from gateway.ledger.rollup import METRICS, Rollup, check_group_by, metrics_of
from gateway.ledger.store import DEDUPE_WINDOW_S, LedgerUnavailable
from gateway.redis_client import address, redis_client

# Errors that mean "no usable Redis there" (BusyLoadingError and auth failures are
# ConnectionErrors; READONLY is what a demoted primary answers during failover;
# InvalidResponse is something other than Redis, e.g. a proxy, on the port).
_UNREACHABLE = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.ReadOnlyError,
    redis_errors.InvalidResponse,
    OSError,
)

# KEYS: 1 rec, 2 day hash, 3..8 per-dimension hashes (DIMENSIONS order), 9 days, 10 events.
# ARGV: 1 record JSON, 2 dedupe ttl, 3 aggregate ttl, 4 stream maxlen, 5 day score,
#       6 day, 7 record_id, 8 dimension-tuple JSON, 9.. metric amounts (METRICS order).
# The dimension values are decoded from ARGV[8] in Lua (they are strings); the amounts
# stay separate arguments because cjson would round large integers.
_RECORD_LUA = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
  return 0
end
local dims = cjson.decode(ARGV[8])
local metrics = {__METRICS__}
for m = 1, #metrics do
  local amount = ARGV[8 + m]
  if amount ~= '0' then
    redis.call('HINCRBY', KEYS[2], metrics[m] .. '|' .. ARGV[8], amount)
    for d = 1, 6 do
      redis.call('HINCRBY', KEYS[2 + d], metrics[m] .. '|' .. dims[d], amount)
    end
  end
end
redis.call('ZADD', KEYS[9], ARGV[5], ARGV[6])
for k = 2, 9 do
  redis.call('EXPIRE', KEYS[k], ARGV[3])
end
redis.call('XADD', KEYS[10], 'MAXLEN', '~', ARGV[4], '*', 'id', ARGV[7], 'json', ARGV[1])
return 1
""".replace("__METRICS__", ", ".join(f"'{name}'" for name in METRICS))


class RedisStore:
    """A `LedgerStore` on Redis (standalone or Cluster), via `redis.asyncio`.

    `record` is one EVALSHA round trip; `record_many` pipelines a batch of them.
    Connection failures raise `LedgerUnavailable` within about `socket_timeout` (one
    retry, for a pooled connection Redis dropped).

    >>> store = RedisStore("redis://localhost:6379/0"); await store.record(rec)
    """

    def __init__(
        self,
        url: str,
        prefix: str = "cg:",
        stream_maxlen: int = 100_000,
        dedupe_ttl_s: int = DEDUPE_WINDOW_S,
        aggregate_ttl_s: int = 400 * 86400,
        *,
        max_connections: int = 64,
        socket_connect_timeout: float = 0.5,
        socket_timeout: float = 1.0,
    ) -> None:
        self._client = redis_client(
            url,
            socket_timeout=socket_timeout,
            connect_timeout=socket_connect_timeout,
            max_connections=max_connections,
            pool_timeout=socket_timeout,
            retry_on=(redis_errors.ConnectionError, redis_errors.TimeoutError),
            decode_responses=True,
        )
        self._where = address(self._client)
        self._script = self._client.register_script(_RECORD_LUA)
        self._base = f"{prefix}{{ledger}}:"
        self._stream_maxlen = stream_maxlen
        self._dedupe_ttl_s = dedupe_ttl_s
        self._aggregate_ttl_s = aggregate_ttl_s

    async def record(self, rec: SpendRecord) -> bool:
        """Add `rec` once; False (and no change) if its `record_id` was seen already."""
        with self._translate():
            added = await self._script(*self._script_call(rec))
        return bool(added)

    async def record_many(self, recs: Sequence[SpendRecord]) -> list[bool]:
        """`record` for each, in one pipelined round trip (each script stays atomic).

        EVALSHA is sent directly: redis-py's pipelined scripts cost an extra SCRIPT
        EXISTS round trip per batch. After a Redis restart the script is loaded again
        and the batch re-sent, which is safe because `record` is idempotent."""
        if len(recs) == 1:
            return [await self.record(recs[0])]
        with self._translate():
            try:
                return await self._evalsha_batch(recs)
            except redis_errors.NoScriptError:
                await self._client.script_load(_RECORD_LUA)
                return await self._evalsha_batch(recs)

    async def _evalsha_batch(self, recs: Sequence[SpendRecord]) -> list[bool]:
        async with self._client.pipeline(transaction=False) as pipe:
            for rec in recs:
                keys, args = self._script_call(rec)
                pipe.evalsha(self._script.sha, len(keys), *keys, *args)
            added = await pipe.execute()
        return [bool(a) for a in added]

    def _script_call(self, rec: SpendRecord) -> tuple[list[str], list[Any]]:
        day = rec.day
        dims = [rec.dimension(name) for name in DIMENSIONS]
        keys = [
            self._base + "rec:" + rec.record_id,
            self._day_key(day),
            *(self._day_key(day, name) for name in DIMENSIONS),
            self._base + "days",
            self._base + "events",
        ]
        args: list[Any] = [
            rec.to_json(),
            self._dedupe_ttl_s,
            self._aggregate_ttl_s,
            self._stream_maxlen,
            date.fromisoformat(day).toordinal(),
            day,
            rec.record_id,
            orjson.dumps(dims),
            *metrics_of(rec),
        ]
        return keys, args

    async def get(self, record_id: str) -> SpendRecord | None:
        """The record, while its de-duplication key lives (`dedupe_ttl_s`)."""
        with self._translate():
            raw = await self._client.get(self._base + "rec:" + record_id)
        return None if raw is None else SpendRecord.from_dict(orjson.loads(raw))

    async def aggregate(
        self, day_from: date, day_to: date, group_by: Sequence[str]
    ) -> list[AggregateRow]:
        """Totals for days in [day_from, day_to] (UTC, inclusive), one row per group.

        Reads one hash per day with data: the small per-dimension hash when at most
        one dimension is asked for, the full-tuple hash otherwise.
        """
        names = check_group_by(group_by)
        dims = [name for name in names if name != "day"]
        # Any per-dimension hash holds the day's totals, so no dimension reads the first.
        single = None if len(dims) > 1 else (dims[0] if dims else DIMENSIONS[0])
        with self._translate():
            found = await self._client.zrangebyscore(
                self._base + "days", day_from.toordinal(), day_to.toordinal()
            )
            days = cast(list[str], found)
            async with self._client.pipeline(transaction=False) as pipe:
                for day in days:
                    pipe.hgetall(self._day_key(day, single))
                hashes: list[dict[str, str]] = await pipe.execute()
        rollup = Rollup(names)
        for day, fields in zip(days, hashes, strict=True):
            for field, amount in fields.items():
                metric, _, encoded = field.partition("|")
                if metric not in METRICS:
                    continue  # a field this version does not know; skip, don't guess
                values = {"day": day}
                if single is None:
                    values.update(zip(DIMENSIONS, orjson.loads(encoded), strict=True))
                else:
                    values[single] = encoded
                group = tuple(values[name] for name in names)
                rollup.add_metric(group, METRICS.index(metric), int(amount))
        return rollup.rows()

    async def events(self, limit: int = 1000) -> list[SpendRecord]:
        """The latest `limit` records (at most `stream_maxlen`), oldest first."""
        count = min(limit, self._stream_maxlen)
        if count <= 0:
            return []
        with self._translate():
            found = await self._client.xrevrange(self._base + "events", count=count)
        entries = cast(list[tuple[str, dict[str, str]]], found)
        return [SpendRecord.from_dict(orjson.loads(fields["json"])) for _, fields in entries[::-1]]

    def event_stream_keys(self) -> list[str]:
        """The streams that hold the records' events, the archive's sources."""
        return [self._base + "events"]

    @property
    def client(self) -> Redis:
        """The store's Redis client, shared with the archive exporter."""
        return self._client

    async def ping(self) -> bool:
        """True if Redis answers; never raises for a connection failure."""
        try:
            return bool(await self._client.ping())
        except _UNREACHABLE:
            return False

    async def close(self) -> None:
        await self._client.aclose()

    def _day_key(self, day: str, dimension: str | None = None) -> str:
        key = f"{self._base}day:{day}"
        return key if dimension is None else f"{key}:{dimension}"

    @contextlib.contextmanager
    def _translate(self) -> Iterator[None]:
        try:
            yield
        except _UNREACHABLE as exc:
            raise LedgerUnavailable(f"redis at {self._where} is unreachable: {exc}") from exc


T = TypeVar("T")


def read_ledger(url: str, prefix: str, read: Callable[[RedisStore], Awaitable[T]]) -> T:
    """`read` run on the Redis ledger at `url`, for a command line tool: in its own
    event loop, the connection closed after. Raises what `read` and `RedisStore` raise
    (`LedgerUnavailable`; ValueError for a URL redis-py cannot parse)."""

    async def run() -> T:
        store = RedisStore(url, prefix=prefix)
        try:
            return await read(store)
        finally:
            await store.close()

    return asyncio.run(run())
