"""Limits spread over a real 3-master Redis Cluster (tests/cluster.py): each rule's keys
live in the slot of its scope and name, an admission runs one script per slot and
releases the others' reservations when one refuses, a settlement counts once per slot,
and concurrent admissions never overspend any budget."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.http.app import check_limits_layout
from gateway.ledger import MemoryStore
from gateway.limits.redis_store import RedisLimitStore
from gateway.limits.respread import spread_limits
from gateway.limits.rules import BudgetRule, Period, RateRule, periods_at
from gateway.limits.store import (
    Admitted,
    Ask,
    BudgetRefusal,
    Charge,
    LimitsLayoutError,
    RateRefusal,
)
from policies import load_policy
from tests.cluster import LocalCluster, cluster_prefix, redis_cluster

__all__ = ["cluster_prefix", "redis_cluster"]

PERIOD = Period("2031-01-31", time.time() + 86400)
TEAM = BudgetRule("team", "research", "day", 1_000_000, None, None)
KEY = BudgetRule("key", "k1", "day", 300_000, None, None)
ROUTE = BudgetRule("route", "auto", "day", 10_000_000, None, None)
KEY_RATE = RateRule("key", "k1", 1000, 1_000_000)
BUDGET_POLICY = """deployments:
  d: {api_base: "http://127.0.0.1:9/v1", model: m}
routes:
  auto: {deployments: [d]}
teams:
  research: {}
budgets:
  - {scope: team, name: research, period: day, limit_usd: 10}
