"""The spend archive on real Redis: records written through the ledger land in the
Parquet files exactly once, with every field, and `spend report --archive` answers as
the Redis report does."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from gateway.cli import main
from gateway.ledger import CostLedger, RedisStore, SpendRecord, Spool
from gateway.ledger.archive import ArchiveDependencyMissing, ArchiveExporter, check_installed
from gateway.ledger.archive.commit import Entry, plan_runs
from gateway.ledger.archive.layout import stream_slug
from gateway.ledger.archive.schema import COLUMNS, RECORD_FIELDS, column_kinds, kind_of
from gateway.ledger.record import StatusType, utc_day
from gateway.ledger.stream_ids import parse_id
from tests.gateway.archive_support import FAST, archived_rows, assert_exactly_once, varied_record
from tests.gateway.ledger_fixtures import DAY0, delete_prefix


@pytest.fixture
async def prefix(redis_url: str) -> AsyncIterator[str]:
    prefix = f"cgtest-{uuid.uuid4().hex[:10]}:"
    yield prefix
    await delete_prefix(redis_url, prefix)


async def write_through_ledger(store: RedisStore, tmp_path: Path, recs: list[SpendRecord]) -> None:
    """As the gateway writes: `submit`, then a flush on stop."""
    ledger = CostLedger(store, Spool(tmp_path / "spool"))
    ledger.start()
    for rec in recs:
        ledger.submit(rec)
    await ledger.stop()
    assert ledger.spooled_count == 0


@pytest.mark.parametrize("shards", [1, 4])
async def test_records_written_through_the_ledger_are_archived_once_with_every_field(
    redis_url: str, prefix: str, tmp_path: Path, shards: int
) -> None:
    store = RedisStore(redis_url, prefix=prefix, shards=shards)
    recs = [varied_record(i, day=i % 3) for i in range(600)]
    await write_through_ledger(store, tmp_path, recs)
    await write_through_ledger(store, tmp_path, recs[:50])  # replays: deduped by the ledger
    root = tmp_path / "archive"
    exporter = ArchiveExporter(store.client, store.event_stream_keys(), root, FAST)
    assert await exporter.drain() == 600
    assert await exporter.drain() == 0  # nothing new: nothing written again
    await store.close()

    assert_exactly_once(root, {rec.record_id for rec in recs})
    by_id = {row["record_id"]: row for row in archived_rows(root)}
    for rec in recs:
        row = by_id[rec.record_id]
        assert {name: row[name] for name in RECORD_FIELDS} == rec.to_dict()
        assert row["day"] == rec.day and row["extra"] is None
        assert row["event_stream"] in store.event_stream_keys()
    # Each record in its own day's directory; one stream's files per name.
    days = {path.parent.name for path in root.glob("day=*/*.parquet")}
    assert days == {f"day={DAY0.replace(day=DAY0.day + d)}" for d in range(3)}
    slugs = {path.name.split("_")[0] for path in root.glob("day=*/*.parquet")}
    assert slugs == {stream_slug(key) for key in store.event_stream_keys()}


async def test_the_stream_keeps_only_what_is_not_archived(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """Acked entries are deleted from the stream: the MAXLEN room is the backlog's."""
    store = RedisStore(redis_url, prefix=prefix)
    await store.record_many([varied_record(i) for i in range(30)])
    [key] = store.event_stream_keys()
    exporter = ArchiveExporter(store.client, [key], tmp_path, FAST)
    await exporter.drain()
    assert await store.client.xlen(key) == 0
    assert (await store.client.xpending(key, "archive"))["pending"] == 0
    await store.record_many([varied_record(i) for i in range(30, 35)])
    assert await store.client.xlen(key) == 5
    await store.close()


def test_every_record_field_is_a_column_typed_from_its_annotation() -> None:
    kinds = column_kinds()
    assert tuple(kinds) == COLUMNS
    assert set(RECORD_FIELDS) == set(SpendRecord.__dataclass_fields__)
    assert kinds["record_id"] == kinds["status"] == kinds["reference_model"] == "string"
    assert kinds["cost_nanos"] == kinds["cache_read_tokens"] == "int64"
    assert kinds["ts"] == kinds["ttft_ms"] == "float64"
    assert kinds["stream"] == kinds["sla_met"] == "bool"
    assert kind_of(StatusType) == "string" and kind_of(int | None) == "int64"


