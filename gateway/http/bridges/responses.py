"""`POST /v1/responses`: OpenAI's Responses API, bridged to chat completions with
litellm's Responses <-> chat translation (`gateway.http.bridges.base`), or sent as it is to
deployments that serve it natively (capability `responses`, `gateway.native`).

The bridge is stateless: `previous_response_id`, `conversation`, `store: true` and
stored `prompt`s need a server that keeps responses, which the gateway is not. A request
using them goes to the route's native deployments only; a route with none refuses it
with a 400 naming the field. So does one with tools other than functions (hosted tools)
or input items other than messages and function calls, which the bridge does not
translate, as do content parts it does not translate (`PARTS`: an image by `file_id`, a
file by `file_url`, unknown types), fields the API does not have (`KNOWN_FIELDS`) and
`include` values asking for what the bridge cannot give (`DROPPED_INCLUDES` are dropped).
Earlier turns' `reasoning` items are dropped: chat has no place for them.
`background: true` is refused everywhere: its answer comes later, unpriced, from an
endpoint the gateway does not serve.

A bridged response object (the reply, and every event carrying one) says what the
bridge did: `store: false` (it keeps nothing) and the request's `parallel_tool_calls`
(true unless sent false).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import InvalidRequest
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
    is_objects,
    is_token_limit,
    optional,
    refuse,
    unbridged_top_field,
)
from gateway.http.validation import show
from gateway.native import NativeCall
from gateway.native.formats import responses_error_event

log = logging.getLogger(__name__)

# field -> is its value a use of stored state (which only a native deployment keeps)
STATEFUL: Mapping[str, Check] = {
    "previous_response_id": lambda v: v is not None,
    "conversation": lambda v: v is not None,
    "store": lambda v: v is True,
    "prompt": lambda v: v is not None,
}
# Sent to native deployments only, never to litellm's translation.
NATIVE_FIELDS = ("background", *STATEFUL)
FIELDS: Mapping[str, tuple[Check, str]] = {
    "background": (optional(lambda v: isinstance(v, bool)), "a boolean"),
    "instructions": (optional(lambda v: isinstance(v, str)), "a string"),
    "max_output_tokens": (optional(is_token_limit), MAX_TOKENS_FORM),
    "temperature": (between(0, 2), "a number in [0, 2]"),
    "top_p": (between(0, 1), "a number in [0, 1]"),
    "stream": (optional(lambda v: isinstance(v, bool)), "a boolean"),
    "parallel_tool_calls": (optional(lambda v: isinstance(v, bool)), "a boolean"),
    "user": (optional(lambda v: isinstance(v, str)), "a string"),
    "tools": (optional(is_objects), "an array of objects"),
    "text": (optional(lambda v: isinstance(v, dict)), "an object"),
    "reasoning": (optional(lambda v: isinstance(v, dict)), "an object"),
    "metadata": (optional(lambda v: isinstance(v, dict)), "an object"),
    "include": (
        optional(lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v)),
        "an array of strings",
    ),
    "prompt_cache_key": (optional(lambda v: isinstance(v, str)), "a string"),
    "prompt_cache_retention": (optional(lambda v: isinstance(v, str)), "a string"),
    "safety_identifier": (optional(lambda v: isinstance(v, str)), "a string"),
    "tool_choice": (
        optional(lambda v: v in ("none", "auto", "required") or isinstance(v, dict)),
        '"none", "auto", "required" or an object',
    ),
}
# Every top-level field of the Responses API: the bridge refuses others (unknown to the API),
# which only a native deployment may judge. Known ones it does not translate are dropped,
# but for those that shape the answer (`UNTRANSLATED`), which only a native one may serve.
KNOWN_FIELDS = frozenset(
    {
        *FIELDS,
        *STATEFUL,
        *("model", "input", "truncation", "service_tier", "max_tool_calls", "top_logprobs"),
        *("stream_options", "context_management", "prompt_cache_options"),
        *("background_options", "moderation", "image", "access_programs"),
    }
)
# field -> whether its value asks for what the bridge cannot give: token logprobs, a bound
# on tool calls (`include`: by value, `unbridged_include`)
UNTRANSLATED: Mapping[str, Callable[[Any], bool]] = {
    "top_logprobs": lambda v: v is not None,
    "max_tool_calls": lambda v: v is not None,
}
# `include` values the bridge drops: extra output it cannot give, without which the answer
# means the same (hosted tools' results, never bridged; input image URLs echoed; encrypted
# reasoning, which a chat deployment does not return and later turns may leave out). The
# others need a native deployment: token logprobs (an answer without them would read as
# having none; litellm does not translate them back) and values the bridge does not know.
DROPPED_INCLUDES = frozenset(
    {
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "code_interpreter_call.outputs",
        "computer_call_output.output.image_url",
        "message.input_image.image_url",
        "reasoning.encrypted_content",
    }
)
# Responses fields chat completions take too, passed on as the chat path passes vendor
# fields (litellm's providers drop them, as they do a chat request's).
CHAT_PASSED = ("prompt_cache_key", "prompt_cache_retention", "safety_identifier")
# content part type -> the field it must have to be translated (litellm's translation turns
# an image by `file_id` into an empty image URL, a `file_url` into a file id)
PARTS: Mapping[str, tuple[str, ...]] = {
    "input_text": (),
    "output_text": (),
    "refusal": (),
    "input_image": ("image_url",),
    "input_file": ("file_data", "file_id"),
}
NOT_BRIDGED = "not supported on this route (bridged to an OpenAI-style deployment)"
ROLES = ("user", "assistant", "system", "developer")
FORMATS = ("text", "json_object", "json_schema")
# input item type -> its string fields: the items the bridge translates (others, as
# tools other than functions, need a native deployment)
ITEM_FIELDS: Mapping[str, tuple[str, ...]] = {
    "message": ("role",),
    "function_call": ("call_id", "name", "arguments"),
    "function_call_output": ("call_id",),
    "reasoning": (),
}


class ResponsesTranslation(Translation):
    surface = "Responses API"
    wire = "responses"
    input_field = "input"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.input = without_reasoning(self.body["input"])
        # The optional parameters, as litellm's translation reads (and echoes) them;
        # stored state is for native deployments, never looked up by litellm.
        self.params = {
            k: v for k, v in self.body.items() if k not in ("model", "input", *NATIVE_FIELDS)
        }
        self.id = "resp_" + self.request_id.removeprefix("req_")
        self.required_by: str | None = stateful_field(self.body)
        if self.required_by is None and (unbridged := unbridged_field(self.body)) is not None:
            self.required_by, self.why_native = unbridged
            # The chat form only routes and holds budget: what the bridge translates.
            self.input, self.params = bridged_only(self.input, self.params)

    def native_call(self, headers: Mapping[str, str]) -> NativeCall:
        return NativeCall(self.wire, self.body, required_by=self.required_by)

    @staticmethod
    def check(body: dict[str, Any]) -> None:
        check_fields(body, FIELDS)
        if body.get("background") is True:  # answered later, unpriced, by GET /responses/{id}
            raise refuse("background", "the gateway does not run background responses")
        _check_input(body)
        for i, tool in enumerate(body.get("tools") or []):
            kind = tool.get("type")
            expect(isinstance(kind, str), f"tools[{i}].type", "a string", kind)
            if kind != "function":
                continue  # a hosted tool: for native deployments (`unbridged_field`)
            expect(
                is_function_name(tool.get("name")),
                f"tools[{i}].name",
                "a name of up to 64 letters, digits, '_' or '-'",
                tool.get("name"),
            )
        _check_format((body.get("text") or {}).get("format"))

    def chat_body(self) -> dict[str, Any]:
        chat = self.lib.responses.transform_responses_api_request_to_chat_completion_request(
            model=self.model,
            input=self.input,
            responses_api_request=self.params,
            custom_llm_provider="openai",
            stream=self.stream,
        )
        body = chat_form(chat, self.model)
        body.update({k: self.params[k] for k in CHAT_PASSED if self.params.get(k) is not None})
        return body

    def reply(self, chat: dict[str, Any]) -> dict[str, Any]:
        response = self.lib.responses.transform_chat_completion_response_to_responses_api_response(
            request_input=self.input,
            responses_api_request=self.params,
            chat_completion_response=chat,
        )
        body: dict[str, Any] = plain(response)
        return self.echo(body)

    def echo(self, response: dict[str, Any]) -> dict[str, Any]:
        """A bridged response object as this request's: its id, and the settings the
        bridge served (litellm's events say `store: true` and `parallel_tool_calls` as
        they please)."""
        response["id"] = self.id
        response["store"] = False  # `store: true` never reaches the bridge
        response["parallel_tool_calls"] = self.body.get("parallel_tool_calls") is not False
        return response

    async def events(self, chunks: ChunkSource) -> AsyncIterator[bytes]:
        sequence = 0
        try:
            stream = self.lib.responses_stream(
                model=await self.answering_model(chunks),
                litellm_custom_stream_wrapper=chunks,
                request_input=self.input,
                responses_api_request=self.params,
                custom_llm_provider="openai",
            )
            async for event in stream:
                data = plain(event)
                if isinstance(data.get("response"), dict):
                    self.echo(data["response"])
                data["sequence_number"] = sequence
                sequence += 1
                yield sse(data["type"], data)
        except StreamFailed as failed:
            yield responses_error_event(str(failed), sequence)
        except Exception as exc:  # litellm's translation of the upstream's stream
            log.warning("Responses stream %s not translated: %s", self.request_id, exc)
            yield responses_error_event(
                f"the upstream's stream could not be translated: {exc}", sequence
            )
        finally:
            await chunks.aclose()


def stateful_field(body: Mapping[str, Any]) -> str | None:
    """The first field of `body` that uses stored state, which the bridge cannot serve."""
    return next((name for name, uses in STATEFUL.items() if uses(body.get(name))), None)


def unbridged_field(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first field, tool, input item or content part the bridge does not translate,
    and why."""
    if found := unbridged_top_field(body, KNOWN_FIELDS, UNTRANSLATED, "Responses API"):
        return found
    if found := unbridged_include(body.get("include") or []):
        return found
    for i, tool in enumerate(body.get("tools") or []):
        if tool["type"] != "function":
            return f"tools[{i}].type", "only function tools are bridged to chat"
    items = body["input"]
    for i, item in enumerate(items if isinstance(items, list) else []):
        if (kind := item.get("type", "message")) not in ITEM_FIELDS:
            return f"input[{i}].type", f"'{kind}' items are not bridged to chat"
        content = item.get("content") if kind == "message" else None
        for j, part in enumerate(content if isinstance(content, list) else []):
            if (found := unbridged_part(part)) is not None:
                field, why = found
                return f"input[{i}].content[{j}].{field}", why
    return None


