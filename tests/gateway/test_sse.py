"""SSE splitting on bytes: events as they complete, per read, whatever the chunking."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.upstreams.base import UpstreamFailure
from gateway.upstreams.openai_impl import sse_events

DONE = b"data: [DONE]\n\n"


async def reads(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def collect(*chunks: bytes) -> list[list[bytes]]:
    return [events async for events in sse_events(reads(*chunks))]


async def test_events_completed_by_one_read_travel_together() -> None:
    got = await collect(b'data: {"a":1}\n\ndata: {"b":2}\n\ndata: {"c"', b":3}\n\n" + DONE)
    assert got == [[b'{"a":1}', b'{"b":2}'], [b'{"c":3}']]


async def test_crlf_comments_multiline_and_done() -> None:
    stream = b': keep-alive\r\n\r\ndata: {"x":\r\ndata: 1}\r\n\r\nevent: e\ndata: 2\n\n' + DONE
    assert await collect(stream, b"data: after-done\n\n") == [[b'{"x":\n1}', b"2"]]


async def test_byte_by_byte() -> None:
    stream = b'data: {"k": "v"}\n\n' + DONE
    assert await collect(*(stream[i : i + 1] for i in range(len(stream)))) == [[b'{"k": "v"}']]


async def test_a_body_cut_short_yields_what_came_then_fails() -> None:
    seen = []
    with pytest.raises(UpstreamFailure, match="without \\[DONE\\]"):
        async for events in sse_events(reads(b"data: 1\n\ndata: 2\ndata: cut-in-the-mid")):
            seen.append(events)
    assert seen == [[b"1"]]


async def test_an_event_that_is_not_json_yields_what_came_then_fails() -> None:
    """Relayed, a broken event would make the client's SDK fail to parse, not raise an
    API error: the stream fails there (in-band error once bytes went out, else retry)."""
    seen = []
    with pytest.raises(UpstreamFailure, match="not JSON"):
        async for events in sse_events(reads(b'data: {"a":1}\n\ndata: {"b": [\n\n' + DONE)):
            seen.append(events)
    assert seen == [[b'{"a":1}']]
