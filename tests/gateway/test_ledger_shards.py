"""The ledger's key layout on one Redis: one shard keeps the documented `P{ledger}:...`
names; N shards put each record's keys under its shard's tag; a store refuses a ledger
laid out over another number of shards. (The contract itself runs sharded too, in
test_ledger_contract.py; on a real cluster in test_redis_cluster.py.)"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis
from pydantic import ValidationError

from gateway.ledger import LedgerLayoutError, RedisStore
from gateway.ledger.shards import shard_of
from gateway.settings import CLUSTER_LEDGER_SHARDS, Settings
from tests.gateway.ledger_fixtures import CONTRACT_DB, REDIS_URL, delete_prefix, make_record

URL = f"{REDIS_URL}/{CONTRACT_DB}"

MakeStore = Callable[..., RedisStore]


@pytest.fixture
async def prefix(redis_available: bool) -> AsyncIterator[str]:
    prefix = f"cgtest-{uuid.uuid4().hex}:"
    yield prefix
    await delete_prefix(URL, prefix)


@pytest.fixture
async def make_store(prefix: str) -> AsyncIterator[MakeStore]:
    made: list[RedisStore] = []

    def make(shards: int = 1) -> RedisStore:
        made.append(RedisStore(URL, prefix=prefix, shards=shards))
        return made[-1]

    yield make
    for store in made:
        await store.close()


async def keys(prefix: str) -> list[str]:
    client = aioredis.Redis.from_url(URL, decode_responses=True)
    try:
        return sorted([key async for key in client.scan_iter(match=prefix + "*", count=1000)])
    finally:
        await client.aclose()


def test_a_record_s_shard_depends_on_its_id_alone() -> None:
    # crc32: the same in every process and release (Python's `hash` is salted). Were it
    # to change, a record replayed after an upgrade would miss its marker.
    assert [shard_of(rid, 16) for rid in ("req-1", "req-2", "abc")] == [1, 11, 2]
    assert shard_of("anything", 1) == 0


async def test_one_shard_keeps_the_documented_key_names(make_store: MakeStore, prefix: str) -> None:
    store = make_store()
    await store.record(make_record(1))
    day = make_record(1).day
    dims = [f"{prefix}{{ledger}}:day:{day}:{d}" for d in ("deployment", "key", "model")]
    dims += [f"{prefix}{{ledger}}:day:{day}:{d}" for d in ("route", "team", "tier")]
    assert await keys(prefix) == sorted(
        [
            f"{prefix}{{ledger}}:days",
            f"{prefix}{{ledger}}:events",
            f"{prefix}{{ledger}}:rec:req-1",
            f"{prefix}{{ledger}}:day:{day}",
            *dims,
        ]
    )
    assert store.event_stream_keys() == [f"{prefix}{{ledger}}:events"]


async def test_n_shards_keep_each_record_under_its_shard_s_tag(
    make_store: MakeStore, prefix: str
) -> None:
    store = make_store(shards=4)
    records = [make_record(i) for i in range(40)]
    assert await store.record_many(records) == [True] * 40
    found = await keys(prefix)
    for rec in records:
        tag = f"{{ledger.{shard_of(rec.record_id, 4)}}}"
        assert f"{prefix}{tag}:rec:{rec.record_id}" in found
    tags = {key[len(prefix) :].split("}")[0] + "}" for key in found}
    assert tags == {"{ledger}", "{ledger.0}", "{ledger.1}", "{ledger.2}", "{ledger.3}"}
    assert f"{prefix}{{ledger}}:shards" in found  # the layout's record, and nothing else
    assert [key for key in found if key.startswith(f"{prefix}{{ledger}}:")] == [
        f"{prefix}{{ledger}}:shards"
    ]
    assert store.event_stream_keys() == [f"{prefix}{{ledger.{k}}}:events" for k in range(4)]
    assert await store.get("req-7") == records[7]
    assert await store.record(records[7]) is False  # the replay meets its marker


async def test_a_store_with_another_shard_count_refuses_the_ledger(
    make_store: MakeStore,
) -> None:
    await make_store(shards=4).record(make_record(1))
    for shards in (1, 2, 16):
        with pytest.raises(LedgerLayoutError, match="spread over 4 shard"):
            await make_store(shards=shards).events()
    assert len(await make_store(shards=4).events()) == 1


async def test_a_sharded_store_refuses_a_ledger_written_in_one_slot(
    make_store: MakeStore,
) -> None:
    await make_store().record(make_record(1))
    with pytest.raises(LedgerLayoutError, match="CASCADE_LEDGER_SHARDS=1"):
        await make_store(shards=16).record(make_record(2))
    assert [rec.record_id for rec in await make_store().events()] == ["req-1"]


def test_the_shard_count_defaults_to_one_on_a_single_redis_and_16_on_a_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().ledger_shard_count == 1
    monkeypatch.setenv("CASCADE_REDIS_CLUSTER", "true")
    assert Settings().ledger_shard_count == CLUSTER_LEDGER_SHARDS == 16
    monkeypatch.setenv("CASCADE_LEDGER_SHARDS", "4")
    assert Settings().ledger_shard_count == 4
    monkeypatch.setenv("CASCADE_LEDGER_SHARDS", "0")
    with pytest.raises(ValidationError):
        Settings()
