"""A Redis Cluster client that behaves as the standalone clients `redis_client` builds,
so that no caller needs to know which one it holds. Where redis-py's `RedisCluster`
(8.1) differs in ways that matter here, it is evened out:

- A node's pool that is full raises `MaxConnectionsError` at once. With `pool_timeout`
  a call waits that long for one of `max_connections` slots instead (the standalone
  `BlockingConnectionPool`'s behaviour): a call or a pipeline holds one slot and uses at
  most one connection per node, so no node's pool overflows.
- It retries timeouts. Here only what the caller's `retry_on` names is retried, with a
  CLUSTERDOWN or an unserved slot (the command did not run): a timed-out admission
  script may have run, and must not run twice. Pipelines are retried by redis-py's own
  rules; the scripts callers pipeline are idempotent.
- A cluster it cannot reach (no node answers, a slot no node serves) raises
  `RedisClusterException`, which is not a `RedisError`: here, `ConnectionError`.
- Its recovery from a CLUSTERDOWN, a pipeline's timeout or (every 5th) MOVED closes every
  connection of the client, in use or not: calls on them fail with AttributeError. No
  full refresh on MOVED here, and the AttributeError becomes `ConnectionError`.
- Until it has mapped the cluster it sends a keyed command to a random master and
  follows the MOVED; here it maps the cluster first.
- PING goes to every node, replicas too; here to the masters, which take the writes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from contextvars import ContextVar
from typing import Any

from redis import exceptions as errors
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster

# Set while a task holds a slot: redirects a pipeline re-sends one by one must not wait
# for a second slot (that could deadlock a full gate).
_HOLDING: ContextVar[bool] = ContextVar("cluster_slot_held", default=False)


class ClusterClient(RedisCluster):
    """`ClusterClient.from_url(url, pool_timeout=..., retry=..., **options)`;
    `gateway.redis_client` picks this class or the one that retries timeouts too."""

    # Errors the client answers by re-reading the cluster's map and trying again, when
    # the caller's `retry_on` asks for retries (exact types, as redis-py compares them):
    # a dropped connection, as the standalone clients retry it, and a CLUSTERDOWN or an
    # unserved slot, which ran nothing.
    ERRORS_ALLOW_RETRY = (  # type: ignore[assignment]  # a narrower set than redis-py's
        errors.ConnectionError,
        errors.ClusterDownError,
        errors.SlotNotCoveredError,
    )

    def __init__(self, *, pool_timeout: float | None = None, **options: Any) -> None:
        # No full refresh on MOVED (it would close connections in use): a MOVED patches
        # its slot's owner, and a failover re-maps the old master's slots at once; a
        # node that stops answering still makes the client re-read the whole map.
        super().__init__(reinitialize_steps=0, **options)
        self.address = f"{options.get('host')}:{options.get('port')} (cluster)"
        self._pool_timeout = pool_timeout
        slots = options.get("max_connections", 100)
        self._gate = None if pool_timeout is None else asyncio.Semaphore(slots)

    async def initialize(self, *args: Any, **kwargs: Any) -> ClusterClient:
        try:
            await super().initialize(*args, **kwargs)
        except errors.RedisClusterException as exc:
            raise errors.ConnectionError(f"Redis Cluster unreachable: {exc}") from exc
        return self

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        async with self.slot():
            if self._initialize:
                # Map the cluster first: until it has, redis-py sends a keyed command to
                # a random master and follows the MOVED.
                await self.initialize()
            with _as_connection_errors():
                return await super().execute_command(*args, **kwargs)

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> Any:
        if shard_hint:
            raise errors.RedisClusterException("shard_hint is deprecated in cluster mode")
        return _Pipeline(self, transaction)  # type: ignore[abstract]  # as redis-py's own

    async def nodes_of(self, keys: Sequence[str]) -> list[ClusterNode]:
        """The master serving each key's slot now (the cluster mapped first)."""
        async with self.slot():
            if self._initialize:
                await self.initialize()
        nodes = []
        with _as_connection_errors():
            for key in keys:
                node = self.get_node_from_key(key)
                if node is None:
                    raise errors.ConnectionError(f"no master serves the slot of {key!r}")
                nodes.append(node)
        return nodes

    async def on_node(self, node: ClusterNode, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """`commands` to `node` in one round trip on one of its connections: each reply,
        or the error Redis answered for it. Nothing is redirected (a MOVED patches the
        map); a dropped connection is tried once more on a fresh one, all the commands
        again (callers send idempotent ones); a failed connection raises ConnectionError."""
        async with self.slot():
            with _as_connection_errors():
                try:
                    return await _on_connection(self, node, commands)
                except errors.ConnectionError:
                    return await _on_connection(self, node, commands)

    async def ping(self, **kwargs: Any) -> Any:
        return await self.execute_command("PING", target_nodes=self.PRIMARIES, **kwargs)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the `max_connections` slots, waiting up to `pool_timeout`."""
        if self._gate is None or _HOLDING.get():
            yield
            return
        if self._gate.locked():  # all slots taken: wait, within the pool timeout
            try:
                async with asyncio.timeout(self._pool_timeout):
                    await self._gate.acquire()
            except TimeoutError:
                raise errors.ConnectionError("No connection available.") from None
        else:  # the usual case, without a timeout context per command
            await self._gate.acquire()
        token = _HOLDING.set(True)
        try:
            yield
        finally:
            _HOLDING.reset(token)
            self._gate.release()


class TimeoutRetryingClusterClient(ClusterClient):
    """For callers whose commands are all idempotent: a timeout is retried too."""

    ERRORS_ALLOW_RETRY = (*ClusterClient.ERRORS_ALLOW_RETRY, errors.TimeoutError)  # type: ignore[assignment]


class _Pipeline(ClusterPipeline):
    """A non-transactional cluster pipeline (split by node) holding one slot while it runs."""

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> Any:
        client = self.cluster_client
        assert isinstance(client, ClusterClient)
        async with client.slot():
            with _as_connection_errors():
                replies = await super().execute(raise_on_error, allow_redirections)
        # Without raise_on_error a command's error is its reply: the same goes for those.
        return [_connection_error(r) if isinstance(r, AttributeError) else r for r in replies]


async def _on_connection(
    client: ClusterClient, node: ClusterNode, commands: Sequence[Sequence[Any]]
) -> list[Any]:
    connection = node.acquire_connection()
    try:
        await node.disconnect_if_needed(connection)
        await connection.send_packed_command(connection.pack_commands(commands))
        replies: list[Any] = []
        for command in commands:
            try:
                replies.append(await node.parse_response(connection, command[0]))
            except errors.ResponseError as exc:
                if isinstance(exc, errors.MovedError):
                    await client.nodes_manager.move_slot(exc)
                replies.append(exc)
        return replies
    except BaseException:
        await connection.disconnect()  # replies left unread: not for the pool
        raise
    finally:
        node.release(connection)


@contextlib.contextmanager
def _as_connection_errors() -> Iterator[None]:
    """What redis-py's cluster client raises for a cluster in flux, as ConnectionError:
    a slot no node serves now, and AttributeError from a connection it closed under the
    call (module docstring)."""
    try:
        yield
    except (errors.SlotNotCoveredError, AttributeError) as exc:
        raise _connection_error(exc) from exc


def _connection_error(exc: Exception) -> errors.ConnectionError:
    return errors.ConnectionError(f"{type(exc).__name__}: {exc}")
