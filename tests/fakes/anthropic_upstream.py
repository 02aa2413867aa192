"""A local server speaking Anthropic's Messages API (`POST /v1/messages`).

    with FakeAnthropic() as fake:
        fake.fail(529, times=2)
        httpx.post(f"{fake.url}/v1/messages", headers=fake.auth_headers(), json={...})

`url` is the API root without `/v1`, as Anthropic's SDKs and litellm's `api_base`
expect it. The knobs, `script()` and `requests` are `FakeServer`'s; `omit_usage` and
`malformed_json` apply to non-streaming answers only; `cached_tokens` and
`cache_write_tokens` are reported as `cache_read_input_tokens` and
`cache_creation_input_tokens`, which Anthropic counts apart from `input_tokens`.
Requests need `x-api-key` equal to `api_key` and an `anthropic-version` header, as the
real API does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fakes.openai_upstream import (
    SSE_HEADERS,
    Behaviour,
    FakeServer,
    count_words,
    new_id,
    placeholder_arguments,
    reply_pieces,
    sse,
)

DEFAULT_API_KEY = "fake-anthropic-key"

# Anthropic's error `type` and default message per status.
ANTHROPIC_ERRORS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "Invalid request."),
    401: ("authentication_error", "invalid x-api-key"),
    403: ("permission_error", "Your API key does not have permission to use this resource."),
    404: ("not_found_error", "The requested resource could not be found."),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ("rate_limit_error", "Number of requests has exceeded your rate limit."),
    500: ("api_error", "An unexpected error has occurred internal to Anthropic's systems."),
    529: ("overloaded_error", "Overloaded"),
}


class FakeAnthropic(FakeServer):
    """Anthropic's Messages API, streaming and not, with `FakeServer`'s knobs.

    Extra knob: `api_key`, the only `x-api-key` accepted."""

    def __init__(self) -> None:
        super().__init__()
        self.api_key = DEFAULT_API_KEY

    def auth_headers(self) -> dict[str, str]:
        """Headers a well-behaved client sends."""
        return {"x-api-key": self.api_key, "anthropic-version": "2023-06-01"}

    def routes(self) -> list[Route]:
        return [Route("/v1/messages", self._messages, methods=["POST"])]

    async def _messages(self, request: Request) -> Response:
        entry = await self.record(request)
        behaviour = self.next_behaviour()
        await self.sleep(behaviour.delay_s)
        headers, body = entry["headers"], entry["body"]
        if headers.get("x-api-key") != self.api_key:
            return anthropic_error(401)
        if "anthropic-version" not in headers:
            return anthropic_error(400, "anthropic-version: header is required")
        if behaviour.fail_status is not None:
            return anthropic_error(
                behaviour.fail_status, behaviour.fail_message, retry_after=behaviour.retry_after
            )
        problem = invalid_field(body)
        if problem is not None:
            return anthropic_error(400, problem)
        if body.get("stream"):
            events = self._stream(body, behaviour)
            return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
        if behaviour.malformed_json:
            return Response(b'{"id": "msg_broken", "content": [', media_type="application/json")
        return JSONResponse(message_body(body, behaviour), headers={"request-id": new_id("req_")})

    async def _stream(self, body: dict[str, Any], behaviour: Behaviour) -> AsyncIterator[bytes]:
        pieces, cut = reply_pieces(behaviour, body.get("max_tokens"))
        tool = forced_tool(body)
        start = message_body(body, Behaviour())
        start.update(content=[], stop_reason=None)
        start["usage"].update(
            output_tokens=1,
            cache_creation_input_tokens=behaviour.cache_write_tokens,
            cache_read_input_tokens=behaviour.cached_tokens,
        )
        yield sse({"type": "message_start", "message": start}, "message_start")
        block: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": piece} for piece in pieces]
        if tool is not None:
            block = {"type": "tool_use", "id": new_id("toolu_"), "name": tool["name"], "input": {}}
            arguments = orjson.dumps(placeholder_arguments(tool.get("input_schema"))).decode()
            deltas = [{"type": "input_json_delta", "partial_json": arguments}]
        yield sse(
            {"type": "content_block_start", "index": 0, "content_block": block},
            "content_block_start",
        )
        yield sse({"type": "ping"}, "ping")
        for sent, delta in enumerate(deltas):
            await self.pace(sent, behaviour)
            yield sse(
                {"type": "content_block_delta", "index": 0, "delta": delta}, "content_block_delta"
            )
        yield sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
        stop = "tool_use" if tool is not None else ("max_tokens" if cut else "end_turn")
        yield sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": len(pieces)},
            },
            "message_delta",
        )
        yield sse({"type": "message_stop"}, "message_stop")


def invalid_field(body: Any) -> str | None:
    """Anthropic's message for the first missing required field, or None."""
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    for name in ("model", "messages", "max_tokens"):
        if name not in body:
            return f"{name}: Field required"
    return None


def forced_tool(body: dict[str, Any]) -> dict[str, Any] | None:
    """The tool `tool_choice` forces (`{"type": "tool", "name"}` or `{"type": "any"}`)."""
    tools = body.get("tools") or []
    choice = body.get("tool_choice") or {}
    if not tools or choice.get("type") not in ("tool", "any"):
        return None
    if choice["type"] == "any":
        return dict(tools[0])
    return next((dict(t) for t in tools if t.get("name") == choice.get("name")), None)


def message_body(body: dict[str, Any], behaviour: Behaviour) -> dict[str, Any]:
    """A complete non-streaming Messages API answer."""
    pieces, cut = reply_pieces(behaviour, body.get("max_tokens"))
    tool = forced_tool(body)
    content: list[dict[str, Any]] = [{"type": "text", "text": "".join(pieces)}]
    stop = "max_tokens" if cut else "end_turn"
    if tool is not None:
        arguments = placeholder_arguments(tool.get("input_schema"))
        content = [
            {"type": "tool_use", "id": new_id("toolu_"), "name": tool["name"], "input": arguments}
        ]
        stop = "tool_use"
    reply: dict[str, Any] = {
        "id": new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": body.get("model"),
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
    }
    if not behaviour.omit_usage:
        input_tokens = count_words(body.get("system")) + count_words(body.get("messages"))
        reply["usage"] = {
            "input_tokens": input_tokens,
            "output_tokens": len(pieces),
            "cache_creation_input_tokens": behaviour.cache_write_tokens,
            "cache_read_input_tokens": behaviour.cached_tokens,
        }
    return reply


def anthropic_error(
    status: int, message: str | None = None, *, retry_after: str | None = None
) -> JSONResponse:
    """An error response in Anthropic's shape."""
    kind, default = ANTHROPIC_ERRORS.get(status, ("api_error", f"Error {status}."))
    body = {"type": "error", "error": {"type": kind, "message": message or default}}
    headers = {"request-id": new_id("req_")}
    if retry_after is not None:
        headers["retry-after"] = retry_after
    return JSONResponse(body, status_code=status, headers=headers)
