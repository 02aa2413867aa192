"""Ledger writes that a replica has acknowledged (`CASCADE_LEDGER_MIN_REPLICAS`).

Redis replicates asynchronously: a master that crashes can take with it the writes it
acknowledged but had not yet sent on. With `min_replicas` set, each pipelined batch of
record scripts ends with `WAIT min_replicas wait_ms` on every connection that wrote it
(on a cluster, one per master: WAIT counts the replicas that have what this connection
wrote). A batch that fewer replicas took in time, or whose slots moved while it was
written (a redirected script ran on another connection), raises `LedgerUnavailable`:
the ledger spools it and replays it, exactly once by the records' markers, until a
replica has it too, so a master lost with it loses no spend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.asyncio.cluster import ClusterNode

from gateway.ledger.store import LedgerUnavailable
from gateway.redis_client import RedisClient
from gateway.redis_cluster import ClusterClient


class ReplicaAck:
    """`WAIT` after each batch: `nodes = await ack.nodes(keys)`, `ack.queue(pipe, nodes)`
    after the writes, then `await ack.check(wait_replies, nodes, keys)`."""

    def __init__(self, client: RedisClient, min_replicas: int, wait_ms: int) -> None:
        if min_replicas < 1 or wait_ms < 1:  # WAIT 0 would block for good
            raise ValueError(f"WAIT needs a replica and a timeout: {min_replicas}, {wait_ms}")
        self._client = client
        self.min_replicas = min_replicas
        self.wait_ms = wait_ms

    async def nodes(self, keys: Sequence[str]) -> list[ClusterNode | None]:
        """The masters serving `keys` now; `[None]` on a single Redis (one connection)."""
        if not isinstance(self._client, ClusterClient):
            return [None]
        found: dict[str, ClusterNode] = {}
        for key in keys:
            node = await self._client.node_of(key)
            found.setdefault(node.name, node)
        return list(found.values())

    def queue(self, pipe: Any, nodes: Sequence[ClusterNode | None]) -> None:
        for node in nodes:
            target = {} if node is None else {"target_nodes": node}
            pipe.execute_command("WAIT", self.min_replicas, self.wait_ms, **target)

    async def check(
        self, replies: Sequence[Any], nodes: Sequence[ClusterNode | None], keys: Sequence[str]
    ) -> None:
        short = [
            "" if node is None else node.name
            for node, reply in zip(nodes, replies, strict=True)
            if isinstance(reply, Exception) or int(reply) < self.min_replicas
        ]
        if short:
            where = f" on {', '.join(short)}" if short[0] else ""
            raise LedgerUnavailable(
                f"fewer than {self.min_replicas} replica(s) took the write{where} within "
                f"{self.wait_ms} ms; it is kept to be sent again"
            )
        if nodes[0] is not None and _names(await self.nodes(keys)) != _names(nodes):
            raise LedgerUnavailable("slots moved while a batch was written; it is sent again")


def _names(nodes: Sequence[ClusterNode | None]) -> list[str]:
    return [node.name for node in nodes if node is not None]
