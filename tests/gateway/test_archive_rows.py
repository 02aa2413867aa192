"""Archive rows from odd records: a wrong type in one record never fails its file (and
with it its batch, retried forever); and the exporter needs pyarrow alone."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.ledger import RedisStore
from gateway.ledger.archive import ArchiveDependencyMissing, ArchiveExporter, check_installed
from gateway.ledger.archive.schema import RECORD_FIELDS, row_of, table_of
from gateway.spend.archive_report import ArchiveAggregates
from tests.gateway.archive_support import FAST, REPO, archived_rows, varied_record
from tests.gateway.ledger_fixtures import delete_prefix


@pytest.fixture
async def prefix(redis_url: str) -> AsyncIterator[str]:
    prefix = f"cgtest-{uuid.uuid4().hex[:10]}:"
    yield prefix
    await delete_prefix(redis_url, prefix)


def record_json(i: int, **changes: Any) -> bytes:
    return orjson.dumps({**json.loads(varied_record(i).to_json()), **changes})


async def test_records_with_wrongly_typed_fields_are_archived_with_their_batch(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    store = RedisStore(redis_url, prefix=prefix)
    [key] = store.event_stream_keys()
    await store.record_many([varied_record(i) for i in range(10)])
    # Parses as a record, with a number for a string and an int64 past its range.
    parses = record_json(10, record_id="req-10", team=123, model=["a", "b"], cost_nanos=2**63)
    # Does not parse (latency_ms): kept as far as it goes.
    broken = record_json(
        11, record_id="req-11", team={"x": 1}, prompt_tokens="12", latency_ms="slow"
    )
    for entry_id, body in (("req-10", parses), ("req-11", broken)):
        await store.client.xadd(key, {"id": entry_id, "json": body})
    await store.record_many([varied_record(i) for i in range(12, 20)])

    exporter = ArchiveExporter(store.client, [key], tmp_path, FAST)
    assert await exporter.drain() == 20
    await store.close()
    rows = {row["record_id"]: row for row in archived_rows(tmp_path)}
    assert len(rows) == 20
    assert (rows["req-10"]["team"], rows["req-10"]["model"]) == ("123", '["a","b"]')
    assert rows["req-10"]["cost_nanos"] is None
    assert json.loads(rows["req-10"]["extra"]) == {"cost_nanos": 2**63}
    assert rows["req-11"]["team"] == '{"x":1}' and rows["req-11"]["prompt_tokens"] == 12
    assert rows["req-11"]["latency_ms"] is None
    assert json.loads(rows["req-11"]["extra"]) == {"latency_ms": "slow"}
    assert rows["req-11"]["day"] == varied_record(11).day  # from its ts


def test_a_value_no_row_should_hold_still_does_not_fail_the_file() -> None:
    good = row_of("s", "1-0", {"id": "req-1", "json": varied_record(1).to_json().decode()})
    odd = {**good, "event_id": "2-0", "team": 5, "cost_nanos": "many"}  # past row_of
    table = table_of([good, odd])
    assert table.column("team").to_pylist() == [good["team"], None]
    assert table.column("cost_nanos").to_pylist() == [good["cost_nanos"], None]
    assert set(RECORD_FIELDS) <= set(table.column_names)


def test_the_exporter_needs_pyarrow_alone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """DuckDB is for reports: a gateway worker that archives never loads it."""
    monkeypatch.setitem(sys.modules, "duckdb", None)
    check_installed()
    with pytest.raises(ArchiveDependencyMissing, match="needs duckdb"):
        ArchiveAggregates(tmp_path)
    probe = "from gateway.ledger.archive import check_installed; import sys; check_installed(); "
    probe += "print('duckdb' in sys.modules, 'pyarrow' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["False", "True"]
