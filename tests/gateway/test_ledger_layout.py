"""A gateway configured with another shard count than its ledger's: it refuses to start
(when Redis answers), the spend API answers 503, and a ledger that meets the mismatch
anyway spools and says so once, not per batch."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from gateway.cli import main
from gateway.errors import UpstreamUnavailable
from gateway.http.app import check_ledger_layout, start_services
from gateway.http.spend_api import ledger_errors
from gateway.ledger import CostLedger, LedgerLayoutError, MemoryStore, RedisStore, Spool
from gateway.ledger.archive import build_exporter
from gateway.ledger.shards import layout_key
from gateway.metrics import ArchiveMetrics
from gateway.settings import Settings
from tests.gateway.archive_support import FAST
from tests.gateway.ledger_fixtures import delete_prefix, free_port, make_record
from tests.support import eventually_async


@pytest.fixture
async def four_shard_prefix(redis_url: str) -> AsyncIterator[str]:
    """A prefix whose ledger was written over 4 shards."""
    prefix = f"cgtest-{uuid.uuid4().hex[:10]}:"
    client = aioredis.Redis.from_url(redis_url)
    await client.set(layout_key(prefix), 4)
    await client.aclose()
    yield prefix
    await delete_prefix(redis_url, prefix)


async def test_a_gateway_with_another_shard_count_refuses_to_start(
    redis_url: str, four_shard_prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(
        redis_url=redis_url, redis_prefix=four_shard_prefix, spool_path=tmp_path / "spool"
    )
    with pytest.raises(LedgerLayoutError, match="CASCADE_LEDGER_SHARDS=4"):
        await start_services(settings)
    assert "refusing to start" in caplog.text


async def test_a_redis_that_does_not_answer_at_startup_is_checked_later() -> None:
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/3")
    await check_ledger_layout(store)  # logs, and leaves it to the ledger's outage handling
    await check_ledger_layout(MemoryStore())
    await store.close()


def test_the_spend_api_answers_503_for_a_layout_mismatch() -> None:
    with pytest.raises(UpstreamUnavailable) as raised, ledger_errors():
        raise LedgerLayoutError("spread over 4 shard(s), not 1")
    assert raised.value.status == 503 and raised.value.code == "ledger_layout_mismatch"


async def test_the_ledger_logs_a_layout_mismatch_once_and_spools(
    redis_url: str, four_shard_prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisStore(redis_url, prefix=four_shard_prefix)
    ledger = CostLedger(store, Spool(tmp_path / "spool"), replay_interval_s=0.02)
    ledger.start()
    for i in range(5):  # five batches, and replays in between
        ledger.submit(make_record(i))
        await asyncio.sleep(0.05)
    # On a busy machine a slow first ping can make it an outage first: the records
    # spool unsent, and the mismatch shows at the first replay.
    await eventually_async(lambda: errors_in(caplog), 10, "the mismatch logged")
    await asyncio.sleep(0.2)  # more replays, which must not log it again
    await ledger.stop()
    await store.close()
    assert ledger.spooled_count == 5 and ledger.degraded
    [error] = errors_in(caplog)
    assert error.getMessage().startswith("ledger store refused (the ledger under prefix")
    assert "spread over 4 shard(s)" in error.getMessage() and not error.exc_info


def errors_in(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_each_stream_s_cap_is_the_store_s_shard_maxlen(
    redis_url: str, tmp_path: Path
) -> None:
    store = RedisStore(redis_url, stream_maxlen=1000, shards=3)
    assert store.shard_maxlen == 334
    registry = CollectorRegistry()
    exporter = build_exporter(store, tmp_path, FAST, ArchiveMetrics(registry))
    for key in store.event_stream_keys():
        assert (
            registry.get_sample_value("cascade_ledger_archive_stream_cap", {"stream": key}) == 334
        )
    await exporter.close()
    await store.close()


def test_spend_export_refuses_a_ledger_of_another_shard_count(
    redis_url: str,
    four_shard_prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It would export streams no gateway writes."""
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("CASCADE_REDIS_PREFIX", four_shard_prefix)
    assert main(["spend", "export", "--archive", str(tmp_path), "--once"]) == 1
    assert "CASCADE_LEDGER_SHARDS=4" in capsys.readouterr().err
