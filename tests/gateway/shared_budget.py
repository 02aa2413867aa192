"""A team budget that two gateways share through one Redis, and the helpers that read
its outcome: the spend once every reservation is settled, and the ledger once every
accepted request is in it. Used by test_budgets_concurrency, test_budget_shapes and
test_redis_cluster."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import redis

from gateway.ledger import RedisStore, SpendRecord

MESSAGES = [{"role": "user", "content": "hi there"}]
MAX_TOKENS = 10
LIMIT_NANOS = 10_000_000  # $0.01: room for ~140 of the 500 requests
REQUESTS = 500  # sent at once against the budget

# `closed`: the invariant is promised while the limits store answers. With the default
# `open`, an admission that times out on a loaded machine (0.5 s) is served unchecked,
# by design; here it is refused with 503 instead, so the budget stays exact.
POLICY = """
gateway: {limits_when_redis_down: closed}
deployments:
  premium:
    api_base: ${PREMIUM_URL}
    model: big-model
    tier: premium
    price: {input_per_mtok: 10, output_per_mtok: 10}
routes:
  auto: {deployments: [premium]}
keys:
  k: {secret: "${GATEWAY_TEST_KEY}", team: research}
teams:
  research: {}
budgets:
  - {scope: team, name: research, period: day, limit_usd: 0.01}
"""


def wait_until_settled(redis_url: str, prefix: str, timeout_s: float = 20) -> int:
    """The budget's spend once no reservation is left."""
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    key = f"{prefix}{{limits}}:budget:team:research:{day}"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            spent, reserved = client.hmget(key, "spent", "reserved")
            if int(reserved or 0) == 0 and client.zcard(key + ":held") == 0:
                return int(spent or 0)
            assert time.monotonic() < deadline, f"still reserved: {reserved}"
            time.sleep(0.05)
    finally:
        client.close()


async def ledger_until(store: RedisStore, count: int, timeout_s: float = 20) -> list[SpendRecord]:
    """The ledger's records once there are `count` of them, and a moment more."""
    deadline = time.monotonic() + timeout_s
    while len(records := await store.events(limit=10 * REQUESTS)) < count:
        assert time.monotonic() < deadline, f"{len(records)} of {count} records in the ledger"
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)  # anything extra (a duplicate) would land by now
    return await store.events(limit=10 * REQUESTS)
