"""The bridged APIs' bodies in the OpenAPI document (`gateway.http.openapi` merges them):
OpenAI's Responses API and Anthropic's Messages API, with the bounds the bridges check
(`gateway.http.bridges.responses`, `gateway.http.bridges.messages`). Plain JSON Schema, no
imports from `gateway.http.openapi`, which imports this module."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.http.validation import MAX_JSON_DEPTH
from gateway.request import MAX_OUTPUT_TOKENS

Schema = dict[str, Any]
TEXT: Schema = {"type": "string"}
NULLABLE_TEXT: Schema = {"type": ["string", "null"]}
OBJECT: Schema = {"type": "object"}
NULLABLE_OBJECT: Schema = {"type": ["object", "null"]}
BOOLEAN: Schema = {"type": ["boolean", "null"]}
TOKENS: Schema = {"type": "integer", "minimum": 1, "maximum": MAX_OUTPUT_TOKENS}
NAME: Schema = {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"}
MODEL: Schema = {"type": "string", "minLength": 1, "description": "A route or deployment name."}
PASSED_ON = (
    f"Nested at most {MAX_JSON_DEPTH} levels deep. Sent as it is to deployments that "
    "serve this API natively, else translated to a chat completion request (see the "
    "HTTP docs for what the bridge approximates or drops)."
)
COUNTED = (
    "A Messages API request without `max_tokens` (ignored when sent), checked as "
    "`/v1/messages` checks one. Counted by the gateway, never sent upstream."
)
STATEFUL = (
    "Stored state: served by the route's native deployments only (capability "
    "`responses`); a 400 naming the field on a route without one."
)


def obj(properties: Mapping[str, Schema], *required: str, **extra: Any) -> Schema:
    schema: Schema = {"type": "object", "properties": dict(properties), **extra}
    if required:
        schema["required"] = list(required)
    return schema


def number(low: float, high: float) -> Schema:
    return {"type": ["number", "null"], "minimum": low, "maximum": high}


def array_of(items: Schema) -> Schema:
    return {"type": "array", "minItems": 1, "items": items}


RESPONSES_ITEM = {
    "oneOf": [
        obj(
            {
                "type": {"const": "message"},
                "role": {"enum": ["user", "assistant", "system", "developer"]},
                "content": {"oneOf": [TEXT, {"type": "array", "items": OBJECT}]},
            },
            "role",
            "content",
        ),
        obj(
            {"type": {"const": "function_call"}, "call_id": TEXT, "name": TEXT, "arguments": TEXT},
            "type",
            "call_id",
            "name",
            "arguments",
        ),
        obj(
            {"type": {"const": "function_call_output"}, "call_id": TEXT, "output": {}},
            "type",
            "call_id",
            "output",
        ),
    ]
}
RESPONSES_FORMAT = {
    "oneOf": [
        obj({"type": {"enum": ["text", "json_object"]}}, "type"),
        obj(
            {"type": {"const": "json_schema"}, "name": TEXT, "schema": OBJECT},
            "type",
            "name",
            "schema",
        ),
    ]
}
ANTHROPIC_MESSAGE = obj(
    {
        "role": {"enum": ["user", "assistant"]},
        "content": {"oneOf": [TEXT, {"type": "array", "items": obj({"type": TEXT}, "type")}]},
    },
    "role",
    "content",
)
# What a Messages request's prompt is made of: what `/v1/messages/count_tokens` reads.
MESSAGES_PROMPT: Mapping[str, Schema] = {
    "messages": array_of(ANTHROPIC_MESSAGE),
    "system": {"oneOf": [TEXT, {"type": "array", "items": OBJECT}]},
    "stop_sequences": {"type": ["array", "null"], "items": TEXT},
    "stream": BOOLEAN,
    "temperature": number(0, 1),
    "top_p": number(0, 1),
    "top_k": {"type": ["integer", "null"], "minimum": 0},
    "tools": {
        "type": ["array", "null"],
        "items": obj(
            {"type": {"enum": ["custom", None]}, "name": NAME, "input_schema": OBJECT},
            "name",
            "input_schema",
        ),
    },
    "tool_choice": {
        "oneOf": [
            obj({"type": {"enum": ["auto", "any", "none"]}}, "type"),
            obj({"type": {"const": "tool"}, "name": TEXT}, "type", "name"),
        ]
    },
    "metadata": NULLABLE_OBJECT,
    "thinking": NULLABLE_OBJECT,
}

REQUESTS: Mapping[str, Schema] = {
    "ResponsesRequest": obj(
        {
            "model": MODEL,
            "input": {"oneOf": [{"type": "string", "minLength": 1}, array_of(RESPONSES_ITEM)]},
            "instructions": NULLABLE_TEXT,
            "max_output_tokens": {
                "type": ["integer", "null"],
                "minimum": 1,
                "maximum": MAX_OUTPUT_TOKENS,
            },
            "temperature": number(0, 2),
            "top_p": number(0, 1),
            "stream": BOOLEAN,
            "parallel_tool_calls": BOOLEAN,
            "user": NULLABLE_TEXT,
            "tools": {
                "type": ["array", "null"],
                "items": obj(
                    {"type": {"const": "function"}, "name": NAME, "parameters": NULLABLE_OBJECT},
                    "type",
                    "name",
                ),
            },
            "tool_choice": {
                "oneOf": [
                    {"enum": ["none", "auto", "required"]},
                    obj({"type": {"const": "function"}, "name": TEXT}, "type", "name"),
                ]
            },
            "text": obj({"format": RESPONSES_FORMAT}),
            "reasoning": NULLABLE_OBJECT,
            "metadata": NULLABLE_OBJECT,
            "previous_response_id": {"type": ["string", "null"], "description": STATEFUL},
            "store": {"type": ["boolean", "null"], "description": f"When true: {STATEFUL}"},
        },
        "model",
        "input",
        additionalProperties=True,
        description=PASSED_ON,
    ),
    "MessagesRequest": obj(
        {"model": MODEL, "max_tokens": TOKENS, **MESSAGES_PROMPT},
        "model",
        "max_tokens",
        "messages",
        additionalProperties=True,
        description=PASSED_ON,
    ),
    "MessageCountTokensRequest": obj(
        {"model": MODEL, **MESSAGES_PROMPT},
        "model",
        "messages",
        additionalProperties=True,
        description=COUNTED,
    ),
}
REPLIES: Mapping[str, Schema] = {
    "Response": obj(
        {"id": TEXT, "object": {"const": "response"}, "output": {"type": "array"}},
        "id",
        "object",
        "output",
    ),
    "Message": obj(
        {"id": TEXT, "type": {"const": "message"}, "content": {"type": "array"}},
        "id",
        "type",
        "content",
    ),
    "MessageTokensCount": obj(
        {"input_tokens": {"type": "integer", "minimum": 0}},
        "input_tokens",
        description="The prompt's tokens as the gateway counts them for budgets.",
    ),
    "AnthropicError": obj(
        {
            "type": {"const": "error"},
            "error": obj({"type": TEXT, "message": TEXT}, "type", "message"),
        },
        "type",
        "error",
    ),
}
# The Anthropic SDK's header; `Authorization: Bearer` works too.
API_KEY: Schema = {
    "type": "apiKey",
    "in": "header",
    "name": "x-api-key",
    "description": "A client key, as the Anthropic SDK sends it (Messages API only).",
}
