"""`POST /v1/messages`: Anthropic's Messages API, bridged to chat completions with
litellm's Anthropic <-> chat adapter (`gateway.http.bridges.base`), or sent as it is to
deployments that serve it natively (capability `messages`, Anthropic's by default;
`gateway.native`), with the client's `anthropic-version` and `anthropic-beta` headers.

The key comes as `x-api-key` (the Anthropic SDK's header) or `Authorization: Bearer`.
Errors are rendered in Anthropic's shape, `{"type": "error", "error": {"type",
"message"}}`, with the gateway's status codes (`error_body`). Only custom (function)
tools are bridged; Anthropic's server tools need an Anthropic deployment.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import GatewayError, InvalidRequest
from gateway.http.bridges.base import (
    ChunkSource,
    StreamFailed,
    Translation,
    bridge,
    chat_form,
    plain,
    sse,
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
)
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
# The client's headers a native deployment gets (the API version and beta features).
PASSED_ON_HEADERS = ("anthropic-version", "anthropic-beta")


class MessagesTranslation(Translation):
    surface = "Messages API"
    wire = "messages"
    input_field = "messages"

    def native_call(self, headers: Mapping[str, str]) -> NativeCall:
        passed_on = {name: headers[name] for name in PASSED_ON_HEADERS if name in headers}
        return NativeCall(self.wire, self.body, headers=passed_on)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.id = "msg_" + self.request_id.removeprefix("req_")
        self.tool_names: dict[str, str] = {}  # litellm's truncated tool names -> the client's

    @staticmethod
    def check(body: dict[str, Any]) -> None:
        tokens = body.get("max_tokens")
        expect(is_token_limit(tokens), "max_tokens", MAX_TOKENS_FORM, tokens)
        check_fields(body, FIELDS)
        _check_messages(body.get("messages"))
        _check_tools(body)

    def chat_body(self) -> dict[str, Any]:
        chat, self.tool_names = self.lib.messages.translate_anthropic_to_openai(
            self.body, custom_llm_provider="openai"
        )
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
            stream = self.lib.messages_stream(
                chunks, model=model, tool_name_mapping=self.tool_names
            )
            async for event in stream:
                data = plain(event)
                if data.get("type") == "message_start" and isinstance(data.get("message"), dict):
                    data["message"]["id"] = self.id
                yield sse(str(data.get("type", "message")), data)
        except StreamFailed as failed:
            yield messages_error_event(str(failed))
        except Exception as exc:  # litellm's translation of the upstream's stream
            log.warning("Messages stream %s not translated: %s", self.request_id, exc)
            yield messages_error_event(f"the upstream's stream could not be translated: {exc}")
        finally:
            await chunks.aclose()


def error_body(error: GatewayError) -> dict[str, Any]:
    """The gateway's error in Anthropic's shape."""
    other = "api_error" if error.status >= 500 else "invalid_request_error"
    kind = ERROR_TYPES.get(error.status, other)
    return {"type": "error", "error": {"type": kind, "message": error.message}}


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
    """The key from `x-api-key` unless an Authorization header is sent."""
    key = request.headers.get("x-api-key")
    authorization = None if "authorization" in request.headers or not key else f"Bearer {key}"
    return await bridge(request, MessagesTranslation, authorization)
