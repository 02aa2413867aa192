"""The gateway's OpenAPI 3.1 document, served as `app.openapi()`.

FastAPI only describes its own path operations (the admin router); the OpenAI surface
and the spend API are plain Starlette routes that it cannot see into. This module
writes their operations by hand, with request bodies modelled on OpenAI's API, and
merges them over FastAPI's generated paths, so one document covers every endpoint:

    install(app)                 # in `create_app`
    app.openapi()["paths"]["/v1/chat/completions"]["post"]["requestBody"]

The fields the gateway checks itself (`model`, the prompt, `stream`, `max_tokens`,
`n`, `temperature`, `top_p`, `tools`, `user`...) carry exactly the bounds it enforces;
the rest follow OpenAI's schema and pass to the upstream untouched, as do unknown
fields (`additionalProperties`), which the upstream judges. Every error is rendered in
OpenAI's shape, the `Error` schema.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from gateway.bridges import schema as bridged
from gateway.ledger.rollup import GROUPABLE
from gateway.spend.query import FORMATS, MAX_LIMIT
from gateway.validation import MAX_JSON_DEPTH, MAX_OUTPUT_TOKENS

Schema = dict[str, Any]
Security = list[dict[str, list[str]]]
JSON = "application/json"
SSE = "text/event-stream"
# The dashboard's files: its page, script, styles and licence.
DASHBOARD_MEDIA = ("text/html", "text/javascript", "text/css", "text/plain")
DESCRIPTION = (
    "An OpenAI-compatible gateway that routes each request to one of the policy's "
    'deployments. Errors use OpenAI\'s shape: `{"error": {"message", "type", '
    '"param", "code"}}`. A policy with `auth.anonymous_team` also admits key-less '
    "callers on the gateway's own machine."
)
# status -> (name under `components/responses`, what it means)
ERRORS: Mapping[int, tuple[str, str]] = {
    400: (
        "BadRequest",
        "The request is malformed; `param` names the field (or an upstream refused it).",
    ),
    401: ("Unauthorized", "No key, a malformed Authorization header, or an unknown key."),
    403: ("Forbidden", "The key may not use this route (or this API)."),
    404: ("NotFound", "No such model (route or deployment) for this key, or no such path."),
    405: ("MethodNotAllowed", "The path exists, but not for this method."),
    413: ("PayloadTooLarge", "The body is over the policy's `max_body_bytes` (or the route's)."),
    429: (
        "TooManyRequests",
        "A rate limit or budget refused it; `Retry-After` says when to retry.",
    ),
    502: ("BadGateway", "The upstream failed or answered something that is not OpenAI's API."),
    503: ("ServiceUnavailable", "No deployment can take it now, or limits cannot be checked."),
    504: ("GatewayTimeout", "The upstreams did not answer within the request's deadline."),
}
CLIENT_ERRORS = (400, 401, 403, 404, 405, 413, 429, 502, 503, 504)
READ_ERRORS = (400, 401, 403, 405, 503)  # the spend API reads the ledger, never an upstream

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


# One schema per role (the roles `gateway.validation` accepts), told apart by `role`.
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
    "seed": {"type": ["integer", "null"]},
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

SECURITY_SCHEMES: Mapping[str, Schema] = {
    name: {"type": "http", "scheme": "bearer", "description": description}
    for name, description in (
        ("clientKey", "A client key from the policy's `keys`."),
        ("financeKey", "A key from the policy's `finance_keys`."),
        ("adminKey", "A key from the policy's `admin_keys`."),
        ("metricsKey", "A key from the policy's `metrics_keys`."),
    )
}
CLIENT: Security = [{"clientKey": []}, {}]  # none: `auth.anonymous_team`, from this machine
FINANCE: Security = [{"financeKey": []}, {"adminKey": []}]
ADMIN: Security = [{"adminKey": []}]
METRICS: Security = [
    {},
    {"metricsKey": []},
    {"adminKey": []},
]  # a key once `metrics_keys` lists one
PUBLIC: Security = []
HEADERS: Mapping[str, Schema] = {
    "x-request-id": {"description": "The request's id in the gateway's logs and ledger."},
    "retry-after": {"description": "Whole seconds to wait before retrying."},
    "x-should-retry": {"description": "`false` when no wait lets the request through."},
}
HEADERS_BY_STATUS: Mapping[int, tuple[str, ...]] = {
    429: ("retry-after", "x-should-retry"),
    503: ("retry-after",),
}


def error_response(status: int) -> Schema:
    """The reusable response for an error status (under `components/responses`)."""
    names = ("x-request-id", *HEADERS_BY_STATUS.get(status, ()))
    headers = {name: {"schema": TEXT, **HEADERS[name]} for name in names}
    content = {JSON: {"schema": ref("Error")}}
    return {"description": ERRORS[status][1], "headers": headers, "content": content}


def error_ref(status: int) -> Schema:
    return {"$ref": f"#/components/responses/{ERRORS[status][0]}"}


def reply(description: str, media: Mapping[str, Schema]) -> Schema:
    """A response with one schema per media type."""
    content = {media_type: {"schema": schema} for media_type, schema in media.items()}
    return {"description": description, "content": content}


def operation(
    summary: str,
    ok: Schema,
    errors: Iterable[int],
    security: Security,
    *,
    body: str | None = None,
    parameters: Iterable[Schema] = (),
    ok_status: str = "200",
    others: Mapping[str, Schema] | None = None,
) -> Schema:
    """One operation: its success reply, the errors it can answer, who may call it."""
    responses = {ok_status: ok, **(others or {}), **{str(s): error_ref(s) for s in errors}}
    op: Schema = {"summary": summary, "security": security, "responses": responses}
    if body is not None:
        op["requestBody"] = {"required": True, "content": {JSON: {"schema": ref(body)}}}
    if parameters:
        op["parameters"] = list(parameters)
    return op


def query(name: str, description: str, schema: Schema) -> Schema:
    return {"name": name, "in": "query", "description": description, "schema": schema}


def path_parameter(name: str, description: str, schema: Schema) -> Schema:
    parameter = query(name, description, schema)
    return {**parameter, "in": "path", "required": True}


DAY = {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"}
DIMENSIONS = "|".join(GROUPABLE)
SPEND_PARAMETERS: Mapping[str, Schema] = {
    "from": query("from", "First day (UTC, inclusive); default: 29 days before `to`.", DAY),
    "to": query("to", "Last day (UTC, inclusive); default: today.", DAY),
    "group_by": query(
        "group_by",
        f"Dimensions, comma-separated: {', '.join(GROUPABLE)}.",
        {"type": "string", "pattern": f"^({DIMENSIONS})(,({DIMENSIONS}))*$"},
    ),
    "team": query("team", "Only these teams, comma-separated.", TEXT),
    "sort": query("sort", "A column, with a leading '-' for descending.", TEXT),
    "limit": query(
        "limit", "Rows kept after sorting.", {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}
    ),
    "format": query("format", "The reply's format.", {"enum": list(FORMATS)}),
}


def spend(summary: str, report: str, *names: str) -> Schema:
    """A spend API operation: a report as JSON or CSV, for finance and admin keys."""
    ok = reply("The report.", {JSON: ref(report), "text/csv": TEXT})
    parameters = [SPEND_PARAMETERS[name] for name in names]
    return operation(summary, ok, READ_ERRORS, FINANCE, parameters=parameters)


def proxied(summary: str, request: str, reply_schema: str, *media: str) -> Schema:
    """An OpenAI operation, answered by an upstream (as events too, for `media`)."""
    ok = reply("The upstream's reply.", {JSON: ref(reply_schema), **dict.fromkeys(media, EVENT)})
    return operation(summary, ok, CLIENT_ERRORS, CLIENT, body=request)


def anthropic(summary: str, request: str, reply_schema: str) -> Schema:
    """An Anthropic Messages operation: its errors in Anthropic's shape, its key also
    in `x-api-key`."""
    op = proxied(summary, request, reply_schema, SSE)
    for status in CLIENT_ERRORS:
        response = error_response(status)
        response["content"] = {JSON: {"schema": ref("AnthropicError")}}
        op["responses"][str(status)] = response
    op["security"] = [*CLIENT, {"anthropicKey": []}]
    return op


def plain(summary: str, ok: Schema, errors: Iterable[int], security: Security) -> Schema:
    return operation(summary, reply("OK.", {JSON: ok}), errors, security)


PATHS: Mapping[str, Mapping[str, Schema]] = {
    "/v1/chat/completions": {
        "post": proxied("Create a chat completion", "ChatCompletionRequest", "ChatCompletion", SSE)
    },
    "/v1/completions": {
        "post": proxied("Create a completion", "CompletionRequest", "Completion", SSE)
    },
    "/v1/embeddings": {"post": proxied("Create embeddings", "EmbeddingRequest", "EmbeddingList")},
    "/v1/responses": {
        "post": proxied("Create a response (bridged to chat)", "ResponsesRequest", "Response", SSE)
    },
    "/v1/messages": {
        "post": anthropic("Create a message (bridged to chat)", "MessagesRequest", "Message")
    },
    "/v1/models": {
        "get": plain("List the models this key may use", ref("ModelList"), (401, 405), CLIENT)
    },
    "/v1/models/{model}": {
        "get": operation(
            "One model this key may use (the list, for an empty name)",
            reply("The model.", {JSON: {"oneOf": [ref("Model"), ref("ModelList")]}}),
            (401, 404, 405),
            CLIENT,
            parameters=[path_parameter("model", "A route or deployment name.", TEXT)],
        )
    },
    "/v1/spend": {"get": spend("Spend, grouped", "SpendReport", *SPEND_PARAMETERS)},
    "/v1/spend/budgets": {
        "get": spend("The budgets and their spend", "BudgetReport", "team", "format")
    },
    "/v1/spend/sla": {
        "get": spend("SLA attainment per route", "SlaReport", "from", "to", "team", "format")
    },
    "/v1/spend/access": {
        "get": plain(
            "The role of the caller's key",
            obj({"role": {"enum": ["finance", "admin"]}}, "role"),
            (401, 403, 405),
            FINANCE,
        )
    },
    "/healthz": {
        "get": plain("Liveness", obj({"status": {"const": "ok"}}, "status"), (405,), PUBLIC)
    },
    "/readyz": {
        "get": operation(
            "Readiness: some deployment is usable",
            reply("Ready.", {JSON: ref("Readiness")}),
            (405,),
            PUBLIC,
            others={"503": reply("No deployment is usable.", {JSON: ref("Readiness")})},
        )
    },
    "/metrics": {
        "get": operation(
            "Prometheus metrics",
            reply("The exposition.", {"text/plain": TEXT}),
            (401, 405),
            METRICS,
        )
    },
    "/admin/reload": {
        "post": plain(
            "Reload the policy file",
            obj({"status": {"const": "reloaded"}, "digest": TEXT}, "status", "digest"),
            (400, 401, 405),
            ADMIN,
        )
    },
    "/admin/policy": {
        "get": plain(
            "The serving policy and the deployments' health",
            obj(
                {"digest": TEXT, "routes": {"type": "object"}, "deployments": {"type": "object"}},
                "digest",
                "routes",
                "deployments",
            ),
            (401, 405),
            ADMIN,
        )
    },
    "/dashboard": {
        "get": {
            "summary": "Redirect to the finance dashboard",
            "security": PUBLIC,
            "responses": {"308": {"description": "To `/dashboard/`."}, "405": error_ref(405)},
        }
    },
    "/dashboard/{name}": {
        "get": operation(
            "The finance dashboard's page and its assets",
            reply("The file.", dict.fromkeys(DASHBOARD_MEDIA, TEXT)),
            (404, 405),
            PUBLIC,
            parameters=[path_parameter("name", "A file; empty for the page.", TEXT)],
        )
    },
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


def merge(generated: Schema, paths: Mapping[str, Mapping[str, Schema]]) -> Schema:
    """FastAPI's document with `paths` laid over it: an operation FastAPI knows keeps its
    operationId and description (ours get `post_v1_chat_completions` and the like);
    `paths` wins for everything else."""
    merged_paths = {path: dict(ops) for path, ops in generated.get("paths", {}).items()}
    for path, ops in paths.items():
        known = merged_paths.setdefault(path, {})
        for method, op in ops.items():
            fallback_id = f"{method}_{re.sub(r'[^a-zA-Z0-9]+', '_', path).strip('_')}"
            known[method] = {"operationId": fallback_id, **known.get(method, {}), **op}
    components = dict(generated.get("components", {}))
    components["schemas"] = {**components.get("schemas", {}), **COMPONENTS}
    components["responses"] = {name: error_response(s) for s, (name, _) in ERRORS.items()}
    components["securitySchemes"] = {**SECURITY_SCHEMES, "anthropicKey": bridged.API_KEY}
    return {**generated, "paths": merged_paths, "components": components}


def document(app: FastAPI) -> Schema:
    """The gateway's OpenAPI document, built once per app (a copy: it is the caller's)."""
    if app.openapi_schema is None:
        generated = get_openapi(
            title=app.title, version=app.version, description=DESCRIPTION, routes=app.routes
        )
        app.openapi_schema = copy.deepcopy(merge(generated, PATHS))
    return app.openapi_schema


def install(app: FastAPI) -> None:
    """Make `app.openapi()` (and FastAPI's /openapi.json, where enabled) serve `document`."""
    app.openapi = functools.partial(document, app)  # type: ignore[method-assign]
