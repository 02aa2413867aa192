"""Redis killed and restarted while the gateway is under load: every request keeps
being answered, and every answered request lands in the ledger exactly once (spooled
during the outage, replayed after). The gateway runs on a private `redis-server`."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from gateway.ledger import RedisStore
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import AUTH, StartGateway, openai_compatible_policy
from tests.gateway.ledger_fixtures import RedisServer
from tests.support import eventually_async

REQUESTS = 240
WORKERS = 8


async def test_redis_restart_during_load_keeps_spend_exactly_once(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    redis_server: RedisServer,
    redis_prefix: str,
) -> None:
    fake_openai.delay_s = 0.005
    server = start_gateway(
        openai_compatible_policy(), redis=redis_server.url, UPSTREAM_BASE_URL=fake_openai.url
    )
    sent = 0
    lock = threading.Lock()

    def one(i: int) -> tuple[int, str]:
        nonlocal sent
        with lock:
            sent += 1
        response = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"model": "auto", "messages": [{"role": "user", "content": f"hello {i}"}]},
            headers=AUTH,
            timeout=30,
        )
        return response.status_code, response.headers.get("x-request-id", "")

    with ThreadPoolExecutor(WORKERS) as pool:
        futures = [pool.submit(one, i) for i in range(REQUESTS)]
        while sent < REQUESTS // 3:
            time.sleep(0.005)
        redis_server.kill()  # mid-load
        while sent < 2 * REQUESTS // 3:
            time.sleep(0.005)
        redis_server.start()
        results = [future.result() for future in futures]

    assert [status for status, _ in results] == [200] * REQUESTS
    answered = {request_id for _, request_id in results}
    store = RedisStore(redis_server.url, prefix=redis_prefix)
    try:

        async def recorded() -> list[str]:
            return [event.request_id for event in await store.events(limit=10 * REQUESTS)]

        async def all_recorded() -> bool:
            return set(await recorded()) >= answered

        await eventually_async(all_recorded, 20, "every answer recorded")
        assert sorted(await recorded()) == sorted(answered)  # all of them, each once
    finally:
        await store.close()
