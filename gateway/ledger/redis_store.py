"""The Redis ledger store: one Lua script per record, Cluster-safe keys.

Keys (`P` is the prefix, default `cg:`; `T` the hash tag: `{ledger}` with one shard,
`{ledger.K}` for shard K of N, `gateway.ledger.shards`; a script touches the keys of one
tag only, so on a Redis Cluster each record is one slot's work):

    P T:rec:<record_id>        string  the record's JSON; SET NX makes it the
                                       de-duplication marker too (dedupe_ttl_s, the
                                       dedupe window: 48 h by default)
    P T:day:<YYYY-MM-DD>       hash    `<metric>|<JSON [team,key,route,tier,deployment,
                                       model]>` -> int (aggregate_ttl_s)
    P T:day:<YYYY-MM-DD>:<dim> hash    `<metric>|<value>` -> int, one per dimension
                                       (aggregate_ttl_s)
    P T:days                   zset    days with data, score = date.toordinal()
                                       (aggregate_ttl_s)
    P T:events                 stream  `id`, `json` per record, MAXLEN ~ stream_maxlen / N
    P{ledger}:shards           string  N, when N > 1 (no expiry): the layout's check

With one shard the names are `P{ledger}:...`, as they always were. With N shards a day's
totals are the sum over the N shards' hashes (`aggregate` reads them all), and the
events are the N streams merged by time.

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
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from redis import exceptions as redis_errors

from gateway.ledger.record import DIMENSIONS, AggregateRow, SpendRecord
from gateway.ledger.replicas import ReplicaAck
from gateway.ledger.rollup import METRICS, Rollup, check_group_by, metrics_of
from gateway.ledger.shards import ShardKeys, check_layout, day_ordinal, shard_of
from gateway.ledger.store import DEDUPE_WINDOW_S, LedgerUnavailable
from gateway.ledger.stream_ids import parse_id
from gateway.redis_client import RedisClient, address, pipelined, redis_client

if TYPE_CHECKING:
    from gateway.settings import Settings

# Errors that mean "no usable Redis there" (BusyLoadingError and auth failures are
# ConnectionErrors; READONLY is what a demoted primary answers during failover;
# InvalidResponse is something other than Redis, e.g. a proxy, on the port; on a
# cluster, CLUSTERDOWN, TRYAGAIN or redirects past redis-py's limit while slots move).
_UNREACHABLE = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.ReadOnlyError,
    redis_errors.InvalidResponse,
    redis_errors.ClusterError,
    redis_errors.TryAgainError,
    OSError,
)

# KEYS: 1 rec, 2 day hash, 3..8 per-dimension hashes (DIMENSIONS order), 9 days, 10 events.
# ARGV: 1 record JSON, 2 dedupe ttl, 3 aggregate ttl, 4 stream maxlen, 5 day score,
#       6 day, 7 record_id, 8 dimension-tuple JSON, 9 metric amounts (METRICS order),
#       comma-separated, 10 ack: '1' rewrites a seen record's marker, a write for the
#       replica WAIT that follows to count (gateway.ledger.replicas).
# The dimension values are decoded from ARGV[8] in Lua (they are strings); the amounts
# stay strings, split in Lua, because cjson would round large integers (and one argument
# encodes faster than 19).
_RECORD_LUA = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
  if ARGV[10] == '1' then redis.call('SET', KEYS[1], redis.call('GET', KEYS[1]), 'KEEPTTL') end
  return 0
end
local dims = cjson.decode(ARGV[8])
local metrics = {__METRICS__}
local m = 0
for amount in string.gmatch(ARGV[9], '[^,]+') do
  m = m + 1
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

    `record` is one EVALSHA round trip; `record_many` pipelines a batch of them (on a
    cluster, one pipeline per master, sent together). Connection failures raise
    `LedgerUnavailable` within about `socket_timeout` (one retry, for a pooled
    connection Redis dropped). `shards` spreads the ledger over that many hash tags
    (module docstring); every store of one ledger must use the same number.

    >>> store = RedisStore("redis://localhost:6379/0"); await store.record(rec)
    >>> store = RedisStore("redis://node-1:6379", cluster=True, shards=16)
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
        cluster: bool = False,
        shards: int = 1,
        min_replicas: int = 0,
        replica_wait_ms: int = 100,
    ) -> None:
        if shards < 1:
            raise ValueError(f"a ledger has at least one shard, not {shards}")
        if min_replicas and replica_wait_ms > socket_timeout * 500:  # Redis answers WAIT late
            raise ValueError(
                f"a replica wait of {replica_wait_ms} ms is over half the socket timeout"
            )
        self._client = redis_client(
            url,
            socket_timeout=socket_timeout,
            connect_timeout=socket_connect_timeout,
            max_connections=max_connections,
            pool_timeout=socket_timeout,
            retry_on=(redis_errors.ConnectionError, redis_errors.TimeoutError),
            decode_responses=True,
            cluster=cluster,
        )
        self._where = address(self._client)
        self._url = url
        self._cluster = cluster
        self._script = self._client.register_script(_RECORD_LUA)
        self._ack = (
            ReplicaAck(self._client, min_replicas, replica_wait_ms) if min_replicas else None
        )
        self._prefix = prefix
        self._shards = [ShardKeys(prefix, k, shards) for k in range(shards)]
        self._layout_checked = False
        self._stream_maxlen = stream_maxlen
        self._shard_maxlen = -(-stream_maxlen // shards)  # the N streams hold about as much
        self._dedupe_ttl_s = dedupe_ttl_s
        self._aggregate_ttl_s = aggregate_ttl_s

    @classmethod
    def from_settings(cls, settings: Settings) -> RedisStore:
        """The store the settings name (`REDIS_URL` set): the one place they map to it."""
        if settings.redis_url is None:
            raise ValueError("REDIS_URL is not set: there is no Redis ledger to use")
        return cls(
            settings.redis_url,
            prefix=settings.redis_prefix,
            stream_maxlen=settings.ledger_stream_maxlen,
            dedupe_ttl_s=settings.ledger_dedupe_window_s,
            cluster=settings.redis_cluster,
            shards=settings.ledger_shard_count,
            min_replicas=settings.ledger_min_replicas,
            replica_wait_ms=settings.ledger_replica_wait_ms,
        )

    @property
    def replica_ack(self) -> tuple[int, int] | None:
        """(replicas, wait in ms) each batch waits for (`gateway.ledger.replicas`); None: off."""
        return None if self._ack is None else (self._ack.min_replicas, self._ack.wait_ms)

    async def record(self, rec: SpendRecord) -> bool:
        """Add `rec` once; False (and no change) if its `record_id` was seen already."""
        if self._ack is not None:  # the WAIT must follow on the connection that wrote
            return (await self._record_batch([rec]))[0]
        with self._translate():
            await self._check_layout()
            added = await self._script(*self._script_call(rec))
        return bool(added)

    async def record_many(self, recs: Sequence[SpendRecord]) -> list[bool]:
        """`record` for each, in one pipelined round trip (each script stays atomic).

        EVALSHA is sent directly: redis-py's pipelined scripts cost an extra SCRIPT
        EXISTS round trip per batch. Where Redis lacks the script (restarted; on a
        cluster, a master that never ran it) it is loaded and those records re-sent:
        only those, so that each flag still says whether its record was new."""
        if not recs:
            return []
        if len(recs) == 1:
            return [await self.record(recs[0])]
        return await self._record_batch(recs)

    async def _record_batch(self, recs: Sequence[SpendRecord]) -> list[bool]:
        with self._translate():
            await self._check_layout()
            added = await self._evalsha_batch(recs)
            missing = [i for i, a in enumerate(added) if isinstance(a, redis_errors.NoScriptError)]
            if missing:
                await self._client.script_load(_RECORD_LUA)
                again = await self._evalsha_batch([recs[i] for i in missing])
                for i, reply in zip(missing, again, strict=True):
                    added[i] = reply
            for reply in added:
                if isinstance(reply, Exception):
                    raise reply
        return [bool(a) for a in added]

    async def _evalsha_batch(self, recs: Sequence[SpendRecord]) -> list[Any]:
        """Each record's reply, or the error Redis answered for it (`LedgerUnavailable`
        if `min_replicas` replicas did not take them: `gateway.ledger.replicas`)."""
        # The raw command: a cluster pipeline refuses `evalsha()`, which it cannot prove
        # touches one slot (this script's keys share its shard's tag).
        calls = [self._script_call(rec) for rec in recs]
        commands = [("EVALSHA", self._script.sha, len(k), *k, *a) for k, a in calls]
        if self._ack is not None:
            return await self._ack.send(commands, [keys[0] for keys, _ in calls])
        return await pipelined(self._client, commands)

    def _script_call(self, rec: SpendRecord) -> tuple[list[str], list[Any]]:
        day = rec.day
        dims = [rec.dimension(name) for name in DIMENSIONS]
        shard = self._shard(rec.record_id)
        keys = [shard.rec(rec.record_id), *shard.record_keys(day)]
        args: list[Any] = [
            rec.to_json(),
            self._dedupe_ttl_s,
            self._aggregate_ttl_s,
            self._shard_maxlen,
            day_ordinal(day),
            day,
            rec.record_id,
            orjson.dumps(dims),
            ",".join(map(str, metrics_of(rec))),
            int(self._ack is not None),
        ]
        return keys, args

    async def get(self, record_id: str) -> SpendRecord | None:
        """The record, while its de-duplication key lives (`dedupe_ttl_s`)."""
        with self._translate():
            await self._check_layout()
            raw = await self._client.get(self._shard(record_id).rec(record_id))
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
            await self._check_layout()
            async with self._client.pipeline(transaction=False) as pipe:
                for shard in self._shards:
                    pipe.zrangebyscore(shard.days, day_from.toordinal(), day_to.toordinal())
                found: list[list[str]] = await pipe.execute()
            days = [
                (shard, day)
                for shard, shard_days in zip(self._shards, found, strict=True)
                for day in shard_days
            ]
            async with self._client.pipeline(transaction=False) as pipe:
                for shard, day in days:
                    pipe.hgetall(shard.day(day, single))
                hashes: list[dict[str, str]] = await pipe.execute()
        rollup = Rollup(names)
        for (_, day), fields in zip(days, hashes, strict=True):
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
        """The latest `limit` records (at most `stream_maxlen`), oldest first: with N
        shards the N streams' latest, merged by when each was written."""
        count = min(limit, self._stream_maxlen)
        if count <= 0:
            return []
        with self._translate():
            await self._check_layout()
            async with self._client.pipeline(transaction=False) as pipe:
                for shard in self._shards:
                    pipe.xrevrange(shard.events, count=count)
                found: list[list[tuple[str, dict[str, str]]]] = await pipe.execute()
        records = [
            (parse_id(entry_id), SpendRecord.from_dict(orjson.loads(fields["json"])))
            for stream in found
            for entry_id, fields in stream
        ]
        if len(found) > 1:
            # By the time Redis wrote each; within a millisecond (two shards' entries can
            # share one), by the request's time, then the stream's own order.
            records.sort(key=lambda entry: (entry[0][0], entry[1].ts, entry[0][1]))
        else:
            records.reverse()  # one stream, newest first
        return [rec for _, rec in records[-count:]]

    def event_stream_keys(self) -> list[str]:
        """The streams that hold the records' events (one per shard), the archive's
        sources."""
        return [shard.events for shard in self._shards]

    @property
    def client(self) -> RedisClient:
        """The store's Redis client (a cluster client on a cluster)."""
        return self._client

    @property
    def url(self) -> str:
        """The URL the store was made with (the archive exporter's own client uses it)."""
        return self._url

    @property
    def cluster(self) -> bool:
        return self._cluster

    @property
    def shard_maxlen(self) -> int:
        """Each event stream's MAXLEN: the N shards' streams hold about `stream_maxlen`."""
        return self._shard_maxlen

    async def check_layout(self) -> None:
        """Raise `LedgerLayoutError` if the ledger was written with another shard count
        (`LedgerUnavailable` if Redis does not answer); at startup, to fail fast."""
        with self._translate():
            await self._check_layout()

    async def ping(self) -> bool:
        """True if Redis (a cluster's every master) answers; never raises for a
        connection failure."""
        try:
            return bool(await self._client.ping())
        except _UNREACHABLE:
            return False

    async def close(self) -> None:
        await self._client.aclose()

    def _shard(self, record_id: str) -> ShardKeys:
        return self._shards[shard_of(record_id, len(self._shards))]

    async def _check_layout(self) -> None:
        """Once per store: refuse a ledger written with another shard count."""
        if not self._layout_checked:
            await check_layout(self._client, self._prefix, len(self._shards))
            self._layout_checked = True

    @contextlib.contextmanager
    def _translate(self) -> Iterator[None]:
        try:
            yield
        except _UNREACHABLE as exc:
            raise LedgerUnavailable(f"redis at {self._where} is unreachable: {exc}") from exc


T = TypeVar("T")


def read_ledger(settings: Settings, read: Callable[[RedisStore], Awaitable[T]]) -> T:
    """`read` run on the Redis ledger the settings name, for a command line tool: in its
    own event loop, the connection closed after. Raises what `read` and `RedisStore`
    raise (`LedgerUnavailable`; ValueError for a URL redis-py cannot parse, or a ledger
    laid out over another number of shards)."""

    async def run() -> T:
        store = RedisStore.from_settings(settings)
        try:
            return await read(store)
        finally:
            await store.close()

    return asyncio.run(run())