def unbridged_include(values: list[str]) -> tuple[str, str] | None:
    """The first `include` value asking for output the bridge cannot give, and why."""
    for i, value in enumerate(values):
        if value not in DROPPED_INCLUDES:
            return f"include[{i}]", f"{show(value)} is not produced for an OpenAI-style deployment"
    return None


def unbridged_part(part: Mapping[str, Any]) -> tuple[str, str] | None:
    """The field of a message's content part that the bridge cannot translate, and why."""
    kind = part.get("type")
    if not isinstance(kind, str) or kind not in PARTS:
        return "type", f"{show(kind)} content parts are {NOT_BRIDGED}"
    fields = PARTS[kind]
    if not fields or any(isinstance(part.get(f), str) and part[f] for f in fields):
        return None
    other = next((f for f in part if f not in ("type", "detail", "filename")), None)
    field = other or fields[0]
    instead = " or ".join(fields)
    return field, f"{kind} parts by '{field}' (not {instead}) are {NOT_BRIDGED}"


def without_reasoning(items: Any) -> Any:
    """The input without earlier turns' `reasoning` items: chat has no place for them (an
    OpenAI chat model never sees its earlier reasoning), and litellm would leave an empty
    assistant message where one stood alone."""
    if not isinstance(items, list):
        return items
    return [i for i in items if i.get("type") != "reasoning"]


