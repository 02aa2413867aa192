"""Pytest fixtures that run the fake upstreams for one test each.

from tests.fakes.fixtures import fake_openai

async def test_something(fake_openai: FakeOpenAI) -> None: ...
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.fakes.openai_upstream import FakeOpenAI
from tests.fakes.responses_upstream import FakeResponses


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    """A running FakeOpenAI; `fake_openai.url` ends in `/v1`."""
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def fake_anthropic() -> Iterator[FakeAnthropic]:
    """A running FakeAnthropic; `fake_anthropic.url` is the API root (no `/v1`)."""
    with FakeAnthropic() as fake:
        yield fake


@pytest.fixture
def fake_responses() -> Iterator[FakeResponses]:
    """A running FakeResponses (OpenAI's Responses API); `fake_responses.url` ends in `/v1`."""
    with FakeResponses() as fake:
        yield fake
