"""A local server speaking OpenAI's Responses API (`POST /v1/responses`), as a
deployment that serves it natively does.

    with FakeResponses() as fake:
        fake.reply_text = "Paris."
        httpx.post(f"{fake.url}/responses", json={"model": "m", "input": "hi"})
        assert fake.requests[-1]["path"] == "/v1/responses"

`url` ends in `/v1`, as OpenAI's SDK and a deployment's `api_base` take it. The knobs,
`script()` and `requests` are `FakeServer`'s: `cached_tokens` of the input tokens are
reported as cache reads (`input_tokens_details.cached_tokens`), `reasoning_tokens` more
output tokens as reasoning (`output_tokens_details.reasoning_tokens`); `omit_usage`
and `malformed_json` apply to non-streaming answers. A forced function tool
(`tool_choice` naming one, or "required") is called with placeholder arguments.

Responses are stored unless the request says `store: false`, as the real API does: a
`previous_response_id` naming one it did not store is a 400. With `api_key` set,
`Authorization: Bearer <key>` is required.
"""

from __future__ import annotations

import time
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
    by_size,
    new_id,
    openai_error,
    placeholder_arguments,
    reply_pieces,
    sse,
)


class FakeResponses(FakeServer):
    """OpenAI's Responses API, streaming and not, with `FakeServer`'s knobs.

    Extra knobs: `api_key` (when set, the bearer key required). `stored`: the
    responses kept, by id."""

    url_suffix = "/v1"

    def __init__(self) -> None:
        super().__init__()
        self.api_key: str | None = None
        self.stored: dict[str, dict[str, Any]] = {}

    def routes(self) -> list[Route]:
        return [Route("/v1/responses", self._responses, methods=["POST"])]

    async def _responses(self, request: Request) -> Response:
        entry = await self.record(request)
        behaviour = self.next_behaviour()
        await self.sleep(behaviour.delay_s)
        body = entry["body"]
        if self.api_key is not None and entry["headers"].get("authorization") != (
            f"Bearer {self.api_key}"
        ):
            return openai_error(401)
        if behaviour.fail_status is not None:
            return openai_error(
                behaviour.fail_status, behaviour.fail_message, retry_after=behaviour.retry_after
            )
        if not isinstance(body, dict) or "model" not in body:
            return openai_error(400, "Missing required parameter: 'model'.", param="model")
        previous = body.get("previous_response_id")
        if previous is not None and previous not in self.stored:
            message = f"Previous response with id '{previous}' not found."
            return openai_error(400, message, param="previous_response_id")
        if body.get("stream"):
            events = self._stream(body, behaviour)
            return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
        if behaviour.malformed_json:
            return Response(b'{"id": "resp_broken", "output": [', media_type="application/json")
        return JSONResponse(self._keep(body, response_body(body, behaviour)))

    def _keep(self, body: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
        if body.get("store", True):
            self.stored[response["id"]] = response
        return response

    async def _stream(self, body: dict[str, Any], behaviour: Behaviour) -> AsyncIterator[bytes]:
        final = response_body(body, behaviour)
        start = {**final, "status": "in_progress", "output": [], "usage": None}
        sequence = iter(range(1_000_000))

        def event(kind: str, **fields: Any) -> bytes:
            return sse({"type": kind, "sequence_number": next(sequence), **fields}, kind)

        yield event("response.created", response=start)
        yield event("response.in_progress", response=start)
        pieces, _ = reply_pieces(behaviour, body.get("max_output_tokens"))
        for index, item in enumerate(final["output"]):
            at = {"item_id": item["id"], "output_index": index}
            opened = {**item, "status": "in_progress"}
            yield event("response.output_item.added", output_index=index, item=opened)
            if item["type"] == "function_call":
                yield event("response.function_call_arguments.delta", **at, delta=item["arguments"])
                yield event("response.function_call_arguments.done", **at, **_call_done(item))
            else:
                part = {"type": "output_text", "text": "", "annotations": []}
                yield event("response.content_part.added", **at, content_index=0, part=part)
                for sent, piece in enumerate(pieces):
                    await self.pace(sent, behaviour)
                    yield event(
                        "response.output_text.delta",
                        **at,
                        content_index=0,
                        delta=piece,
                        logprobs=[],
                    )
                text = item["content"][0]["text"]
                yield event(
                    "response.output_text.done", **at, content_index=0, text=text, logprobs=[]
                )
                done = {**part, "text": text}
                yield event("response.content_part.done", **at, content_index=0, part=done)
            yield event("response.output_item.done", output_index=index, item=item)
        if behaviour.fail_in_stream:
            error = {"code": "server_error", "message": "The model failed mid-answer."}
            yield event("response.failed", response={**final, "status": "failed", "error": error})
            return
        kept = self._keep(body, final)
        yield event(f"response.{kept['status']}", response=kept)  # completed or incomplete


def _call_done(item: dict[str, Any]) -> dict[str, Any]:
    return {"name": item["name"], "arguments": item["arguments"]}


def response_body(body: dict[str, Any], behaviour: Behaviour) -> dict[str, Any]:
    """A complete Responses API answer to `body`."""
    pieces, cut = reply_pieces(behaviour, body.get("max_output_tokens"))
    tool = forced_function(body)
    output: list[dict[str, Any]]
    if tool is not None:
        arguments = orjson.dumps(placeholder_arguments(tool.get("parameters"))).decode()
        output = [
            {
                "id": new_id("fc_"),
                "type": "function_call",
                "status": "completed",
                "call_id": new_id("call_"),
                "name": tool["name"],
                "arguments": arguments,
            }
        ]
    else:
        text = {"type": "output_text", "text": "".join(pieces), "annotations": []}
        output = [
            {
                "id": new_id("msg_"),
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [text],
            }
        ]
    status = "incomplete" if cut and tool is None else "completed"
    reply = {
        "id": new_id("resp_"),
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": body["model"],
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "top_p": body.get("top_p", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "truncation": "disabled",
        "metadata": body.get("metadata") or {},
        "usage": None if behaviour.omit_usage else usage(body, len(pieces), behaviour),
    }
    return reply


def usage(body: dict[str, Any], generated: int, behaviour: Behaviour) -> dict[str, Any]:
    """The Responses API's usage: cached and reasoning tokens inside the totals."""
    prompt = input_tokens(body)
    output = generated + behaviour.reasoning_tokens
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": min(behaviour.cached_tokens, prompt)},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": behaviour.reasoning_tokens},
        "total_tokens": prompt + output,
    }


def input_tokens(body: dict[str, Any]) -> int:
    """The words of the instructions and input, tool schemas by size."""
    tools = by_size(body["tools"]) if body.get("tools") else 0
    return words(body.get("instructions")) + words(body.get("input")) + tools


def words(value: Any) -> int:
    """Words in input items: text, content parts, tool outputs and arguments."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(words(item) for item in value)
    if isinstance(value, dict):
        return sum(words(value.get(k)) for k in ("content", "text", "output", "arguments"))
    return 0


def forced_function(body: dict[str, Any]) -> dict[str, Any] | None:
    """The function tool `tool_choice` forces (one named, or "required"), if any."""
    functions = [t for t in body.get("tools") or [] if t.get("type") == "function"]
    choice = body.get("tool_choice")
    if not functions:
        return None
    if choice == "required":
        return functions[0]
    if isinstance(choice, dict) and choice.get("type") == "function":
        return next((t for t in functions if t.get("name") == choice.get("name")), None)
    return None
