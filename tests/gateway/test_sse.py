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
    stream = b": keep-alive\r\n\r\ndata: x\r\ndata: y\r\n\r\nevent: e\ndata: z\n\n" + DONE
    assert await collect(stream, b"data: after-done\n\n") == [[b"x\ny", b"z"]]


async def test_byte_by_byte() -> None:
    stream = b'data: {"k": "v"}\n\n' + DONE
    assert await collect(*(stream[i : i + 1] for i in range(len(stream)))) == [[b'{"k": "v"}']]


async def test_a_body_cut_short_yields_what_came_then_fails() -> None:
    seen = []
    with pytest.raises(UpstreamFailure, match="without \\[DONE\\]"):
        async for events in sse_events(reads(b"data: a\n\ndata: b\ndata: cut-in-the-mid")):
            seen.append(events)
    assert seen == [[b"a"]]
