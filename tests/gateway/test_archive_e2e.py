"""A gateway with CASCADE_LEDGER_ARCHIVE_DIR archives the requests it serves, in the
background; without the archive it imports none of its dependencies, and configured
without them it refuses to start, naming the extra."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import pytest

from gateway.http.app import start_services
from gateway.ledger import RedisStore
from gateway.ledger.archive import ArchiveDependencyMissing
from gateway.settings import Settings
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.archive_support import archived_rows
from tests.gateway.conftest import (
    AUTH,
    StartGateway,
    metric,
    openai_compatible_policy,
    wait_for_record,
)
from tests.support import eventually


async def test_the_gateway_archives_what_it_serves_exactly_once(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    ledger_store: RedisStore,
    tmp_path: Path,
) -> None:
    root = tmp_path / "archive"
    server = start_gateway(
        openai_compatible_policy(),
        UPSTREAM_BASE_URL=fake_openai.url,
        CASCADE_LEDGER_ARCHIVE_DIR=str(root),
        CASCADE_LEDGER_ARCHIVE_FLUSH_S="0.2",
    )
    async with httpx.AsyncClient(timeout=30) as client:
        body = {"model": "auto", "messages": [{"role": "user", "content": "hello"}]}
        responses = await asyncio.gather(
            *(
                client.post(f"{server.url}/v1/chat/completions", json=body, headers=AUTH)
                for _ in range(60)
            )
        )
    assert [r.status_code for r in responses] == [200] * 60
    ids = {r.headers["x-request-id"] for r in responses}
    records = {request_id: await wait_for_record(ledger_store, request_id) for request_id in ids}

    def archived() -> list[str]:
        return [row["record_id"] for row in archived_rows(root)]

    await asyncio.to_thread(eventually, lambda: len(archived()) >= 60, 15, "the archive")
    assert sorted(archived()) == sorted(ids)
    for row in archived_rows(root):
        assert row["cost_nanos"] == records[row["record_id"]].cost_nanos
    assert metric(server.url, "cascade_ledger_archived_records_total") == 60
    assert metric(server.url, "cascade_ledger_archive_backlog_records") == 0
    server.stop()  # hands the lease back
    [key] = ledger_store.event_stream_keys()
    assert await ledger_store.client.get(f"{key}:archive:lease") is None


async def test_a_configured_archive_without_its_dependencies_stops_startup(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    settings = Settings(ledger_archive_dir=tmp_path, spool_path=tmp_path / "spool")
    with pytest.raises(ArchiveDependencyMissing, match=r"cascade-gateway\[archive\]"):
        await start_services(settings)