"""


@pytest.fixture
def prefix(cluster_prefix: str) -> str:
    return cluster_prefix


@pytest.fixture
async def store(redis_cluster: LocalCluster, prefix: str) -> AsyncIterator[RedisLimitStore]:
    limits = RedisLimitStore(redis_cluster.url, prefix, cluster=True, socket_timeout=2.0)
    yield limits
    await limits.close()


@pytest.fixture
async def client(redis_cluster: LocalCluster) -> AsyncIterator[aioredis.RedisCluster]:
    connection = aioredis.RedisCluster.from_url(redis_cluster.url, decode_responses=True)
    yield connection
    await connection.aclose()


def ask(request_id: str, worst: int, *budgets: BudgetRule, **kw: Any) -> Ask:
    fields: dict[str, Any] = {
        "rates": (),
        "budgets": budgets,
        "periods": (PERIOD,) * len(budgets),
        "options": (worst,),
        "downgrades": (0,) * len(budgets),
        "tokens": 0,
        "hold_ms": 60_000,
    }
    fields.update(kw)
    return Ask(request_id, **fields)


def charge(request_id: str, cost: int, *budgets: BudgetRule, **kw: Any) -> Charge:
    fields: dict[str, Any] = {"rates": (), "window": -1, "token_delta": 0}
    fields.update(kw)
    periods = (PERIOD,) * len(budgets)
    return Charge(request_id, budgets=budgets, periods=periods, cost_nanos=cost, **fields)


async def amounts(
    client: aioredis.RedisCluster, store: RedisLimitStore, rule: BudgetRule
) -> dict[str, str]:
    return await client.hgetall(store.budget_key(rule.scope, rule.name, PERIOD.id))


def test_each_scope_and_name_has_its_own_slot(
    store: RedisLimitStore, redis_cluster: LocalCluster
) -> None:
    keys = [store.budget_key(r.scope, r.name, PERIOD.id) for r in (TEAM, KEY, ROUTE)]
    masters = {redis_cluster.master_of_key(key) for key in keys}
    assert len(masters) >= 2  # these three tags happen to reach two masters or more
    # A rule's rate and budget keys share its slot: one script may touch both.
    rate = store.rate_key("key", "k1")
    assert redis_cluster.master_of_key(rate) == redis_cluster.master_of_key(keys[1])
    assert "{limits:key:k1}" in rate and "{limits:key:k1}" in keys[1]


async def test_an_admission_across_slots_reserves_in_each(
    store: RedisLimitStore, client: aioredis.RedisCluster
) -> None:
    verdict = await store.admit(ask("a", 100_000, TEAM, KEY, ROUTE, rates=(KEY_RATE,), tokens=50))
    assert isinstance(verdict, Admitted) and verdict.windows == (verdict.window,)
    unseeded = (True, True, True)  # no seed offered: each slot says so for its budget
    assert verdict == Admitted(
        0, verdict.window, ((999, 999_950),), (False, False, False), (verdict.window,), unseeded
    )
    for rule in (TEAM, KEY, ROUTE):
        assert (await amounts(client, store, rule))["reserved"] == "100000"
    # Settled once per slot, however often it is sent.
    for _ in range(2):
        await store.settle_many([charge("a", 40_000, TEAM, KEY, ROUTE)])
    for rule in (TEAM, KEY, ROUTE):
        assert (await amounts(client, store, rule)) == {"spent": "40000", "reserved": "0"}


async def test_a_refusal_in_one_slot_releases_the_others(
    store: RedisLimitStore, client: aioredis.RedisCluster
) -> None:
    await store.settle_many([charge("before", 250_000, KEY)])  # the key's budget is nearly out
    refused = await store.admit(ask("b", 100_000, TEAM, KEY, ROUTE, rates=(KEY_RATE,), tokens=500))
    assert refused == BudgetRefusal(1, 250_000, 100_000, 0, 250_000, 300_000)  # the key's
    for rule in (TEAM, ROUTE):  # admitted in their slots, then released
        stored = await amounts(client, store, rule)
        assert stored.get("reserved", "0") == "0" and "h:b" not in stored
        held = store.budget_key(rule.scope, rule.name, PERIOD.id) + ":held"
        assert await client.zrange(held, 0, -1) == []
    # The key's rate window counted nothing of it either (it was released with the rest).
    rate = await client.hgetall(store.rate_key("key", "k1"))
    assert rate.get("r", "0") == "0" and rate.get("t", "0") == "0"


async def test_a_rate_refusal_comes_first_and_releases_the_budgets(
    store: RedisLimitStore, client: aioredis.RedisCluster
) -> None:
    one_a_minute = RateRule("key", "k1", 1, None)
    assert isinstance(await store.admit(ask("c1", 1_000, TEAM, rates=(one_a_minute,))), Admitted)
    refused = await store.admit(ask("c2", 1_000, TEAM, rates=(one_a_minute,)))
    assert isinstance(refused, RateRefusal) and refused.rule == 0
    assert (await amounts(client, store, TEAM))["reserved"] == "1000"  # c1's hold only


async def test_a_soft_limit_downgrades_every_slot_alike(
    store: RedisLimitStore, client: aioredis.RedisCluster
) -> None:
    soft_team = BudgetRule("team", "research", "day", 1_000_000, 100_000, "cheap")
    await store.settle_many([charge("spent", 150_000, soft_team)])  # past its soft limit
    verdict = await store.admit(
        ask("d", 0, soft_team, ROUTE, options=(90_000, 9_000), downgrades=(1, 0))
    )
    assert isinstance(verdict, Admitted) and verdict.option == 1
    assert verdict.past_soft == (True, False)
    # The route's slot held the downgraded plan's worst case, as the team's did.
    assert (await amounts(client, store, ROUTE))["reserved"] == "9000"
    assert (await amounts(client, store, soft_team))["reserved"] == "9000"


async def test_a_dead_worker_s_expired_hold_does_not_downgrade(
    store: RedisLimitStore, client: aioredis.RedisCluster
) -> None:
    """A hold past its expiry (its worker died before settling) is not spend: the plan
    read before the slots' scripts leaves it out, as each slot's admission does."""
    soft_team = BudgetRule("team", "research", "day", 1_000_000, 100_000, "cheap")
    await store.settle_many([charge("spent", 50_000, soft_team)])  # under its soft limit
    dead = await store.admit(ask("dead", 80_000, soft_team, hold_ms=50))
    assert isinstance(dead, Admitted)
    await asyncio.sleep(0.2)  # the hold expires, unreleased: 130,000 spent + reserved
    assert (await amounts(client, store, soft_team))["reserved"] == "80000"
    verdict = await store.admit(
        ask("next", 0, soft_team, ROUTE, options=(90_000, 9_000), downgrades=(1, 0))
    )
    assert isinstance(verdict, Admitted) and verdict.option == 0
    assert (await amounts(client, store, ROUTE))["reserved"] == "90000"  # the full plan's
    # The team's slot released the dead hold and reserved the same plan.
    assert (await amounts(client, store, soft_team))["reserved"] == "90000"


async def test_concurrent_admissions_across_slots_never_overspend(
    redis_cluster: LocalCluster, prefix: str, client: aioredis.RedisCluster
) -> None:
    """Two workers, 200 admissions at once against a team budget (room for 20) and 4
    keys' budgets (room for 8 each) in other slots: no budget is ever past its limit,
    and every refused request's holds in the other slots are released."""
    team = BudgetRule("team", "crowd", "day", 20 * 1_000, None, None)
    keys = [BudgetRule("key", f"k{i}", "day", 8 * 1_000, None, None) for i in range(4)]
    stores = [
        RedisLimitStore(
            redis_cluster.url, prefix, cluster=True, max_connections=8, socket_timeout=2.0
        )
        for _ in range(2)
    ]
    try:
        verdicts = await asyncio.gather(
            *(stores[i % 2].admit(ask(f"r{i}", 1_000, team, keys[i % 4])) for i in range(200))
        )
        admitted = [i for i, v in enumerate(verdicts) if isinstance(v, Admitted)]
        assert all(isinstance(v, Admitted | BudgetRefusal) for v in verdicts)
        assert 0 < len(admitted) <= 20
        for rule in (team, *keys):
            stored = await amounts(client, stores[0], rule)
            holders = [i for i in admitted if rule is team or keys[i % 4] is rule]
            assert int(stored.get("reserved", "0")) == 1_000 * len(holders) <= rule.limit_nanos
            assert {k for k in stored if k.startswith("h:")} == {f"h:r{i}" for i in holders}
    finally:
        for limits in stores:
            await limits.close()


