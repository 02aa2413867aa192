"""The gateway's OpenAPI 3.1 document, served as `app.openapi()` (and at /openapi.json
when CASCADE_OPENAPI is on).

Every route is a plain Starlette route, so every operation is written here by hand, over
the schemas of `gateway.http.openapi_schemas`. Every error has OpenAI's shape, `Error`:

    document()["paths"]["/v1/chat/completions"]["post"]["requestBody"]
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterable, Mapping

from gateway.http.bridges import schema as bridged
from gateway.http.openapi_schemas import COMPONENTS, EVENT, TEXT, Schema, obj, ref
from gateway.ledger.rollup import GROUPABLE
from gateway.spend.query import FORMATS, MAX_LIMIT

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
VERSION = "0.1.0"
# The ids the admin operations had while FastAPI served them: generated SDKs name their
# methods after them.
ADMIN_OPERATION_IDS = {
    ("get", "/healthz"): "healthz_healthz_get",
    ("get", "/readyz"): "readyz_readyz_get",
    ("get", "/metrics"): "metrics_metrics_get",
    ("post", "/admin/reload"): "reload_policy_admin_reload_post",
    ("get", "/admin/policy"): "policy_status_admin_policy_get",
}
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
COUNT_ERRORS = (400, 401, 403, 404, 405, 413)  # counted here: no upstream, no limits
READ_ERRORS = (400, 401, 403, 405, 503)  # the spend API reads the ledger, never an upstream


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
    description: str | None = None,
) -> Schema:
    """One operation: its success reply, the errors it can answer, who may call it."""
    responses = {ok_status: ok, **(others or {}), **{str(s): error_ref(s) for s in errors}}
    op: Schema = {"summary": summary, "security": security, "responses": responses}
    if description is not None:
        op["description"] = description
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


def anthropic(op: Schema, errors: Iterable[int] = CLIENT_ERRORS) -> Schema:
    """An Anthropic Messages API operation: its errors in Anthropic's shape, its key
    also in `x-api-key`."""
    for status in errors:
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
        "post": anthropic(
            proxied("Create a message (bridged to chat)", "MessagesRequest", "Message", SSE)
        )
    },
    "/v1/messages/count_tokens": {
        "post": anthropic(
            operation(
                "Count a message's input tokens (the gateway's estimate)",
                reply("The count.", {JSON: ref("MessageTokensCount")}),
                COUNT_ERRORS,
                CLIENT,
                body="MessageCountTokensRequest",
                description=(
                    "The prompt's tokens as the gateway counts them for budgets (tiktoken; "
                    "an estimate for non-OpenAI models), for the route's first deployment. "
                    "No upstream is asked; nothing is billed, held or rate limited."
                ),
            ),
            COUNT_ERRORS,
        )
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
            description=(
                "Ready when some deployment is usable. A down ledger store does not make "
                "the gateway unready: spend is spooled locally and replayed."
            ),
        )
    },
    "/metrics": {
        "get": operation(
            "Prometheus metrics",
            reply("The exposition.", {"text/plain": TEXT}),
            (401, 405),
            METRICS,
            description="Prometheus text; open unless the policy lists `metrics_keys`.",
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


def operation_id(method: str, path: str) -> str:
    """`post_v1_chat_completions` and the like; the admin operations keep the ids the
    document gave them when FastAPI served them (`ADMIN_OPERATION_IDS`)."""
    return ADMIN_OPERATION_IDS.get((method, path)) or (
        f"{method}_{re.sub(r'[^a-zA-Z0-9]+', '_', path).strip('_')}"
    )


def _identified(path: str, ops: Mapping[str, Schema]) -> dict[str, Schema]:
    return {method: {"operationId": operation_id(method, path), **op} for method, op in ops.items()}


@functools.cache
def document() -> Schema:
    """The gateway's OpenAPI document, built once per process."""
    # A copy: callers may change the document without changing the module's constants.
    paths = {path: _identified(path, ops) for path, ops in copy.deepcopy(PATHS).items()}
    components = {
        "schemas": copy.deepcopy(dict(COMPONENTS)),
        "responses": {name: error_response(s) for s, (name, _) in ERRORS.items()},
        "securitySchemes": {**SECURITY_SCHEMES, "anthropicKey": bridged.API_KEY},
    }
    info = {"title": "cascade-gateway", "description": DESCRIPTION, "version": VERSION}
    return {"openapi": "3.1.0", "info": info, "paths": paths, "components": components}
