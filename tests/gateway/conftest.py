"""Fixtures for gateway tests: a real gateway over loopback with a policy written
per test, real Redis under a per-test key prefix, and the fake upstreams; and what
many of them share: the keys, the shipped policies, the `cascade-gateway` command."""

from __future__ import annotations

import shutil
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from gateway.ledger import RedisStore, SpendRecord
from gateway.settings import Settings
from tests.fakes.fixtures import fake_anthropic, fake_openai, fake_responses
from tests.gateway.ledger_fixtures import RedisServer
from tests.gateway.server import GatewayServer
from tests.support import eventually_async

__all__ = ["fake_anthropic", "fake_openai", "fake_responses"]

POLICIES = Path(__file__).resolve().parents[2] / "policies"
EXE = shutil.which("cascade-gateway") or str(Path(sys.executable).parent / "cascade-gateway")
CLIENT_KEY = "fake-client-key"
ADMIN_KEY = "fake-admin-key"
AUTH = {"authorization": f"Bearer {CLIENT_KEY}"}  # a client's headers
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}  # an admin's

StartGateway = Callable[..., GatewayServer]


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A private `redis-server` the test may kill, pause and restart."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    prefix = f"cgtest-{uuid.uuid4().hex[:10]}:"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def start_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str, redis_prefix: str
) -> Iterator[StartGateway]:
    """start_gateway(policy_yaml, **env) -> a running GatewayServer on real Redis."""
    servers: list[GatewayServer] = []

    def start(
        policy: str | Path, *, redis: str | None = redis_url, spool: Path | None = None, **env: str
    ) -> GatewayServer:
        monkeypatch.setenv("GATEWAY_TEST_KEY", CLIENT_KEY)
        monkeypatch.setenv("GATEWAY_ADMIN_KEY", ADMIN_KEY)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        if isinstance(policy, str):
            path = tmp_path / f"policy-{len(servers)}.yaml"
            path.write_text(policy)
            policy = path
        settings = Settings(
            policy=policy,
            redis_url=redis,
            redis_prefix=redis_prefix,
            spool_path=spool or tmp_path / "ledger.spool",
            max_retry_wait_s=1.0,
        )
        server = GatewayServer(settings).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
async def ledger_store(redis_url: str, redis_prefix: str) -> AsyncIterator[RedisStore]:
    """The Redis ledger the gateway under test writes to, read from the test's loop."""
    store = RedisStore(redis_url, prefix=redis_prefix)
    yield store
    await store.close()


async def wait_for_record(store: RedisStore, record_id: str, timeout_s: float = 5.0) -> SpendRecord:
    """Ledger writes happen after the reply; poll until this one has landed."""
    record = await eventually_async(lambda: store.get(record_id), timeout_s, f"record {record_id}")
    assert record is not None
    return record


def metric(base: str, name: str) -> float:
    """The sum of the gateway's /metrics samples whose line starts with `name` (0: none)."""
    text = httpx.get(f"{base}/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def openai_compatible_policy() -> Path:
    return POLICIES / "examples" / "openai-compatible.yaml"
