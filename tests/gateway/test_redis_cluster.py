"""The gateway's Redis state on a real Redis Cluster (3 masters, 3 replicas:
tests/cluster.py): the ledger spread over shards and counted exactly once, also through
a master's failover under load; budgets that concurrent admissions never overspend;
breakers shared between two workers; and the gateway itself serving and recording with
CASCADE_REDIS_CLUSTER=true."""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from gateway.health.breaker import BreakerSettings, CircuitBreakers
from gateway.ledger import CostLedger, LedgerUnavailable, RedisStore, SpendRecord, Spool
from gateway.limits.redis_store import RedisLimitStore
from gateway.limits.rules import BudgetRule, Period
from gateway.limits.store import Admitted, Ask, BudgetRefusal, Charge
from gateway.redis_client import redis_client
from gateway.settings import CLUSTER_LEDGER_SHARDS
from gateway.upstreams.base import UpstreamConnectFailed
from tests.cluster import LocalCluster, cluster_prefix, redis_cluster
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import AUTH, StartGateway
from tests.gateway.ledger_fixtures import DAY0, expected_rows, make_record
from tests.gateway.shared_budget import LIMIT_NANOS, MAX_TOKENS, MESSAGES, POLICY
from tests.support import eventually, eventually_async

__all__ = ["cluster_prefix", "redis_cluster"]

WIDE = (DAY0 - timedelta(days=30), DAY0 + timedelta(days=30))
SHARDS = CLUSTER_LEDGER_SHARDS

MakeStore = Callable[..., RedisStore]


@pytest.fixture
def prefix(cluster_prefix: str) -> str:
    return cluster_prefix


@pytest.fixture
async def make_store(redis_cluster: LocalCluster, prefix: str) -> AsyncIterator[MakeStore]:
    made: list[RedisStore] = []

    def make(shards: int = SHARDS) -> RedisStore:
        made.append(RedisStore(redis_cluster.url, prefix=prefix, cluster=True, shards=shards))
        return made[-1]

    yield make
    for store in made:
        await store.close()


