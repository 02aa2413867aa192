"""Helpers shared by the ledger tests: record factories, a reference rollup, stores,
and a real `redis-server` process the outage tests can kill, pause and restart.

The fixtures themselves are thin wrappers in each test module.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from datetime import UTC, date, datetime
from pathlib import Path

import redis.asyncio as aioredis

from gateway.ledger import AggregateRow, LedgerStore, MemoryStore, RedisStore, SpendRecord
from gateway.ledger.store import DEDUPE_WINDOW_S
from tests.support import eventually

REDIS_URL = "redis://127.0.0.1:6379"
CONTRACT_DB = 1  # the shared Redis: only DBs 1 and 2, only keys under our own prefix
OUTAGE_DB = 2
DAY0 = date(2026, 11, 28)
SHARDS = 4  # the "redis-sharded" stores' shard count (`gateway.ledger.shards`)

StoreFactory = Callable[..., Awaitable[LedgerStore]]


def make_record(i: int, *, day: int = 0, **overrides: object) -> SpendRecord:
    """A varied, deterministic record; `day` is the offset from DAY0 in UTC days."""
    midnight = datetime(DAY0.year, DAY0.month, DAY0.day, tzinfo=UTC).timestamp()
    fields: dict[str, object] = {
        "record_id": f"req-{i}",
        "request_id": f"req-{i}",
        "ts": midnight + day * 86400 + (i * 37) % 86400,
        "team": ("research", "sales", "ops")[i % 3],
        "key": f"key-{i % 4}",
        "route": ("auto", "code")[i % 2],
        "tier": ("cheap", "premium")[(i // 2) % 2],
        "deployment": ("local-vllm", "openai", "anthropic")[(i + 1) % 3],
        "model": ("qwen-7b", "gpt-4o-mini", "gpt-4o", "claude", "llama")[i % 5],
        "prompt_tokens": 10 + i,
        "completion_tokens": 2 * i + 1,
        "cost_nanos": 1_000 * i + 7,
        "reference_model": "gpt-4o",
        "reference_cost_nanos": 5_000 * i + 11,
        "status": "error" if i % 7 == 0 else "ok",
        "sla_met": (None, True, False, True)[i % 4],
    }
    fields.update(overrides)
    return SpendRecord(**fields)  # type: ignore[arg-type]


def expected_rows(
    records: Iterable[SpendRecord],
    group_by: Sequence[str],
    day_from: date = date.min,
    day_to: date = date.max,
) -> list[AggregateRow]:
    """The contract's answer, computed the obvious way."""
    totals: dict[tuple[str, ...], list[int]] = {}
    for rec in records:
        if not day_from.isoformat() <= rec.day <= day_to.isoformat():
            continue
        row = totals.setdefault(tuple(rec.dimension(name) for name in group_by), [0] * 9)
        row[0] += rec.record_id == rec.request_id  # a client request: its first answer
        row[1] += rec.status == "error"
        row[2] += rec.prompt_tokens
        row[3] += rec.completion_tokens
        row[4] += rec.cost_nanos
        row[5] += rec.reference_cost_nanos
        row[6] += rec.sla_met is True
        row[7] += rec.sla_met is False
        row[8] += rec.status not in ("error", "cancelled")  # an upstream call priced
    return [
        AggregateRow(dict(zip(group_by, group, strict=True)), *row)
        for group, row in sorted(totals.items())
    ]


async def delete_prefix(url: str, prefix: str) -> None:
    client = aioredis.Redis.from_url(url)
    try:
        async for key in client.scan_iter(match=prefix + "*", count=1000):
            await client.delete(key)
    finally:
        await client.aclose()


async def store_factory(kind: str, db: int) -> AsyncIterator[StoreFactory]:
    """Yield a factory of stores of `kind` ("redis", "redis-sharded": the ledger spread
    over SHARDS hash tags, or "memory"); close them and delete their keys after."""
    made: list[tuple[LedgerStore, str]] = []

    async def make(
        stream_maxlen: int = 100_000, dedupe_ttl_s: int = DEDUPE_WINDOW_S
    ) -> LedgerStore:
        prefix = f"cgtest-{uuid.uuid4().hex}:"
        store: LedgerStore
        if kind.startswith("redis"):
            url = f"{REDIS_URL}/{db}"
            shards = SHARDS if kind == "redis-sharded" else 1
            store = RedisStore(
                url,
                prefix=prefix,
                stream_maxlen=stream_maxlen,
                dedupe_ttl_s=dedupe_ttl_s,
                shards=shards,
            )
        else:
            store = MemoryStore(stream_maxlen=stream_maxlen, dedupe_ttl_s=dedupe_ttl_s)
        made.append((store, prefix))
        return store

    yield make
    for store, prefix in made:
        await store.close()
        if kind.startswith("redis"):
            await delete_prefix(f"{REDIS_URL}/{db}", prefix)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A private `redis-server` on a free port; its AOF (fsync always) lets it lose
    nothing when killed, as a crashed production Redis with AOF would."""

    def __init__(self, workdir: Path, replica_of: int | None = None) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.replica_of = replica_of  # the port of the server it replicates, if any
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/{OUTAGE_DB}"

    def start(self) -> None:
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--save", "", "--appendonly", "yes", "--appendfsync", "always"]
        command += ["--dir", str(self.workdir), "--daemonize", "no"]
        if self.replica_of is not None:
            command += ["--replicaof", "127.0.0.1", str(self.replica_of)]
        self._proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_ready()

    def kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def stop(self) -> None:
        """Kill the server, paused or not."""
        if self._proc is not None:
            self.resume()
        self.kill()

    def pause(self) -> None:
        assert self._proc is not None
        os.kill(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self._proc is not None
        os.kill(self._proc.pid, signal.SIGCONT)

    def _wait_ready(self, timeout_s: float = 10.0) -> None:
        eventually(lambda: _answers_ping(self.port), timeout_s, f"redis-server on {self.port}")


def _answers_ping(port: int) -> bool:
    """True once the server accepts commands (not while it is loading its AOF)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False
