"""Reading a server-sent-events body back in tests. Used by test_fakes and
test_responses_fake."""

from __future__ import annotations

from typing import Any

import httpx
import orjson


def sse_payloads(response: httpx.Response) -> list[Any]:
    """The `data:` payloads of an SSE body, `[DONE]` kept as a string."""
    payloads: list[Any] = []
    for line in response.text.splitlines():
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            payloads.append(data if data == "[DONE]" else orjson.loads(data))
    return payloads