async def test_budgets_written_in_one_slot_move_to_their_own(
    store: RedisLimitStore, client: aioredis.RedisCluster, prefix: str
) -> None:
    """`spend reshard` on a cluster: a deployment's `{limits}` keys (as a single Redis,
    or an earlier version, wrote them) keep their spend, holds and expiry in their new
    slots, and the spread store reads them."""
    old = f"{prefix}{{limits}}:"
    name = "team:with:colons"
    await client.hset(old + f"budget:team:{name}:{PERIOD.id}", mapping={"spent": 7_000})
    await client.expire(old + f"budget:team:{name}:{PERIOD.id}", 3600)
    await client.zadd(old + f"budget:team:{name}:{PERIOD.id}:held", {"r1": 1})
    await client.hset(old + "rate:key:k1", mapping={"w": 1, "r": 3})
    await client.set(old + "probe", "1")
    assert await spread_limits(client, prefix) == 3
    rule = BudgetRule("team", name, "day", 1_000_000, None, None)
    assert await store.spent([(rule, PERIOD)]) == [7_000]
    moved = store.budget_key("team", name, PERIOD.id)
    assert 3500 < await client.ttl(moved) <= 3600
    assert await client.zrange(moved + ":held", 0, -1) == ["r1"]
    assert await client.hget(store.rate_key("key", "k1"), "r") == "3"
    assert await client.exists(old + "probe") == 1  # not a rule's: left where it is
    assert await spread_limits(client, prefix) == 0  # run again: nothing left to move


async def test_a_gateway_refuses_to_start_on_budgets_left_in_the_one_slot(
    redis_cluster: LocalCluster,
    store: RedisLimitStore,
    client: aioredis.RedisCluster,
    prefix: str,
    tmp_path: Path,
) -> None:
    """A cluster gateway would read this period's budgets from their own slots: spend
    left in `{limits}` (not moved by `spend reshard`) would start again from zero, so
    the gateway refuses to start and says what to run; once moved, it starts."""
    (tmp_path / "policy.yaml").write_text(BUDGET_POLICY)
    policy = load_policy(tmp_path / "policy.yaml").policy
    day = periods_at(time.time())["day"].id
    await client.hset(f"{prefix}{{limits}}:budget:team:research:{day}", mapping={"spent": 5})
    ledger = MemoryStore()
    with pytest.raises(LimitsLayoutError, match="team 'research' daily budget"):
        await check_limits_layout(store, policy, ledger)
    again = RedisLimitStore(redis_cluster.url, prefix, cluster=True, socket_timeout=2.0)
    try:
        assert await spread_limits(client, prefix) == 1
        await check_limits_layout(again, policy, ledger)  # starts
    finally:
        await again.close()
