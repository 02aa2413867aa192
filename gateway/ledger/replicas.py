"""Ledger writes that a replica has acknowledged (`CASCADE_LEDGER_MIN_REPLICAS`).

Redis replicates asynchronously: a master that crashes can take with it the writes it
acknowledged but had not yet sent on. With `min_replicas` set, each batch of record
scripts ends with `WAIT min_replicas wait_ms` on the connection that wrote it, since
WAIT counts the replicas that have what its own connection wrote:

- On a single Redis the batch is one pipeline, so one connection; should redis-py
  re-send it on a new connection, the WAIT goes with it.
- On a cluster each master's share goes on one of its connections, WAIT last
  (`ClusterClient.on_node`; a dropped connection is tried once more, WAIT and all, on
  a fresh one). Nothing is redirected: a script answered MOVED, ASK or TRYAGAIN ran
  elsewhere or not at all, so the batch is not confirmed.

A batch that fewer replicas took in time, that was redirected, or that failed on any
master raises `LedgerUnavailable`: the ledger spools it and replays it, exactly once by
the records' markers, until a replica has it. A replayed record that is already written
rewrites its marker with its own value (the record script's `ack` argument), so its
WAIT has a write to count even where Redis would not move a connection's offset for a
read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast

from redis import exceptions as redis_errors
from redis.asyncio.cluster import ClusterNode

from gateway.ledger.store import LedgerUnavailable
from gateway.redis_client import RedisClient, pipelined
from gateway.redis_cluster import ClusterClient

Command = tuple[Any, ...]
# Replies that mean the script ran on another node, or not at all.
_REDIRECTS = (redis_errors.AskError, redis_errors.TryAgainError)  # MovedError is an AskError


class ReplicaAck:
    """`await ack.send(commands, keys)`: each command's reply (or the error Redis gave
    it), once `min_replicas` replicas have them all; `keys[i]` is a key of command i."""

    def __init__(self, client: RedisClient, min_replicas: int, wait_ms: int) -> None:
        if min_replicas < 1 or wait_ms < 1:  # WAIT 0 would block for good
            raise ValueError(f"WAIT needs a replica and a timeout: {min_replicas}, {wait_ms}")
        self._client = client
        self.min_replicas = min_replicas
        self.wait_ms = wait_ms

    async def send(self, commands: Sequence[Command], keys: Sequence[str]) -> list[Any]:
        if not commands:
            return []
        wait: Command = ("WAIT", self.min_replicas, self.wait_ms)
        if not isinstance(self._client, ClusterClient):
            replies = await pipelined(self._client, [*commands, wait])
            self._check({"": replies[-1]})
            return replies[:-1]
        groups: dict[str, tuple[ClusterNode, list[int]]] = {}
        for i, node in enumerate(await self._client.nodes_of(keys)):
            groups.setdefault(node.name, (node, []))[1].append(i)
        outcomes = await asyncio.gather(
            *(
                self._client.on_node(node, [*(commands[i] for i in indices), wait])
                for node, indices in groups.values()
            ),
            return_exceptions=True,
        )
        failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
        if failed is not None:
            raise failed  # a master that failed: `RedisStore` reports Redis unreachable
        sent = cast(list[list[Any]], outcomes)
        out: list[Any] = [None] * len(commands)
        for (_, indices), node_replies in zip(groups.values(), sent, strict=True):
            for i, reply in zip(indices, node_replies, strict=False):  # the last is WAIT's
                out[i] = reply
        if any(isinstance(reply, _REDIRECTS) for reply in out):
            raise LedgerUnavailable("slots moved while a batch was written; it is sent again")
        self._check({name: replies[-1] for name, replies in zip(groups, sent, strict=True)})
        return out

    def _check(self, waits: dict[str, Any]) -> None:
        short = [
            name
            for name, reply in waits.items()
            if isinstance(reply, Exception) or int(reply) < self.min_replicas
        ]
        if short:
            where = f" on {', '.join(short)}" if short[0] else ""
            raise LedgerUnavailable(
                f"fewer than {self.min_replicas} replica(s) took the write{where} within "
                f"{self.wait_ms} ms; it is kept to be sent again"
            )
