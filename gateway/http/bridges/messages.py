"""`POST /v1/messages`: Anthropic's Messages API, bridged to chat completions with
litellm's Anthropic <-> chat adapter (`gateway.http.bridges.base`), or sent as it is to
deployments that serve it natively (capability `messages`, Anthropic's by default;
`gateway.native`), with the client's `anthropic-version` and `anthropic-beta` headers.

The key comes as `x-api-key` (the Anthropic SDK's header) or `Authorization: Bearer`.
Errors are rendered in Anthropic's shape, `{"type": "error", "error": {"type",
"message"}}`, with the gateway's status codes (`error_body`). Only custom (function)
tools are bridged; Anthropic's server tools need an Anthropic deployment.

Every content block is translated or refused, never dropped: what litellm's adapter does
not carry (`BLOCKS`, `SOURCES`), a field the API does not have, need a native deployment
(`NativeCall.required_by`), and a route with none answers a 400 naming it. Two gaps in
the adapter are filled before it runs (`bridged_body`): a document with a text (or
text-only content) source becomes a text block carrying its title, context and text, and
a `tool_result` with `is_error` has its text prefixed "Error: ".

A bridged stream's `message_start` reports the prompt's tokens as the gateway counts
them (an OpenAI stream reports its usage only at its end), and its `message_delta` the
upstream's count (`with_prompt_count`).

`POST /v1/messages/count_tokens` answers `{"input_tokens": N}`: the gateway's count of
the request's chat form, for the model the route would first use. No upstream is asked,
nothing is recorded or held, and no rate limit applies, as for `/v1/models`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from gateway.errors import GatewayError, InvalidRequest
from gateway.http.bridges.base import (
    ChunkSource,
    StreamFailed,
    Translation,
    bridge,
    chat_form,
    library,
    plain,
    prompt_model,
    requested_model,
    sse,
    translated_request,
)
from gateway.http.bridges.checks import (
    MAX_TOKENS_FORM,
    Check,
    between,
    check_fields,
    expect,
    is_function_name,
    is_int,
    is_objects,
    is_token_limit,
    optional,
    refuse,
    unbridged_top_field,
)
from gateway.http.endpoints import arrival, checked, client_gone
from gateway.http.validation import parse_object, show
from gateway.native import NativeCall
from gateway.native.formats import messages_error_event

log = logging.getLogger(__name__)

# Anthropic's error `type` per status; other 4xx read as `invalid_request_error`, 5xx
# as `api_error`.
ERROR_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}
FIELDS: Mapping[str, tuple[Check, str]] = {
    "system": (optional(lambda v: isinstance(v, str) or is_objects(v)), "a string or blocks"),
    "stop_sequences": (
        optional(lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v)),
        "an array of strings",
    ),
    "stream": (optional(lambda v: isinstance(v, bool)), "a boolean"),
    "temperature": (between(0, 1), "a number in [0, 1]"),
    "top_p": (between(0, 1), "a number in [0, 1]"),
    "top_k": (optional(lambda v: is_int(v) and v >= 0), "a non-negative integer"),
    "tools": (optional(is_objects), "an array of objects"),
    "metadata": (optional(lambda v: isinstance(v, dict)), "an object"),
    "thinking": (optional(lambda v: isinstance(v, dict)), "an object"),
}
TOOL_CHOICES = ("auto", "any", "tool", "none")
ROLES = ("user", "assistant")
# Every top-level field of the Messages API: the bridge refuses others (unknown to the API),
# which only a native deployment may judge. Known ones it does not translate are dropped,
# but for those that shape the answer (`UNTRANSLATED`), which only a native one may serve.
KNOWN_FIELDS = frozenset(
    {
        *FIELDS,
        *("model", "messages", "max_tokens", "tool_choice", "service_tier", "container"),
        *("mcp_servers", "context_management", "cache_control", "output_config"),
        *("output_format", "inference_geo", "speed", "diagnostics", "user_profile_id"),
        "workspace_id",
    }
)
# field -> whether its value asks for what the bridge cannot give: structured output,
# MCP servers, a code-execution container
UNTRANSLATED: Mapping[str, Callable[[Any], bool]] = {
    "output_format": lambda v: v is not None,
    "output_config": lambda v: isinstance(v, dict) and v.get("format") is not None,
    "mcp_servers": bool,
    "container": lambda v: v is not None,
}
# role -> the content blocks litellm's adapter translates to chat (it drops the others;
# earlier turns' thinking, which Anthropic itself leaves out of the context, included)
BLOCKS: Mapping[str, frozenset[str]] = {
    "user": frozenset({"text", "image", "document", "tool_result"}),
    "assistant": frozenset({"text", "tool_use", "thinking", "redacted_thinking"}),
}
RESULT_BLOCKS = frozenset({"text", "image", "document"})  # in a tool_result's content
# block type -> the `source.type`s translated (a PDF's URL would become an image URL; a
# file id is Anthropic's own)
SOURCES: Mapping[str, tuple[str, ...]] = {
    "image": ("base64", "url"),
    "document": ("base64", "text", "content"),
}
PDF = "application/pdf"
ERROR_PREFIX = "Error: "  # a tool_result's `is_error`, in its text
NOT_BRIDGED = "not supported on this route (bridged to an OpenAI-style deployment)"
# The client's headers a native deployment gets (the API version and beta features).
PASSED_ON_HEADERS = ("anthropic-version", "anthropic-beta")


class MessagesTranslation(Translation):
    surface = "Messages API"
    wire = "messages"
    input_field = "messages"

    def native_call(self, headers: Mapping[str, str]) -> NativeCall:
        passed_on = {name: headers[name] for name in PASSED_ON_HEADERS if name in headers}
        return NativeCall(self.wire, self.body, required_by=self.required_by, headers=passed_on)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.id = "msg_" + self.request_id.removeprefix("req_")
        self.tool_names: dict[str, str] = {}  # litellm's truncated tool names -> the client's
        unbridged = unknown_field(self.body) or unbridged_block(self.body)
        self.required_by: str | None = unbridged[0] if unbridged else None
        self.why_native = unbridged[1] if unbridged else ""

    @staticmethod
    def check(body: dict[str, Any]) -> None:
        tokens = body.get("max_tokens")
        expect(is_token_limit(tokens), "max_tokens", MAX_TOKENS_FORM, tokens)
        check_prompt(body)

    def chat_body(self) -> dict[str, Any]:
        chat, self.tool_names = self.lib.messages.translate_anthropic_to_openai(
            bridged_body(self.body), custom_llm_provider="openai"
        )
        choice = self.body.get("tool_choice") or {}
        if choice.get("disable_parallel_tool_use") is True and chat.get("tools"):
            chat["parallel_tool_calls"] = False
        if self.stream:  # the usage of the last event, which `message_delta` reports
            chat["stream_options"] = {"include_usage": True}
        return chat_form(chat, self.model)

    def reply(self, chat: dict[str, Any]) -> dict[str, Any]:
        message = self.lib.messages.translate_openai_response_to_anthropic(
            self.lib.model_response(**chat), self.tool_names
        )
        body: dict[str, Any] = plain(message)
        body["id"] = self.id
        return body

    async def events(self, chunks: ChunkSource) -> AsyncIterator[bytes]:
        try:
            model = await self.answering_model(chunks)
            counted = await self.prompt_tokens()
            stream = self.lib.messages_stream(
                chunks, model=model, tool_name_mapping=self.tool_names
            )
            async for event in stream:
                data = plain(event)
                if data.get("type") == "message_start" and isinstance(data.get("message"), dict):
                    data["message"]["id"] = self.id
                with_prompt_count(data, counted, chunks.reported_usage)
                yield sse(str(data.get("type", "message")), data)
        except StreamFailed as failed:
            yield messages_error_event(str(failed))
        except Exception as exc:  # litellm's translation of the upstream's stream
            log.warning("Messages stream %s not translated: %s", self.request_id, exc)
            yield messages_error_event(f"the upstream's stream could not be translated: {exc}")
        finally:
            await chunks.aclose()


def with_prompt_count(event: dict[str, Any], counted: int, reported: bool) -> None:
    """Put the gateway's count of the prompt's tokens in litellm's `message_start`,
    which says 0 (an OpenAI stream reports usage only at its end, and the Anthropic SDK
    reads `input_tokens` there), and in `message_delta` when the upstream reported no
    usage (`reported`); otherwise `message_delta` keeps the upstream's, as litellm
    translated it."""
    kind = event.get("type")
    if kind == "message_start":
        message = event.get("message")
        usage = message.get("usage") if isinstance(message, dict) else None
    elif kind == "message_delta" and not reported:
        usage = event.get("usage")
    else:
        return
    if isinstance(usage, dict):
        usage["input_tokens"] = counted


def error_body(error: GatewayError) -> dict[str, Any]:
    """The gateway's error in Anthropic's shape."""
    other = "api_error" if error.status >= 500 else "invalid_request_error"
    kind = ERROR_TYPES.get(error.status, other)
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def check_prompt(body: dict[str, Any]) -> None:
    """Refuse a body whose prompt the bridge cannot read (all `check` does but for
    `max_tokens`, which counting tokens does without); InvalidRequest names the field."""
    check_fields(body, FIELDS)
    _check_messages(body.get("messages"))
    _check_tools(body)


def _check_messages(messages: Any) -> None:
    if messages is None:
        raise InvalidRequest("'messages' is required", param="messages")
    expect(is_objects(messages) and bool(messages), "messages", "a non-empty array", messages)
    for i, message in enumerate(messages):
        role = message.get("role")
        expect(role in ROLES, f"messages[{i}].role", "one of user, assistant", role)
        content = message.get("content")
        blocks = is_objects(content) and all(isinstance(b.get("type"), str) for b in content)
        ok = isinstance(content, str) or blocks
        expect(ok, f"messages[{i}].content", "a string or an array of typed blocks", content)


def unknown_field(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first top-level field the Messages API does not have, and why it needs a
    native deployment (which judges it)."""
    return unbridged_top_field(body, KNOWN_FIELDS, UNTRANSLATED, "Messages API")