async def test_unknown_fields_are_kept_and_unreadable_records_archived_as_far_as_they_go(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """A newer gateway's field goes to `extra`; a record missing required fields keeps
    what it has (nulls for the rest); an entry with no JSON keeps its raw fields."""
    store = RedisStore(redis_url, prefix=prefix)
    [key] = store.event_stream_keys()
    newer = {**json.loads(varied_record(3).to_json()), "future_field": [1, 2]}
    await store.client.xadd(key, {"id": "req-3", "json": orjson.dumps(newer)})
    broken = {"record_id": "bad-1", "ts": 1_796_000_000.0, "cost_nanos": "x"}
    await store.client.xadd(key, {"id": "bad-1", "json": orjson.dumps(broken)})
    await store.client.xadd(key, {"id": "bad-2", "other": "field"})
    exporter = ArchiveExporter(store.client, [key], tmp_path, FAST)
    assert await exporter.drain() == 3
    await store.close()

    rows = {row["record_id"] or row["extra"]: row for row in archived_rows(tmp_path)}
    assert json.loads(rows["req-3"]["extra"]) == {"future_field": [1, 2]}
    assert rows["req-3"]["cache_read_tokens"] == varied_record(3).cache_read_tokens
    assert rows["bad-1"]["cost_nanos"] is None and rows["bad-1"]["team"] is None
    assert rows["bad-1"]["day"] == utc_day(1_796_000_000 // 86400)  # from its ts
    [raw] = [row for row in rows.values() if row["record_id"] is None]
    assert json.loads(raw["extra"]) == {"id": "bad-2", "other": "field"}


def test_plan_writes_only_uncovered_entries_and_never_spans_another_file() -> None:
    def entry(ms: int, day: str) -> Entry:
        return Entry(f"{ms}-0", parse_id(f"{ms}-0"), {"day": day})

    batch = [entry(ms, "2026-11-28") for ms in range(1, 9)] + [entry(9, "2026-11-29")]
    existing = {"2026-11-28": [((3, 0), (4, 0)), ((6, 0), (6, 0))]}  # covers 3, 4 and 6
    runs = plan_runs(batch, existing)
    assert [[e.sid[0] for e in run] for run in runs] == [[1, 2], [5], [7, 8], [9]]
    # A file between two uncovered entries (none of the batch's in it) splits the run.
    between = {"2026-11-28": [((3, 0), (4, 0))]}
    assert [len(run) for run in plan_runs([batch[0], batch[4]], between)] == [1, 1]
    assert plan_runs([Entry("1-0", (1, 0), None)], {}) == []  # nothing to write: gone


@pytest.fixture
def ledger_env(monkeypatch: pytest.MonkeyPatch, redis_url: str, prefix: str) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("CASCADE_REDIS_PREFIX", prefix)


@pytest.mark.parametrize("group_by", ["team", "day", "", "day,team,model", "key,route,tier"])
def test_archive_report_has_the_redis_reports_columns_and_totals(
    redis_url: str,
    prefix: str,
    tmp_path: Path,
    ledger_env: None,
    capsys: pytest.CaptureFixture[str],
    group_by: str,
) -> None:
    async def fill() -> None:
        store = RedisStore(redis_url, prefix=prefix)
        await store.record_many([varied_record(i, day=i % 4) for i in range(400)])
        await ArchiveExporter(store.client, store.event_stream_keys(), tmp_path, FAST).drain()
        await store.close()

    asyncio.run(fill())
    window = ["--from", "2026-11-29", "--to", "2026-12-01", "--group-by", group_by]
    archive = ["--archive", str(tmp_path)]
    for fmt in ("json", "csv"):
        assert main(["spend", "report", *window, "--format", fmt]) == 0
        from_redis = capsys.readouterr().out
        assert main(["spend", "report", *window, "--format", fmt, *archive]) == 0
        assert capsys.readouterr().out == from_redis
        if fmt == "json":  # a real comparison: rows of every kind
            rows = json.loads(from_redis)["data"]
            assert rows and sum(row["requests"] for row in rows) < sum(r["calls"] for r in rows)
            assert any(row["unreferenced_cost_usd"] for row in rows)


def test_archive_report_spans_any_range_and_says_when_there_is_no_archive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    window = ["--from", "2020-01-01", "--to", "2026-12-31", "--format", "json"]
    assert main(["spend", "report", *window]) == 2  # Redis keeps 400 days
    assert "spans more than 400 days" in capsys.readouterr().err
    assert main(["spend", "report", *window, "--archive", str(tmp_path / "none")]) == 1
    assert f"no archive at {tmp_path / 'none'}" in capsys.readouterr().err
    assert main(["spend", "report", *window, "--archive", str(tmp_path)]) == 0
    body = json.loads(capsys.readouterr().out)
    assert (body["data"], body["note"]) == ([], "no requests from 2020-01-01 to 2026-12-31")


def test_a_missing_dependency_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    with pytest.raises(ArchiveDependencyMissing, match=r"pip install 'cascade-gateway\[archive\]'"):
        check_installed()


async def test_archive_files_are_plain_parquet(redis_url: str, prefix: str, tmp_path: Path) -> None:
    store = RedisStore(redis_url, prefix=prefix)
    await store.record_many([varied_record(i) for i in range(10)])
    await ArchiveExporter(store.client, store.event_stream_keys(), tmp_path, FAST).drain()
    await store.close()
    [path] = tmp_path.glob("day=*/*.parquet")
    name = path.name.removesuffix(".parquet").split("_")
    table = pq.read_table(path)
    assert table.column_names == list(COLUMNS)
    ids = table.column("event_id").to_pylist()
    assert [name[1], name[2]] == [ids[0], ids[-1]]  # the name carries the id range
    assert not list(tmp_path.rglob("*.tmp"))


def test_spend_export_once_drains_the_ledger_and_exits(
    redis_url: str,
    prefix: str,
    tmp_path: Path,
    ledger_env: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    async def fill() -> None:
        store = RedisStore(redis_url, prefix=prefix)
        await store.record_many([varied_record(i) for i in range(75)])
        await store.close()

    asyncio.run(fill())
    root = tmp_path / "archive"
    assert main(["spend", "export", "--archive", str(root), "--once"]) == 0
    assert capsys.readouterr().out == f"archived 75 record(s) into {root}\n"
    assert_exactly_once(root, {varied_record(i).record_id for i in range(75)})
    assert main(["spend", "export", "--archive", str(root), "--once"]) == 0
    assert capsys.readouterr().out.startswith("archived 0 record(s)")


def test_spend_export_needs_redis(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spend", "export", "--archive", str(tmp_path), "--once"]) == 1
    assert "set REDIS_URL" in capsys.readouterr().err
