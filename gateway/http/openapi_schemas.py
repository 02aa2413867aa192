"""The OpenAI API's bodies and replies as JSON Schema: the document's `components/schemas`.

Fields the gateway checks itself (`model`, the prompt, `stream`, `max_tokens`, `n`,
`temperature`, `top_p`, `tools`, `user`...) carry exactly the bounds it enforces; the
rest follow OpenAI's schema, and unknown fields (`additionalProperties`) pass to the
upstream, which judges them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.http.bridges import schema as bridged
from gateway.http.validation import MAX_JSON_DEPTH
from gateway.request import MAX_OUTPUT_TOKENS

Schema = dict[str, Any]
TEXT = {"type": "string"}


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def obj(properties: Mapping[str, Schema], *required: str, **extra: Any) -> Schema:
    """An object schema; unknown properties are allowed unless `extra` says otherwise."""
    schema: Schema = {"type": "object", "properties": dict(properties), **extra}
    if required:
        schema["required"] = list(required)
    return schema


def every(properties: Mapping[str, Schema]) -> Schema:
    """An object that must have each of `properties`."""
    return obj(properties, *properties)


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def number(low: float, high: float) -> Schema:
    return {"type": ["number", "null"], "minimum": low, "maximum": high}


def parts(*names: str) -> Schema:
    """Message content as a non-empty array of the named content parts."""
    return {"type": "array", "minItems": 1, "items": {"oneOf": [ref(name) for name in names]}}


def string_or(*alternatives: Schema) -> Schema:
    return {"oneOf": [TEXT, *alternatives]}


STRINGS = {"type": "array", "minItems": 1, "items": TEXT}
TOKEN_IDS = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
TOKEN_ID_LISTS = {"type": "array", "minItems": 1, "items": TOKEN_IDS}
STOP = nullable(string_or({"type": "array", "minItems": 1, "maxItems": 4, "items": TEXT}))
MAX_TOKENS = {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_OUTPUT_TOKENS}
PENALTY = number(-2, 2)
MODEL = {"type": "string", "minLength": 1, "description": "A route or deployment name."}
USER = {"type": ["string", "null"]}


def part(kind: str, payload: Schema) -> Schema:
    """A content part: `{"type": kind, kind: payload}`."""
    return obj({"type": {"const": kind}, kind: payload}, "type", kind)


CONTENT_PARTS: Mapping[str, Schema] = {
    "TextPart": part("text", TEXT),
    "ImagePart": part(
        "image_url", obj({"url": TEXT, "detail": {"enum": ["auto", "low", "high"]}}, "url")
    ),
    "AudioPart": part(
        "input_audio", obj({"data": TEXT, "format": {"enum": ["wav", "mp3"]}}, "data", "format")
    ),
    "FilePart": part("file", obj(dict.fromkeys(("file_data", "file_id", "filename"), TEXT))),
    "RefusalPart": part("refusal", TEXT),
}

TOOL_CALL = obj(
    {
        "id": TEXT,
        "type": {"const": "function"},
        "function": obj({"name": TEXT, "arguments": TEXT}, "name", "arguments"),
    },
    "id",
    "type",
    "function",
)
TEXT_CONTENT = string_or(parts("TextPart"))


def message(role: str, properties: Mapping[str, Schema], *required: str) -> Schema:
    return obj(
        {"role": {"const": role}, **properties}, "role", *required, additionalProperties=True
    )


# One schema per role (the roles `gateway.http.validation` accepts), told apart by `role`.
MESSAGES: Mapping[str, Schema] = {
    "system": message("system", {"content": TEXT_CONTENT, "name": TEXT}, "content"),
    "developer": message("developer", {"content": TEXT_CONTENT, "name": TEXT}, "content"),
    "user": message(
        "user",
        {
            "content": string_or(parts("TextPart", "ImagePart", "AudioPart", "FilePart")),
            "name": TEXT,
        },
        "content",
    ),
    "assistant": message(
        "assistant",
        {
            "content": nullable(string_or(parts("TextPart", "RefusalPart"))),
            "refusal": {"type": ["string", "null"]},
            "name": TEXT,
            "tool_calls": {"type": "array", "items": TOOL_CALL},
        },
    ),
    "tool": message(
        "tool", {"content": TEXT_CONTENT, "tool_call_id": TEXT}, "content", "tool_call_id"
    ),
    "function": message(
        "function", {"content": {"type": ["string", "null"]}, "name": TEXT}, "content", "name"
    ),
}

FUNCTION = obj(
    {
        "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
        "description": TEXT,
        "parameters": {"type": "object"},
        "strict": {"type": ["boolean", "null"]},
    },
    "name",
)
TOOL_CHOICE = {
    "oneOf": [
        {"enum": ["none", "auto", "required"]},
        obj(
            {"type": {"const": "function"}, "function": obj({"name": TEXT}, "name")},
            "type",
            "function",
        ),
    ]
}
RESPONSE_FORMAT = {
    "oneOf": [
        obj({"type": {"const": "text"}}, "type"),
        obj({"type": {"const": "json_object"}}, "type"),
        obj(
            {
                "type": {"const": "json_schema"},
                "json_schema": obj(
                    {
                        "name": TEXT,
                        "description": TEXT,
                        "schema": {"type": "object"},
                        "strict": {"type": ["boolean", "null"]},
                    },
                    "name",
                ),
            },
            "type",
            "json_schema",
        ),
    ]
}
SAMPLING: Mapping[str, Schema] = {
    "model": MODEL,
    "max_tokens": MAX_TOKENS,
    "n": {"type": ["integer", "null"], "minimum": 1, "maximum": 128},
    "stream": {"type": ["boolean", "null"]},
    "stream_options": nullable(obj({"include_usage": {"type": "boolean"}})),
    "temperature": number(0, 2),
    "top_p": number(0, 1),
    "frequency_penalty": PENALTY,
    "presence_penalty": PENALTY,
    "logit_bias": nullable(
        {
            "type": "object",
            "additionalProperties": {"type": "integer", "minimum": -100, "maximum": 100},
        }
    ),
    "seed": {"type": ["integer", "null"], "minimum": -(2**63), "maximum": 2**63 - 1},
    "stop": STOP,
    "user": USER,
}
PASSED_ON = (
    f"Nested at most {MAX_JSON_DEPTH} levels deep. Fields not described here pass to the "
    "upstream untouched."
)
OUTPUT_BOUND = (
    f" The output asked for (prompts x `n` or `best_of` x max tokens) is at most "
    f"{MAX_OUTPUT_TOKENS:_} tokens."
)
REQUESTS: Mapping[str, Schema] = {
    "ChatCompletionRequest": obj(
        {
            "messages": {"type": "array", "minItems": 1, "items": ref("ChatMessage")},
            **SAMPLING,
            "max_completion_tokens": MAX_TOKENS,
            "logprobs": {"type": ["boolean", "null"]},
            "top_logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 20},
            "tools": {
                "type": ["array", "null"],
                "items": obj(
                    {"type": {"const": "function"}, "function": FUNCTION}, "type", "function"
                ),
            },
            "tool_choice": TOOL_CHOICE,
            "parallel_tool_calls": {"type": "boolean"},
            "response_format": RESPONSE_FORMAT,
            "reasoning_effort": {"enum": ["minimal", "low", "medium", "high", None]},
            "metadata": nullable({"type": "object", "additionalProperties": TEXT}),
        },
        "model",
        "messages",
        additionalProperties=True,
        description=PASSED_ON + OUTPUT_BOUND,
    ),
    "CompletionRequest": obj(
        {
            "prompt": string_or(STRINGS, TOKEN_IDS, TOKEN_ID_LISTS),
            **SAMPLING,
            "best_of": {"type": ["integer", "null"], "minimum": 1, "maximum": 128},
            "echo": {"type": ["boolean", "null"]},
            "logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 5},
            "suffix": USER,
        },
        "model",
        "prompt",
        additionalProperties=True,
        description=PASSED_ON + OUTPUT_BOUND,
    ),
    "EmbeddingRequest": obj(
        {
            "model": MODEL,
            "input": string_or(STRINGS, TOKEN_IDS, TOKEN_ID_LISTS),
            "encoding_format": {"enum": ["float", "base64"]},
            "dimensions": {"type": "integer", "minimum": 1},
            "user": USER,
            "stream": {"enum": [False, None], "description": "Embeddings cannot be streamed."},
        },
        "model",
        "input",
        additionalProperties=True,
        description=PASSED_ON,
    ),
}

ERROR = every(
    {
        "error": every(
            {
                "message": TEXT,
                "type": TEXT,
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            }
        )
    }
)
MODEL_ENTRY = every(
    {"id": TEXT, "object": {"const": "model"}, "created": {"type": "integer"}, "owned_by": TEXT}
)
ARRAY = {"type": "array"}
# One server-sent event (OpenAPI 3.1 describes a stream event by event): a chunk of the
# reply as JSON, or `[DONE]`.
EVENT = obj({"data": TEXT, "event": TEXT, "id": TEXT}, "data")
# Replies are the upstream's own bytes: only what every OpenAI-compatible server sends.
REPLIES: Mapping[str, Schema] = {
    "ChatCompletion": obj({"object": TEXT, "choices": ARRAY}, "choices"),
    "Completion": obj({"object": TEXT, "choices": ARRAY}, "choices"),
    "EmbeddingList": obj({"object": TEXT, "data": ARRAY}, "data"),
    "Model": MODEL_ENTRY,
    "ModelList": every(
        {"object": {"const": "list"}, "data": {"type": "array", "items": ref("Model")}}
    ),
    "Readiness": every(
        {
            "status": {"enum": ["ready", "unready"]},
            "policy_digest": TEXT,
            "available_deployments": {"type": "array", "items": TEXT},
            "ledger": {"enum": ["ok", "degraded"]},
        }
    ),
    "SpendReport": every(
        {"object": {"const": "spend.report"}, "data": ARRAY, "total": {"type": "object"}}
    ),
    "BudgetReport": every({"object": {"const": "spend.budgets"}, "data": ARRAY}),
    "SlaReport": every({"object": {"const": "spend.sla"}, "data": ARRAY}),
}

COMPONENTS: Mapping[str, Schema] = {
    "Error": ERROR,
    "ChatMessage": {"oneOf": [MESSAGES[role] for role in sorted(MESSAGES)]},
    **CONTENT_PARTS,
    **REQUESTS,
    **REPLIES,
    **bridged.REQUESTS,
    **bridged.REPLIES,
}