def unbridged_block(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """The field of the first content block the bridge does not translate, and why."""
    for i, message in enumerate(body["messages"]):
        content = message["content"]
        role = message["role"]
        for j, block in enumerate(content if isinstance(content, list) else []):
            where = f"messages[{i}].content[{j}]"
            if (found := _unbridged(block, where, BLOCKS[role], f"{role} messages")) is not None:
                return found
    return None


def _unbridged(block: Any, where: str, kinds: frozenset[str], place: str) -> tuple[str, str] | None:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind not in kinds:
        return f"{where}.type", f"{show(kind)} blocks in {place} are {NOT_BRIDGED}"
    if kind in SOURCES:
        return _unbridged_source(block, where)
    content = block.get("content")
    for k, inner in enumerate(
        content if kind == "tool_result" and isinstance(content, list) else []
    ):
        if found := _unbridged(inner, f"{where}.content[{k}]", RESULT_BLOCKS, "tool results"):
            return found
    return None


def _unbridged_source(block: dict[str, Any], where: str) -> tuple[str, str] | None:
    source = block.get("source")
    source = source if isinstance(source, dict) else {}
    kind = source.get("type")
    if kind not in SOURCES[block["type"]]:
        return (
            f"{where}.source.type",
            f"{block['type']} sources of type {show(kind)} are {NOT_BRIDGED}",
        )
    if kind == "base64" and block["type"] == "document" and source.get("media_type") != PDF:
        return f"{where}.source.media_type", f"base64 documents other than PDFs are {NOT_BRIDGED}"
    if kind in ("text", "content") and _document_text(source) is None:
        field = "data" if kind == "text" else "content"
        return f"{where}.source.{field}", f"a document source other than text is {NOT_BRIDGED}"
    return None


def bridged_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """`body` as litellm's adapter is given it: text documents as text blocks, error
    results marked. A block it would not translate (the request then needs a native
    deployment) stays in the chat form as its JSON, which only routing and budgets read."""
    messages = [
        {**m, "content": [_bridged(b, BLOCKS[m["role"]]) for b in m["content"]]}
        if isinstance(m["content"], list)
        else m
        for m in body["messages"]
    ]
    return {**body, "messages": messages}


def _bridged(block: Any, kinds: frozenset[str]) -> Any:
    if _unbridged(block, "", kinds, "") is not None:
        return {"type": "text", "text": orjson.dumps(block).decode()}
    source = block.get("source")
    if block["type"] == "document" and (text := _document_text(source)) is not None:
        labels = [f"Document {k}: {block[k]}" for k in ("title", "context") if block.get(k)]
        return {"type": "text", "text": "\n".join(labels) + "\n\n" + text if labels else text}
    if block["type"] != "tool_result":
        return block
    content = block.get("content")
    if isinstance(content, list):
        content = [_bridged(inner, RESULT_BLOCKS) for inner in content]
    return {**block, "content": _as_error(content) if block.get("is_error") is True else content}


def _document_text(source: Any) -> str | None:
    """A text or text-only content source's text; None for other sources."""
    if not isinstance(source, dict) or source.get("type") not in ("text", "content"):
        return None
    text = source.get("data") if source["type"] == "text" else source.get("content")
    if isinstance(text, list) and all(
        isinstance(b, dict) and b.get("type") == "text" for b in text
    ):
        parts = [b.get("text") for b in text]
        text = "\n\n".join(parts) if all(isinstance(p, str) for p in parts) else None
    return text if isinstance(text, str) else None


def _as_error(content: Any) -> Any:
    """A tool result's content marked as an error (chat's tool messages have no flag)."""
    if content is None or isinstance(content, str):
        return ERROR_PREFIX + content if content else ERROR_PREFIX.strip()
    if content and content[0].get("type") == "text" and isinstance(content[0].get("text"), str):
        return [{**content[0], "text": ERROR_PREFIX + content[0]["text"]}, *content[1:]]
    return [{"type": "text", "text": ERROR_PREFIX.strip()}, *content]


def _check_tools(body: dict[str, Any]) -> None:
    for i, tool in enumerate(body.get("tools") or []):
        if tool.get("type") not in (None, "custom"):
            raise refuse(f"tools[{i}].type", "only custom tools are bridged to chat")
        name = tool.get("name")
        expect(is_function_name(name), f"tools[{i}].name", "a tool name", name)
        schema = tool.get("input_schema")
        expect(isinstance(schema, dict), f"tools[{i}].input_schema", "an object", schema)
    choice = body.get("tool_choice")
    if choice is None:
        return
    expect(isinstance(choice, dict), "tool_choice", "an object", choice)
    kind = choice.get("type")
    expect(kind in TOOL_CHOICES, "tool_choice.type", f"one of {', '.join(TOOL_CHOICES)}", kind)
    if kind == "tool":
        name = choice.get("name")
        expect(isinstance(name, str), "tool_choice.name", "a string", name)


async def create_message(request: Request) -> Response:
    return await bridge(request, MessagesTranslation, _authorization(request))


async def count_tokens(request: Request) -> Response:
    """The prompt's tokens as the gateway counts them for budgets, for the model the
    route would first use; checked as `/v1/messages` checks a request (but for
    `max_tokens`), with its errors, in the same order."""
    try:
        came = await arrival(request, _authorization(request))
    except ClientDisconnect:
        return client_gone(request)
    size = len(came.raw)  # a big body is parsed, checked and translated off the loop
    body = await checked(size, _checked_prompt, came.raw)
    model = requested_model(body)
    translation = MessagesTranslation(await library(), body, came.request_id)
    await checked(size, translated_request, translation)  # its chat form, which is counted
    route = came.runtime.resolve(model, came.principal.can_use)
    came.principal.check_route(route.name)
    translation.counted_as = prompt_model(came.runtime, route.name)
    tokens = await translation.prompt_tokens()
    return JSONResponse({"input_tokens": tokens}, headers={"x-request-id": came.request_id})


def _checked_prompt(raw: bytes) -> dict[str, Any]:
    """The body of a count, parsed and checked (in a worker for a big one)."""
    body = parse_object(raw)
    requested_model(body)
    check_prompt(body)
    return body


def _authorization(request: Request) -> str | None:
    """The key from `x-api-key` unless an Authorization header is sent."""
    key = request.headers.get("x-api-key")
    return None if "authorization" in request.headers or not key else f"Bearer {key}"
