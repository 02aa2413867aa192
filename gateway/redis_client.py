"""Where every Redis client is built. The ledger, the limits and the shared circuit
breakers each ask `redis_client` for one, with the options their work needs:

    caller                    timeouts: socket  connect  pool wait  pool  retried once
    ledger (RedisStore)                 1 s     0.5 s    1 s        64    dropped, timed out
    limits (RedisLimitStore)            5 s     5 s      5 s        64    dropped
    breakers (sla.build_guard)          1 s     1 s      none       100   nothing

The ledger writes off the request path and spools what Redis will not take, so it
gives up within about a second. An admission is on the request path, but its usual
bound is the limit store's own silence timer (0.5 s without any reply); redis-py's 5 s
is only the outer bound, so a burst queued on a busy Redis is not taken for an outage,
and a timeout is not retried (the script may have run). The breakers' sync loop polls
every 0.5 s: a silent Redis must not stall it, and the next poll is the retry. The
stores read `str` replies, the breakers `bytes`.

A Redis Cluster switch (redis-py's `RedisCluster`, chosen by a setting) belongs here:
callers name options, never pool classes, and every key they use carries a hash tag.
"""

from __future__ import annotations

from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError


def redis_client(
    url: str,
    *,
    socket_timeout: float,
    connect_timeout: float,
    max_connections: int,
    pool_timeout: float | None = None,
    retry_on: tuple[type[RedisError], ...] = (),
    decode_responses: bool = False,
) -> Redis:
    """A client for `url` with at most `max_connections` open connections.

    With `pool_timeout` a call waits that long for a free connection; without it a full
    pool raises `redis.ConnectionError` at once. An error in `retry_on` is retried once,
    without a pause. Closing the client (`aclose`) closes its pool.

    >>> client = redis_client(url, socket_timeout=1.0, connect_timeout=0.5, max_connections=8)
    """
    retry = Retry(NoBackoff(), 1, supported_errors=retry_on) if retry_on else None
    options = {
        "max_connections": max_connections,
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "retry": retry,  # None: redis-py retries nothing
        "decode_responses": decode_responses,
    }
    pool = (
        ConnectionPool.from_url(url, **options)
        if pool_timeout is None
        else BlockingConnectionPool.from_url(url, timeout=pool_timeout, **options)
    )
    return Redis.from_pool(pool)


def address(client: Redis) -> str:
    """Where `client` connects, for error messages: `host:port/db` or a socket path
    (never the password)."""
    kw = client.connection_pool.connection_kwargs
    return kw.get("path") or f"{kw.get('host')}:{kw.get('port')}/{kw.get('db', 0)}"