def bridged_only(items: Any, params: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The input and parameters without what the bridge does not translate."""
    if isinstance(items, list):
        items = [_bridged(i) for i in items if i.get("type", "message") in ITEM_FIELDS] or ""
    tools = [t for t in params.get("tools") or [] if t["type"] == "function"]
    choice = params.get("tool_choice")
    params = {k: v for k, v in params.items() if k not in ("tools", "tool_choice")}
    if tools:
        params["tools"] = tools
        if choice is not None and (
            not isinstance(choice, dict) or choice.get("type") == "function"
        ):
            params["tool_choice"] = choice  # not one naming a hosted tool
    return items, params


def _bridged(item: dict[str, Any]) -> dict[str, Any]:
    """An input item for the chat form, which only routing and budgets read: a part it
    does not translate as its JSON (the request needs a native deployment)."""
    content = item.get("content")
    if item.get("type", "message") != "message" or not isinstance(content, list):
        return item
    parts = [
        p if unbridged_part(p) is None else {"type": "input_text", "text": orjson.dumps(p).decode()}
        for p in content
    ]
    return {**item, "content": parts}


def _check_input(body: dict[str, Any]) -> None:
    if "input" not in body:
        raise InvalidRequest("'input' is required", param="input")
    items = body["input"]
    if isinstance(items, str) and items:
        return
    expect(
        is_objects(items) and bool(items), "input", "a non-empty string or array of items", items
    )
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        expect(isinstance(kind, str), f"input[{i}].type", "a string", kind)
        for name in ITEM_FIELDS.get(kind, ()):  # others: for native deployments
            expect(
                isinstance(item.get(name), str), f"input[{i}].{name}", "a string", item.get(name)
            )
        if kind == "message":
            expect(
                item["role"] in ROLES,
                f"input[{i}].role",
                f"one of {', '.join(ROLES)}",
                item["role"],
            )
            content = item.get("content")
            ok = isinstance(content, str) or is_objects(content)
            expect(ok, f"input[{i}].content", "a string or an array of parts", content)


def _check_format(form: Any) -> None:
    if form is None:
        return
    expect(isinstance(form, dict), "text.format", "an object", form)
    kind = form.get("type")
    expect(kind in FORMATS, "text.format.type", f"one of {', '.join(FORMATS)}", kind)
    if kind == "json_schema":
        expect(isinstance(form.get("name"), str), "text.format.name", "a string", form.get("name"))
        schema = form.get("schema")
        expect(isinstance(schema, dict), "text.format.schema", "an object", schema)


async def create_response(request: Request) -> Response:
    return await bridge(request, ResponsesTranslation)
