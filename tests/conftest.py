"""Shared test set-up: a clean environment, real Redis, and the `requires` mark (what
is missing skips a test, or fails it under CI: see tests/support.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support import unavailable

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


FUZZ_LONG_VARIABLE = "CASCADE_FUZZ_LONG"  # read by the fuzz suites' hypothesis profiles


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fuzz-long",
        action="store_true",
        help="run the fuzz suites (policy loader, every endpoint) with their long example counts",
    )


def pytest_configure(config: pytest.Config) -> None:
    # Set before the fuzz modules are imported: they pick their profile at import.
    if config.getoption("--fuzz-long"):
        os.environ[FUZZ_LONG_VARIABLE] = "1"
    config.addinivalue_line(
        "markers", "requires(missing, what): needs `what`; `missing` says why it is absent"
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("requires"):
        if mark.kwargs["missing"] is not None:
            unavailable(f"{mark.kwargs['what']} is unavailable: {mark.kwargs['missing']}")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's cache directory (parsed encodings): never the user's own."""
    return tmp_path_factory.mktemp("cascade-cache")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, cache_dir: Path) -> None:
    for name in list(os.environ):
        if name.startswith(OUR_PREFIXES) or name in OUR_VARIABLES:
            monkeypatch.delenv(name)
    monkeypatch.setenv("CASCADE_CACHE_DIR", str(cache_dir))


@pytest.fixture(scope="session")
def redis_available() -> bool:
    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
        client.ping()
        client.close()
    except redis.RedisError as exc:
        unavailable(f"Redis at {REDIS_URL} is unreachable: {exc}")
    return True


@pytest.fixture
def redis_url(redis_available: bool) -> Iterator[str]:
    yield REDIS_URL
