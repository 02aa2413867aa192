"""Where every Redis client is built. The ledger, the limits, the shared circuit
breakers and select routes' shared learning each ask `redis_client` for one, with the
options their work needs:

    caller                    timeouts: socket  connect  pool wait  pool  retried once
    ledger (RedisStore)                 1 s     0.5 s    1 s        64    dropped, timed out
    limits (RedisLimitStore)            5 s     5 s      5 s        64    dropped
    breakers (sla.build_guard)          1 s     1 s      none       100   nothing
    select learning (shared_profiles)   1 s     1 s      none       32    nothing

The ledger writes off the request path and spools what Redis will not take, so it
gives up within about a second. An admission is on the request path, but its usual
bound is the limit store's own silence timer (0.5 s without any reply); redis-py's 5 s
is only the outer bound, so a burst queued on a busy Redis is not taken for an outage,
and a timeout is not retried (the script may have run). The breakers' and the select
learning's sync loops poll every 0.5 s: a silent Redis must not stall them, and the
next poll is the retry (a select observation Redis did not take is only logged). The
stores read `str` replies, the breakers and the select learning `bytes`.

With `cluster=True` (`CASCADE_REDIS_CLUSTER`) the client is a Redis Cluster client
(`gateway.redis_cluster`) that finds every node from the one `url` names, with the same
options per caller: the connection limit (per node; a caller that waits for a free
connection also has at most that many calls in flight across the cluster), the wait for
a free connection, what is retried.
Callers name options, never client or pool classes; every key they use carries a hash
tag, so that each script touches one slot. `RedisClient` is either kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast
from urllib.parse import urlsplit

from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeout

from gateway.redis_cluster import ClusterClient, TimeoutRetryingClusterClient

RedisClient = Redis | ClusterClient


def redis_client(
    url: str,
    *,
    socket_timeout: float,
    connect_timeout: float,
    max_connections: int,
    pool_timeout: float | None = None,
    retry_on: tuple[type[RedisError], ...] = (),
    decode_responses: bool = False,
    cluster: bool = False,
) -> RedisClient:
    """A client for `url` with at most `max_connections` open connections (on a
    cluster: to each node, and with `pool_timeout` that many calls in flight in all).

    With `pool_timeout` a call waits that long for a free connection; without it a full
    pool raises `redis.ConnectionError` at once. An error in `retry_on` is retried once,
    without a pause (on a cluster, after re-reading the cluster's map; a CLUSTERDOWN
    too, when anything is). Closing the client (`aclose`) closes its pool.

    >>> client = redis_client(url, socket_timeout=1.0, connect_timeout=0.5, max_connections=8)
    """
    options: dict[str, Any] = {
        "max_connections": max_connections,
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "decode_responses": decode_responses,
    }
    if cluster:
        return _cluster_client(url, pool_timeout, retry_on, options)
    retry = Retry(NoBackoff(), 1, supported_errors=retry_on) if retry_on else None
    options["retry"] = retry  # None: redis-py retries nothing
    pool = (
        ConnectionPool.from_url(url, **options)
        if pool_timeout is None
        else BlockingConnectionPool.from_url(url, timeout=pool_timeout, **options)
    )
    return Redis.from_pool(pool)


def _cluster_client(
    url: str,
    pool_timeout: float | None,
    retry_on: tuple[type[RedisError], ...],
    options: dict[str, Any],
) -> ClusterClient:
    if urlsplit(url).path.strip("/") not in ("", "0"):
        raise ValueError(f"a Redis Cluster has database 0 only, not {url}'s")
    kind = TimeoutRetryingClusterClient if RedisTimeout in retry_on else ClusterClient
    retry = Retry(NoBackoff(), 1 if retry_on else 0)
    client = kind.from_url(url, pool_timeout=pool_timeout, retry=retry, **options)
    return cast(ClusterClient, client)


def address(client: RedisClient) -> str:
    """Where `client` connects, for error messages: `host:port/db`, a socket path, or
    the node a cluster client started from (never the password)."""
    if isinstance(client, ClusterClient):
        return client.address
    kw = client.connection_pool.connection_kwargs
    return kw.get("path") or f"{kw.get('host')}:{kw.get('port')}/{kw.get('db', 0)}"


async def pipelined(client: RedisClient, commands: Sequence[Sequence[Any]]) -> list[Any]:
    """`commands` in one pipeline (no transaction: on a cluster, split by node): each
    reply, or the error Redis answered for it."""
    async with client.pipeline(transaction=False) as pipe:
        for command in commands:
            pipe.execute_command(*command)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
    return replies
