"""The LedgerStore contract, run against RedisStore (real Redis: one slot, and spread
over shards) and MemoryStore."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from gateway.ledger import LedgerStore, SpendRecord
from gateway.ledger.record import DIMENSIONS
from tests.gateway.ledger_fixtures import (
    CONTRACT_DB,
    DAY0,
    StoreFactory,
    expected_rows,
    make_record,
    store_factory,
)

WIDE = (DAY0 - timedelta(days=30), DAY0 + timedelta(days=30))


@pytest.fixture(params=["redis", "redis-sharded", "memory"])
async def make_store(request: pytest.FixtureRequest) -> AsyncIterator[StoreFactory]:
    async for factory in store_factory(request.param, CONTRACT_DB):
        yield factory


@pytest.fixture
async def store(make_store: StoreFactory) -> LedgerStore:
    return await make_store()


async def test_record_then_get(store: LedgerStore) -> None:
    rec = make_record(1, ttft_ms=120.5, stream=True, latency_ms=900.25, escalations=1, score=0.4375)
    assert await store.record(rec) is True
    assert await store.get(rec.record_id) == rec
    assert await store.get("never-recorded") is None


async def test_extra_attempts_add_cost_not_requests(store: LedgerStore) -> None:
    """An escalation (`<id>:1`), a losing hedge (`<id>:h1`) and a second opinion
    (`<id>:o1`) are priced, but the request is counted once, by its first answer."""
    first = make_record(1, team="research")
    extras = [
        make_record(1, team="research", record_id=f"req-1:{suffix}", reference_cost_nanos=0)
        for suffix in ("1", "h1", "o1")
    ]
    for rec in (first, *extras):
        assert await store.record(rec) is True
    [row] = await store.aggregate(*WIDE, ["team"])
    assert row.requests == 1
    assert row.cost_nanos == 4 * first.cost_nanos
    assert row.reference_cost_nanos == first.reference_cost_nanos


async def test_duplicate_record_id_changes_nothing(store: LedgerStore) -> None:
    first = make_record(3)
    assert await store.record(first) is True
    before = await store.aggregate(*WIDE, ["team", "model"])
    again = make_record(3, cost_nanos=999_999, team="someone-else")
    assert await store.record(first) is False
    assert await store.record(again) is False
    assert await store.aggregate(*WIDE, ["team", "model"]) == before
    assert await store.get(first.record_id) == first
    assert [e.record_id for e in await store.events()] == [first.record_id]


@pytest.mark.parametrize("dimension", DIMENSIONS)
async def test_aggregate_by_each_dimension(store: LedgerStore, dimension: str) -> None:
    records = [make_record(i) for i in range(30)]
    for rec in records:
        await store.record(rec)
    rows = await store.aggregate(*WIDE, [dimension])
    assert rows == expected_rows(records, [dimension])
    assert len(rows) > 1


async def test_aggregate_by_team_and_model(store: LedgerStore) -> None:
    records = [make_record(i) for i in range(40)]
    for rec in records:
        await store.record(rec)
    assert await store.aggregate(*WIDE, ["team", "model"]) == expected_rows(
        records, ["team", "model"]
    )
    # Order of group_by is the caller's; the rows follow it.
    assert await store.aggregate(*WIDE, ["model", "day", "team"]) == expected_rows(
        records, ["model", "day", "team"]
    )


async def test_aggregate_by_day_across_three_days(store: LedgerStore) -> None:
    records = [make_record(i, day=i % 3) for i in range(30)]
    records.append(make_record(99, day=5))  # outside the queried range
    for rec in records:
        await store.record(rec)
    last = DAY0 + timedelta(days=2)
    rows = await store.aggregate(DAY0, last, ["day"])
    assert [row.group["day"] for row in rows] == ["2026-11-28", "2026-11-29", "2026-11-30"]
    assert rows == expected_rows(records, ["day"], DAY0, last)
    # Both ends are inclusive.
    one_day = await store.aggregate(last, last, ["day", "team"])
    assert one_day == expected_rows(records, ["day", "team"], last, last)
    assert await store.aggregate(DAY0 + timedelta(days=3), DAY0 + timedelta(days=4), []) == []


async def test_empty_group_by_gives_one_total_row(store: LedgerStore) -> None:
    assert await store.aggregate(*WIDE, []) == []
    records = [make_record(i, day=i % 2) for i in range(25)]
    for rec in records:
        await store.record(rec)
    rows = await store.aggregate(*WIDE, [])
    assert len(rows) == 1
    assert rows == expected_rows(records, [])
    assert rows[0].group == {}
    assert rows[0].cost_nanos == sum(rec.cost_nanos for rec in records)
    assert rows[0].savings_nanos == sum(
        rec.reference_cost_nanos - rec.cost_nanos for rec in records
    )


async def test_errors_are_counted_as_requests_too(store: LedgerStore) -> None:
    await store.record(make_record(1, status="ok"))
    await store.record(make_record(2, status="error"))
    await store.record(make_record(3, status="partial"))
    await store.record(make_record(4, status="error", prompt_tokens=0, cost_nanos=0))
    [row] = await store.aggregate(*WIDE, [])
    assert (row.requests, row.errors, row.calls) == (4, 2, 2)


async def test_requests_their_clients_cancelled_are_neither_errors_nor_calls(
    store: LedgerStore,
) -> None:
    await store.record(make_record(1, status="ok"))
    await store.record(make_record(8, status="cancelled", prompt_tokens=0, cost_nanos=0))
    [row] = await store.aggregate(*WIDE, [])
    assert (row.requests, row.errors, row.calls) == (2, 0, 1)
    assert (await store.get("req-8")) == make_record(
        8, status="cancelled", prompt_tokens=0, cost_nanos=0
    )


async def test_a_cancelled_request_leaves_a_rows_savings_as_they_were(
    store: LedgerStore,
) -> None:
    """A row of a compared call, an uncompared one (no reference model) and a request
    its client cancelled on a route without a reference: partly covered, as without
    the cancelled one, and its savings are those of the compared call."""
    await store.record(make_record(1, team="t"))
    await store.record(make_record(2, team="t", reference_model=None, reference_cost_nanos=0))
    [before] = await store.aggregate(*WIDE, ["team"])
    cancelled = {"status": "cancelled", "prompt_tokens": 0, "completion_tokens": 0}
    await store.record(
        make_record(
            3, team="t", reference_model=None, reference_cost_nanos=0, cost_nanos=0, **cancelled
        )
    )
    [after] = await store.aggregate(*WIDE, ["team"])
    assert (after.requests, before.coverage, after.coverage) == (3, "partial", "partial")
    assert after.savings_nanos == before.savings_nanos is not None
    # A row of that cancelled request alone compares nothing: no coverage, no savings.
    by_key = {row.group["key"]: row for row in await store.aggregate(*WIDE, ["key"])}
    alone = by_key["key-3"]
    assert (alone.requests, alone.coverage, alone.savings_nanos) == (1, "none", None)


async def test_sla_outcomes_are_counted_and_records_without_one_are_not(
    store: LedgerStore,
) -> None:
    for i, met in enumerate((True, True, False, None)):
        await store.record(make_record(i, sla_met=met, route="auto"))
    [row] = await store.aggregate(*WIDE, ["route"])
    assert (row.requests, row.sla_met, row.sla_missed) == (4, 2, 1)
    assert (await store.get("req-2")) == make_record(2, sla_met=False, route="auto")


def test_records_from_before_the_sla_field_read_back_as_unknown() -> None:
    old = make_record(5).to_dict()
    del old["sla_met"]
    assert SpendRecord.from_dict(old).sla_met is None
    as_strings = {
        name: str(value) for name, value in make_record(6, sla_met=False).to_dict().items()
    }
    assert SpendRecord.from_dict(as_strings).sla_met is False


async def test_a_select_routes_prediction_and_target_round_trip(store: LedgerStore) -> None:
    chosen = make_record(7, predicted_quality=0.7312, quality_target=0.6946)
    await store.record(chosen)
    assert await store.get(chosen.record_id) == chosen
    as_strings = {name: str(value) for name, value in chosen.to_dict().items()}
    assert SpendRecord.from_dict(as_strings) == chosen
    plain = {name: str(value) for name, value in make_record(8).to_dict().items()}
    assert SpendRecord.from_dict(plain).predicted_quality is None  # other strategies


async def test_awkward_values_round_trip(store: LedgerStore) -> None:
    """Separators and JSON syntax inside values must not split or merge groups."""
    odd = ["a|b", "a", "b", '["x","y"]', 'ü "quoted" \\ /', "", "cost_nanos|a"]
    records = [make_record(i, team=team, model=odd[-1 - i]) for i, team in enumerate(odd)]
    for rec in records:
        await store.record(rec)
    for group_by in (["team"], ["model"], ["team", "model"], ["day", "team", "key"]):
        assert await store.aggregate(*WIDE, group_by) == expected_rows(records, group_by)


async def test_unknown_group_by_is_rejected(store: LedgerStore) -> None:
    with pytest.raises(ValueError, match="'color'"):
        await store.aggregate(*WIDE, ["team", "color"])


async def test_events_oldest_first_and_bounded(make_store: StoreFactory) -> None:
    store = await make_store(stream_maxlen=5)
    records = [make_record(i) for i in range(12)]
    for rec in records:
        await store.record(rec)
    assert await store.events() == records[-5:]
    assert await store.events(limit=2) == records[-2:]
    assert await store.events(limit=0) == []
    # Aggregates are not bounded by the stream.
    assert await store.aggregate(*WIDE, []) == expected_rows(records, [])


async def test_concurrent_records_count_exactly_once(store: LedgerStore) -> None:
    records = [make_record(i, day=i % 3) for i in range(200)]
    duplicates = [make_record(i, day=i % 3) for i in random.Random(7).sample(range(200), 50)]
    calls = records + duplicates
    random.Random(11).shuffle(calls)
    results = await asyncio.gather(*(store.record(rec) for rec in calls))
    assert sum(results) == 200
    events = await store.events(limit=1000)
    assert len(events) == 200
    assert {e.record_id for e in events} == {r.record_id for r in records}
    [total] = await store.aggregate(*WIDE, [])
    assert total.requests == 200
    assert total.cost_nanos == sum(r.cost_nanos for r in records)
    assert total.reference_cost_nanos == sum(r.reference_cost_nanos for r in records)
    assert total.prompt_tokens == sum(r.prompt_tokens for r in records)
    assert total.completion_tokens == sum(r.completion_tokens for r in records)
    assert await store.aggregate(*WIDE, ["day", "deployment"]) == expected_rows(
        records, ["day", "deployment"]
    )


async def test_ping(store: LedgerStore) -> None:
    assert await store.ping() is True


async def test_record_many_is_record_for_each_in_one_call(store: LedgerStore) -> None:
    records = [make_record(i) for i in range(50)]
    await store.record(records[3])
    batch = [*records, records[7]]  # one seen before, one repeated inside the batch
    added = await store.record_many(batch)
    assert added == [i != 3 for i in range(50)] + [False]
    assert await store.aggregate(*WIDE, ["team"]) == expected_rows(records, ["team"])
    assert sorted(e.record_id for e in await store.events()) == sorted(r.record_id for r in records)