def with_duplicates(records: list[SpendRecord], seed: int) -> list[SpendRecord]:
    """`records` and a quarter of them again (a replay), shuffled."""
    rng = random.Random(seed)
    calls = records + rng.sample(records, len(records) // 4)
    rng.shuffle(calls)
    return calls


async def test_the_ledger_counts_each_record_once_across_the_masters(
    make_store: MakeStore, redis_cluster: LocalCluster, prefix: str
) -> None:
    writers = [make_store(), make_store()]  # two gateway workers
    records = [make_record(i, day=i % 3) for i in range(400)]
    calls = with_duplicates(records, seed=3)
    batches = [calls[i : i + 25] for i in range(0, len(calls), 25)]
    batched, single = await asyncio.gather(
        asyncio.gather(*(writers[i % 2].record_many(b) for i, b in enumerate(batches))),
        asyncio.gather(*(writers[1].record(rec) for rec in records[:50])),  # racing them
    )
    assert sum(sum(flags) for flags in batched) + sum(single) == len(records)  # each new once

    reader = make_store()
    events = await reader.events(limit=10_000)
    assert Counter(e.record_id for e in events) == Counter(r.record_id for r in records)
    for group_by in ([], ["team"], ["day", "model"], ["team", "route", "deployment"]):
        assert await reader.aggregate(*WIDE, group_by) == expected_rows(records, group_by)
    assert await reader.get("req-123") == records[123]

    # Spread: every shard's keys in one slot, the shards over every master.
    masters_of_shard: dict[str, set[int]] = {}
    for port, keys in redis_cluster.keys(prefix + "*").items():
        for key in keys:
            masters_of_shard.setdefault(key.split("}")[0] + "}", set()).add(port)
    assert all(len(ports) == 1 for ports in masters_of_shard.values())
    used = set().union(*masters_of_shard.values())
    assert len(used) >= 2
    assert len(used) == len(redis_cluster.masters())  # the 16 tags happen to reach all 3
    assert len(reader.event_stream_keys()) == SHARDS


async def test_a_master_failing_over_under_load_loses_nothing_and_counts_nothing_twice(
    make_store: MakeStore, redis_cluster: LocalCluster, tmp_path: Path
) -> None:
    """Records stream in while (1) a master stops answering long enough for its replica
    to take over (DEBUG SLEEP: an automatic failover; the ledger spools what times out
    and replays it) and (2) another master hands over to its replica (CLUSTER FAILOVER:
    redirects). Afterwards every record is in the ledger exactly once."""
    store = make_store()
    ledger = CostLedger(store, Spool(tmp_path / "ledger.spool"), replay_interval_s=0.2)
    ledger.start()
    records: list[SpendRecord] = []
    failed_over = asyncio.Event()
    spooled_at_most = 0

    async def write() -> None:
        nonlocal spooled_at_most
        rng = random.Random(5)
        while not failed_over.is_set():
            batch = [make_record(len(records) + j, day=j % 2) for j in range(15)]
            records.extend(batch)
            for rec in [*batch, rng.choice(records)]:  # and one again: a replay
                ledger.submit(rec)
            spooled_at_most = max(spooled_at_most, ledger.spooled_count)
            await asyncio.sleep(0.01)

    async def fail_over() -> None:
        sleeper, handover = redis_cluster.masters()[:2]
        await asyncio.sleep(1.0)
        await asyncio.to_thread(sleep_node, redis_cluster, sleeper, 7)
        await asyncio.to_thread(
            eventually, lambda: sleeper not in redis_cluster.masters(), 30, "a failover"
        )
        await asyncio.sleep(1.0)
        await asyncio.to_thread(redis_cluster.failover, handover)
        await asyncio.sleep(1.0)
        failed_over.set()

    try:
        await asyncio.gather(write(), fail_over())
        assert await ledger.flush(30)
        await eventually_async(lambda: not ledger.degraded, 60, "the spool replayed", 0.1)
    finally:
        failed_over.set()
        await ledger.stop()
    await asyncio.to_thread(redis_cluster.wait_healthy, 60)

    assert spooled_at_most > 0  # the outage was seen, and spooled
    assert ledger.dropped_count == 0 and ledger.expired_count == 0
    reader = make_store()
    events = await reader.events(limit=100_000)
    assert Counter(e.record_id for e in events) == Counter(r.record_id for r in records)
    assert await reader.aggregate(*WIDE, ["day"]) == expected_rows(records, ["day"])


def sleep_node(cluster: LocalCluster, port: int, seconds: int) -> None:
    """`DEBUG SLEEP`: the node answers nothing (not even its cluster peers) meanwhile."""
    with cluster.node(port) as client:
        client.execute_command("DEBUG", "SLEEP", seconds)


BUDGET = BudgetRule("team", "research", "day", LIMIT_NANOS, None, None)


async def test_concurrent_admissions_never_overspend_a_budget(
    redis_cluster: LocalCluster, prefix: str
) -> None:
    """Two workers' stores, 300 admissions at once (each worst case 1/40 of the limit),
    through pools of 8 connections: each waits for a connection, none is refused for
    want of one, and the reservations never pass the limit."""
    period = Period(datetime.now(UTC).strftime("%Y-%m-%d"), time.time() + 86400)
    worst = LIMIT_NANOS // 40
    # 2 s of silence before an outage is declared (0.5 s by default): six redis-servers
    # and 300 calls share a loaded CI machine's two cores, and the budget is the point.
    stores = [
        RedisLimitStore(
            redis_cluster.url, prefix, cluster=True, max_connections=8, socket_timeout=2.0
        )
        for _ in range(2)
    ]

    def ask(i: int) -> Ask:
        return Ask(f"r{i}", (), (BUDGET,), (period,), (worst,), (0,), 0, 60_000)

    def charge(i: int, cost: int) -> Charge:
        return Charge(f"r{i}", (), (BUDGET,), (period,), -1, 0, cost)

    try:
        verdicts = await asyncio.gather(*(stores[i % 2].admit(ask(i)) for i in range(300)))
        admitted = [i for i, v in enumerate(verdicts) if isinstance(v, Admitted)]
        assert len(admitted) == 40
        assert all(isinstance(v, Admitted | BudgetRefusal) for v in verdicts)
        # Settled at half the worst case: room for more, taken by a second wave.
        await stores[0].settle_many([charge(i, worst // 2) for i in admitted])
        again = await asyncio.gather(*(stores[i % 2].admit(ask(i)) for i in range(300, 400)))
        assert sum(isinstance(v, Admitted) for v in again) == 20
        [spent] = await stores[1].spent([(BUDGET, period)])
        assert spent == 40 * (worst // 2)
    finally:
        for store in stores:
            await store.close()


async def test_breakers_are_shared_between_workers(
    redis_cluster: LocalCluster, prefix: str
) -> None:
    clients = [
        redis_client(
            redis_cluster.url,
            socket_timeout=1.0,
            connect_timeout=1.0,
            max_connections=100,
            cluster=True,
        )
        for _ in range(2)
    ]
    settings = BreakerSettings(failure_threshold=2, cooldown_s=30)
    one, two = (CircuitBreakers(settings, client, prefix) for client in clients)
    try:
        for _ in range(2):
            one.record_failure("gpu-1", UpstreamConnectFailed("refused"))
        assert one.state("gpu-1") == "open"

        async def adopted() -> bool:
            await two.sync(["gpu-1", "gpu-2"])
            return two.is_ejected("gpu-1")

        await eventually_async(adopted, 5, "the second worker to adopt the ejection")
        assert not two.is_ejected("gpu-2")
    finally:
        for client in clients:
            await client.aclose()


async def test_gateways_on_the_cluster_serve_record_and_keep_a_budget(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    redis_cluster: LocalCluster,
    redis_prefix: str,
    make_store: MakeStore,
) -> None:
    """Two gateways with CASCADE_REDIS_CLUSTER=true (limits, breakers and the ledger on
    the cluster) answer a burst against a small shared budget: some served, the rest
    refused, the spend within the limit, each served request recorded once."""
    fake_openai.tokens, fake_openai.delay_s = 5, 0.02
    env = {"CASCADE_REDIS_CLUSTER": "true", "PREMIUM_URL": fake_openai.url}
    servers = [start_gateway(POLICY, redis=redis_cluster.url, **env) for _ in range(2)]
    body = {"model": "auto", "messages": MESSAGES, "max_tokens": MAX_TOKENS}
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        responses = await asyncio.gather(
            *(
                client.post(f"{servers[i % 2].url}/v1/chat/completions", json=body, headers=AUTH)
                for i in range(240)
            )
        )
    accepted = [r.headers["x-request-id"] for r in responses if r.status_code == 200]
    refused = {
        (r.status_code, r.json()["error"]["code"]) for r in responses if r.status_code != 200
    }
    assert accepted and refused & {(429, "budget_exceeded"), (429, "budget_busy")}
    assert refused <= {(429, "budget_exceeded"), (429, "budget_busy"), (503, "limits_unavailable")}

    store = RedisStore(redis_cluster.url, prefix=redis_prefix, cluster=True, shards=SHARDS)
    try:

        async def recorded() -> list[SpendRecord]:
            events = await store.events(limit=10_000)
            return events if len(events) >= len(accepted) else []

        events = await eventually_async(recorded, 20, "every answer recorded")
        assert sorted(e.request_id for e in events) == sorted(accepted)  # each once
        today = datetime.now(UTC).date()
        [total] = await store.aggregate(today, today, [])
        assert total.requests == len(accepted)
        assert total.cost_nanos == sum(e.cost_nanos for e in events) <= LIMIT_NANOS
    finally:
        await store.close()
        redis_cluster.delete_prefix(redis_prefix)


def test_a_cluster_url_names_database_zero_only() -> None:
    with pytest.raises(ValueError, match="database 0 only"):
        RedisStore("redis://127.0.0.1:7000/3", cluster=True)


async def test_an_unreachable_cluster_is_an_outage_to_the_ledger() -> None:
    """No node answers: the ledger reads that as an outage (it spools), not a crash."""
    store = RedisStore("redis://127.0.0.1:1/0", cluster=True, shards=SHARDS)
    try:
        assert await store.ping() is False
        with pytest.raises(LedgerUnavailable, match=re.escape("127.0.0.1:1 (cluster)")):
            await store.record(make_record(1))
    finally:
        await store.close()
