"""An admission is cancel-safe: a request cancelled (its client went away) while its
admission script is in flight may have been admitted by Redis all the same; what that
admission took (its budget hold, its tokens) is released, not left to expire. Real
Redis, behind a proxy that holds its replies back."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis.asyncio as aioredis

from gateway.auth import Principal
from gateway.billing.tokens import PromptCounts
from gateway.limits import Limiter
from gateway.limits.redis_store import RedisLimitStore
from gateway.limits.rules import periods_at
from gateway.metrics import Metrics
from gateway.runtime import build_runtime
from policies import load_policy
from tests.support import eventually_async

POLICY = """
deployments:
  premium:
    api_base: http://127.0.0.1:9/v1
    model: big-model
    price: {input_per_mtok: 10, output_per_mtok: 10}
routes:
  auto: {strategy: fixed, deployments: [premium]}
keys:
  k: {secret: "${K_SECRET}", team: research}
teams:
  research: {rate_limit: {tokens_per_minute: 1000000}}
budgets:
  - {scope: team, name: research, period: day, limit_usd: 5}
"""
REPLY_DELAY_S = 0.3  # under the store's silence timeout: the admission is only slow


class SlowReplies:
    """A TCP proxy to Redis that passes commands on at once and holds every reply
    `delay_s`: Redis has run a script before its caller hears of it."""

    def __init__(self, host: str, port: int, delay_s: float) -> None:
        self._target = (host, port)
        self.delay_s = delay_s
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        await asyncio.gather(
            self._pipe(reader, up_writer, 0.0),
            self._pipe(up_reader, writer, self.delay_s),
            return_exceptions=True,
        )

    @staticmethod
    async def _pipe(
        source: asyncio.StreamReader, sink: asyncio.StreamWriter, delay_s: float
    ) -> None:
        try:
            while data := await source.read(65536):
                await asyncio.sleep(delay_s)
                sink.write(data)
                await sink.drain()
        finally:
            sink.close()


@pytest.fixture
async def slow_url(redis_url: str) -> AsyncIterator[str]:
    parts = urlsplit(redis_url)
    proxy = SlowReplies(parts.hostname or "127.0.0.1", parts.port or 6379, REPLY_DELAY_S)
    await proxy.start()
    yield f"redis://127.0.0.1:{proxy.port}{parts.path}"
    await proxy.stop()


async def test_a_request_cancelled_during_its_admission_releases_its_hold(
    tmp_path: Path, slow_url: str, redis_url: str, redis_prefix: str
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    runtime = build_runtime(load_policy(path, env={"K_SECRET": "fake-key-k"}))
    store = RedisLimitStore(slow_url, redis_prefix, socket_timeout=2.0)
    limiter = Limiter(store, Metrics())
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    budget = store.budget_key("team", "research", periods_at(limiter.clock())["day"].id)
    rate = store.rate_key("team", "research")
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000}
    request = asyncio.create_task(
        limiter.admit(
            runtime,
            Principal("k", "research", None),
            runtime.routes["auto"],
            "chat",
            body,
            [runtime.deployments["premium"]],
            "fixed",
            "gone",
            PromptCounts(),
        )
    )

    async def held() -> bool:
        return bool(await client.hget(budget, "h:gone"))

    try:
        # Redis has run the script (the hold is there); its reply is still on its way.
        await eventually_async(held, 5, "the admission's hold")
        assert not request.done()
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request

        async def released() -> bool:
            state = await client.hmget(budget, "reserved", "h:gone")
            return state == ["0", None] and int(await client.hget(rate, "t") or 0) == 0

        await eventually_async(released, 5, "the cancelled admission's release")
        assert await client.zcard(budget + ":held") == 0
    finally:
        with contextlib.suppress(asyncio.CancelledError):
            await limiter.stop()
        await client.aclose()
