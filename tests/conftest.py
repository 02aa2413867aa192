"""Shared test set-up: a clean environment, and real Redis (required under CI)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis

REDIS_URL = "redis://127.0.0.1:6379/3"  # tests own databases 0-9; 10-15 are external checks
OUR_PREFIXES = ("CASCADE_", "UPSTREAM_", "GATEWAY_")
OUR_VARIABLES = (
    "REDIS_URL",
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "LOCAL_ENGINE_URL",
    "LOCAL_ENGINE_PORT",
    "LOCAL_ENGINE_AUTOSTART",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(OUR_PREFIXES) or name in OUR_VARIABLES:
            monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def redis_available() -> bool:
    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
        client.ping()
        client.close()
    except redis.RedisError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Redis at {REDIS_URL} is unreachable under CI=true: {exc}")
        pytest.skip(f"Redis at {REDIS_URL} is unreachable: {exc}")
    return True


@pytest.fixture
def redis_url(redis_available: bool) -> Iterator[str]:
    yield REDIS_URL
