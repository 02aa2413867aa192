"""What the gateway reads of the bridged APIs' own wire formats, when a deployment
speaks one natively: OpenAI's Responses API and Anthropic's Messages API.

The pipeline reads upstream answers as chat completions (usage, text, tool calls), so a
native reply is read through a chat view of it (`chat_view`), its usage converted to
OpenAI's shape with the token classes in their places (`gateway.billing.usage`):

    Responses API                               chat usage
    usage.input_tokens                          prompt_tokens (cached ones included)
    usage.input_tokens_details.cached_tokens    prompt_tokens_details.cached_tokens
    usage.output_tokens                         completion_tokens (reasoning included)
    usage.output_tokens_details.reasoning_tokens
                                                completion_tokens_details.reasoning_tokens
    Messages API
    usage.input_tokens + cache_read_input_tokens + cache_creation_input_tokens
                                                prompt_tokens (as litellm counts them,
                                                so native and bridged answers price alike)
    usage.cache_read_input_tokens               prompt_tokens_details.cached_tokens
    usage.cache_creation_input_tokens           prompt_tokens_details.cache_creation_tokens
    usage.output_tokens                         completion_tokens

Both APIs stream named SSE events whose `type` is the event's name, and end without a
`[DONE]`: after `TERMINAL_EVENTS`. The SSE reader parses each event once
(`native_event`); the relay, the tally and the terminal check read that.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Literal, NamedTuple

import orjson

from gateway.billing.usage import token_count, value_at

NativeSurface = Literal["responses", "messages"]

# The field of each API's request that caps the answer's tokens.
OUTPUT_LIMIT_FIELD: Mapping[NativeSurface, str] = {
    "responses": "max_output_tokens",
    "messages": "max_tokens",
}
# The events after which each API's stream has nothing more to send.
TERMINAL_EVENTS: Mapping[NativeSurface, frozenset[str]] = {
    "responses": frozenset(
        {"response.completed", "response.incomplete", "response.failed", "error"}
    ),
    "messages": frozenset({"message_stop", "error"}),
}
# An Anthropic `stop_reason` as a chat `finish_reason`.
STOP_REASONS: Mapping[str, str] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


def chat_view(surface: NativeSurface, reply: Mapping[str, Any]) -> dict[str, Any]:
    """A native reply as the chat completion the pipeline reads: its text and tool calls
    (for the verifier, the judge, a token count) and its usage (for the ledger)."""
    if surface == "responses":
        return _responses_view(reply)
    return _messages_view(reply)


def chat_usage(surface: NativeSurface, usage: Any) -> dict[str, Any] | None:
    """A native `usage` object in OpenAI's chat shape (None when there is none)."""
    if not isinstance(usage, Mapping):
        return None
    if surface == "responses":
        return {
            "prompt_tokens": usage.get("input_tokens"),
            "completion_tokens": usage.get("output_tokens"),
            "prompt_tokens_details": {
                "cached_tokens": value_at(usage, ("input_tokens_details", "cached_tokens"))
            },
            "completion_tokens_details": {
                "reasoning_tokens": value_at(usage, ("output_tokens_details", "reasoning_tokens"))
            },
        }
    uncached = usage.get("input_tokens")
    read = token_count(usage.get("cache_read_input_tokens"))
    written = token_count(usage.get("cache_creation_input_tokens"))
    prompt = None  # unless a whole count: the usage then reads as not reported (counted)
    if isinstance(uncached, int) and not isinstance(uncached, bool) and uncached >= 0:
        prompt = uncached + read + written
    return {
        "prompt_tokens": prompt,
        "completion_tokens": usage.get("output_tokens"),
        "prompt_tokens_details": {"cached_tokens": read, "cache_creation_tokens": written},
    }


class NativeEvent(NamedTuple):
    """One event of a native stream, parsed once."""

    kind: str  # its `type`, which names it on the wire ("message" when it has none)
    payload: bytes  # as the upstream sent it: what the client gets
    data: Mapping[str, Any]  # the payload parsed ({} when it is JSON but no object)


def native_event(payload: bytes) -> NativeEvent | None:
    """A streamed event's payload, parsed; None when it is not JSON."""
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return NativeEvent("message", payload, {})
    kind = data.get("type")
    return NativeEvent(kind if isinstance(kind, str) else "message", payload, data)


def event_texts(event: Mapping[str, Any]) -> Iterator[str]:
    """Generated text in one streamed event: text and tool-call argument deltas."""
    kind = event.get("type")
    if kind in ("response.output_text.delta", "response.function_call_arguments.delta"):
        delta = event.get("delta")
        if isinstance(delta, str):
            yield delta
    elif kind == "content_block_delta":
        delta = event.get("delta")
        if isinstance(delta, Mapping):
            for name in ("text", "partial_json", "thinking"):
                if isinstance(delta.get(name), str):
                    yield delta[name]


def frame(kind: str, payload: bytes) -> bytes:
    """One streamed event as the API sends it: named by its `type`, data unchanged."""
    return b"event: " + kind.encode() + b"\ndata: " + payload + b"\n\n"


def responses_error_event(message: str, sequence: int) -> bytes:
    """The Responses API's in-band `error` event."""
    data = {
        "type": "error",
        "code": "upstream_stream_error",
        "message": message,
        "param": None,
        "sequence_number": sequence,
    }
    return frame("error", orjson.dumps(data))


def messages_error_event(message: str) -> bytes:
    """The Messages API's in-band `error` event."""
    error = {"type": "error", "error": {"type": "api_error", "message": message}}
    return frame("error", orjson.dumps(error))


def _responses_view(reply: Mapping[str, Any]) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in objects(reply.get("output")):
        if item.get("type") == "message":
            parts = objects(item.get("content"))
            texts += [p["text"] for p in parts if isinstance(p.get("text"), str)]
        elif item.get("type") == "function_call":
            calls.append(_tool_call(item.get("call_id"), item.get("name"), item.get("arguments")))
    finish = "length" if reply.get("status") == "incomplete" else "stop"
    return _view(
        reply,
        reply.get("created_at"),
        "".join(texts),
        calls,
        "tool_calls" if calls else finish,
        chat_usage("responses", reply.get("usage")),
    )


def _messages_view(reply: Mapping[str, Any]) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in objects(reply.get("content")):
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif block.get("type") == "tool_use":
            arguments = orjson.dumps(block.get("input") or {}).decode()
            calls.append(_tool_call(block.get("id"), block.get("name"), arguments))
    stop = reply.get("stop_reason")
    finish = STOP_REASONS.get(stop, "stop") if isinstance(stop, str) else "stop"
    usage = chat_usage("messages", reply.get("usage"))
    return _view(reply, 0, "".join(texts), calls, finish, usage)


def _view(
    reply: Mapping[str, Any],
    created: Any,
    text: str,
    calls: list[dict[str, Any]],
    finish: str,
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        message["tool_calls"] = calls
    view: dict[str, Any] = {
        "id": str(reply.get("id") or ""),
        "object": "chat.completion",
        "created": token_count(created),
        "model": str(reply.get("model") or ""),
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
    }
    if usage is not None:
        view["usage"] = usage
    return view


def _tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    return {
        "id": str(call_id or ""),
        "type": "function",
        "function": {"name": str(name or ""), "arguments": arguments or ""},
    }


def objects(value: Any) -> list[Mapping[str, Any]]:
    """The objects in `value`, when it is an array (a reply may hold anything)."""
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []
