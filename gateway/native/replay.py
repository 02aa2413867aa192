"""A complete native reply as the stream its API would have sent for it: how a cascade
answers a streaming request (it verifies the whole answer first) when a deployment that
serves the API natively answered. The events carry the reply's own ids, so a stored
response is continued by the id the client got (`previous_response_id`).

    Responses API   response.created, .in_progress; per output item .output_item.added,
                    its text (or refusal, or arguments) in one delta and its .done
                    events, .output_item.done; then response.completed (.incomplete,
                    .failed, as the reply's `status` says)
    Messages API    message_start (the input usage, 0 output tokens); per content block
                    content_block_start, one delta (text, tool input as JSON,
                    thinking and its signature), content_block_stop; message_delta
                    (stop reason, the whole usage); message_stop
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson

from gateway.native.formats import NativeSurface, frame, objects

# A response's `status` -> the event that ends its stream.
FINAL_EVENTS: Mapping[str, str] = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
}


def replayed_stream(surface: NativeSurface, reply: Mapping[str, Any]) -> bytes:
    """The SSE bytes of `reply`'s stream, each event named by its `type`."""
    events = responses_events(reply) if surface == "responses" else messages_events(reply)
    return b"".join(frame(event["type"], orjson.dumps(event)) for event in events)


def responses_events(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []

    def add(kind: str, **fields: Any) -> None:
        events.append({"type": kind, "sequence_number": len(events), **fields})

    start = {**response, "status": "in_progress", "output": [], "usage": None}
    add("response.created", response=start)
    add("response.in_progress", response=start)
    for index, item in enumerate(objects(response.get("output"))):
        kind = item.get("type")
        at = {"item_id": item.get("id"), "output_index": index}
        if kind == "message":
            add("response.output_item.added", output_index=index, item=_opened(item, content=[]))
            for part_index, part in enumerate(objects(item.get("content"))):
                _part_events(add, {**at, "content_index": part_index}, part)
        elif kind == "function_call":
            arguments = item.get("arguments") or ""
            add("response.output_item.added", output_index=index, item=_opened(item, arguments=""))
            add("response.function_call_arguments.delta", **at, delta=arguments)
            add("response.function_call_arguments.done", **at, arguments=arguments)
        else:  # reasoning, hosted tool calls: the item whole
            add("response.output_item.added", output_index=index, item=item)
        add("response.output_item.done", output_index=index, item=item)
    add(FINAL_EVENTS.get(str(response.get("status")), "response.completed"), response=response)
    return events


def _part_events(add: Callable[..., None], at: dict[str, Any], part: Mapping[str, Any]) -> None:
    """A message's content part: added empty, its text in one delta, done."""
    kind = part.get("type")
    field = {"output_text": "text", "refusal": "refusal"}.get(str(kind))
    value = part.get(field) if field is not None else None
    if field is None or not isinstance(value, str):
        add("response.content_part.added", **at, part=part)
    else:
        add("response.content_part.added", **at, part={**part, field: ""})
        if field == "text":
            add("response.output_text.delta", **at, delta=value, logprobs=[])
            add("response.output_text.done", **at, text=value, logprobs=[])
        else:
            add("response.refusal.delta", **at, delta=value)
            add("response.refusal.done", **at, refusal=value)
    add("response.content_part.done", **at, part=part)


def messages_events(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    usage = message.get("usage")
    usage = usage if isinstance(usage, Mapping) else {}
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 0},
    }
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(objects(message.get("content"))):
        opened, deltas = _block_deltas(block)
        events.append({"type": "content_block_start", "index": index, "content_block": opened})
        events += [{"type": "content_block_delta", "index": index, "delta": d} for d in deltas]
        events.append({"type": "content_block_stop", "index": index})
    stop = {k: message.get(k) for k in ("stop_reason", "stop_sequence")}
    events.append({"type": "message_delta", "delta": stop, "usage": usage})
    events.append({"type": "message_stop"})
    return events


def _block_deltas(block: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A content block as it starts, and the deltas that complete it."""
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        return {**block, "text": ""}, [{"type": "text_delta", "text": block["text"]}]
    if kind in ("tool_use", "server_tool_use"):
        arguments = orjson.dumps(block.get("input") or {}).decode()
        return {**block, "input": {}}, [{"type": "input_json_delta", "partial_json": arguments}]
    if kind == "thinking":
        deltas = [{"type": "thinking_delta", "thinking": block.get("thinking") or ""}]
        if block.get("signature"):
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        return {**block, "thinking": "", "signature": ""}, deltas
    return dict(block), []  # redacted thinking, tool results: whole at the start


def _opened(item: Mapping[str, Any], **empty: Any) -> dict[str, Any]:
    """An output item as it is added: in progress, its content still to come."""
    return {**item, "status": "in_progress", **empty}
