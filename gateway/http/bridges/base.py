"""What the format bridges share: a request in another API's format is translated to a
chat completion with litellm's own translation code, sent through the chat pipeline
(`Proxy.handle` with endpoint "chat": auth, routing, limits, budgets, SLA, cascade and
ledger as for chat), and the chat answer or chat SSE stream translated back.

Deployments that serve the API's wire format natively (`gateway.native`) get the
client's body instead, and their answer reaches the client as it came: the pipeline
names the deployment that answered (`x-cascade-deployment`), which says which it was.

    return await bridge(request, ResponsesTranslation)

litellm (~4 s to import) is loaded off the event loop on the first bridged request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib
import logging
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from gateway.billing.tokens import count_prompt_off_loop
from gateway.errors import CapabilityUnavailable, InvalidRequest, UpstreamError
from gateway.http.endpoints import arrival, checked, client_gone, label_route
from gateway.http.validation import parse_body, parse_object
from gateway.native import NativeCall, NativeSurface
from gateway.runtime import Runtime
from gateway.upstreams.litellm_impl import load_litellm

log = logging.getLogger(__name__)

SSE = "text/event-stream"
# What a translated request may send upstream: OpenAI chat fields. litellm's translations
# also return its own settings (`custom_llm_provider`, `extra_headers`, `metadata`, ...).
CHAT_FIELDS = frozenset(
    {
        "model",
        "messages",
        "stream",
        "stream_options",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "stop",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "reasoning_effort",
        "service_tier",
        "user",
    }
)
# The fields of a chat message an OpenAI-compatible upstream takes; litellm adds its own
# (`thinking_blocks`, `provider_specific_fields`, `cache_control`, a tool call's `index`).
MESSAGE_FIELDS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id", "refusal"})
TOOL_CALL_FIELDS = frozenset({"id", "type", "function"})


@dataclass(frozen=True, slots=True)
class Library:
    """The litellm classes the bridges use."""

    responses: Any  # LiteLLMCompletionResponsesConfig: Responses <-> chat
    responses_stream: Any  # LiteLLMCompletionStreamingIterator: chat chunks -> events
    messages: Any  # a LiteLLMAnthropicMessagesAdapter: Anthropic Messages <-> chat
    messages_stream: Any  # AnthropicStreamWrapper: chat chunks -> Anthropic events
    model_response: Any  # litellm's ModelResponse (a chat completion)
    chunk: Any  # litellm's ModelResponseStream (a chat completion chunk)


@functools.cache
def _import_library() -> Library:
    def module(name: str) -> Any:
        return importlib.import_module(name)

    responses = "litellm.responses.litellm_completion_transformation"
    messages = "litellm.llms.anthropic.messages.adapters"
    types = module("litellm.types.utils")
    return Library(
        responses=module(f"{responses}.transformation").LiteLLMCompletionResponsesConfig,
        responses_stream=module(
            f"{responses}.streaming_iterator"
        ).LiteLLMCompletionStreamingIterator,
        messages=module(f"{messages}.transformation").LiteLLMAnthropicMessagesAdapter(),
        messages_stream=module(f"{messages}.streaming_iterator").AnthropicStreamWrapper,
        model_response=types.ModelResponse,
        chunk=types.ModelResponseStream,
    )


async def library() -> Library:
    await load_litellm()  # configured once, as for upstream calls
    if _import_library.cache_info().currsize:
        return _import_library()
    return await asyncio.to_thread(_import_library)


class Translation:
    """One request of a bridged API: its chat form, and its answer translated back."""

    surface: ClassVar[str]  # the API's name, for messages
    wire: ClassVar[NativeSurface]  # its wire format: the capability serving it natively
    input_field: ClassVar[str]  # the field that becomes `messages`
    why_native = ""  # why its `required_by` field needs a native deployment, for the 400

    def __init__(self, lib: Library, body: dict[str, Any], request_id: str) -> None:
        self.lib, self.body, self.request_id = lib, body, request_id
        self.model: str = body["model"]
        self.stream = bool(body.get("stream"))
        self.chat: dict[str, Any] = {}  # the chat form, once `translated_request` made it
        # The model the prompt is counted as (`prompt_model`): the answering deployment's,
        # once the pipeline answered.
        self.counted_as = self.model

    @staticmethod
    def check(body: dict[str, Any]) -> None:
        """Refuse a body the bridge cannot serve; InvalidRequest names the field."""

    def native_call(self, headers: Mapping[str, str]) -> NativeCall:
        """The request for deployments serving its wire format; `headers`: the
        client's."""
        return NativeCall(self.wire, self.body)

    def chat_body(self) -> dict[str, Any]:
        raise NotImplementedError

    def reply(self, chat: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def events(self, chunks: ChunkSource) -> AsyncIterator[bytes]:
        """The chat stream as this API's SSE events; failures become its error event."""
        raise NotImplementedError

    async def prompt_tokens(self) -> int:
        """The chat prompt's tokens as the gateway counts them for budgets (the upstream
        reports its own count only with its answer)."""
        return await count_prompt_off_loop(self.counted_as, "chat", self.chat)

    async def answering_model(self, chunks: ChunkSource) -> str:
        """The model the upstream names in its first chunk, which the non-streaming
        reply reports too (the stream's first event, sent before any chunk is read,
        would name the route instead); the model asked for when the stream has none.
        Raises StreamFailed for a stream that failed at once."""
        model = getattr(await chunks.peek(), "model", None)
        return model if isinstance(model, str) and model else self.model


class StreamFailed(Exception):
    """The chat stream ended in an in-band error event (its upstream broke)."""


class ChunkSource:
    """A chat SSE stream's payloads as litellm's chunk objects: the shape of litellm's
    stream wrapper that its stream translators read."""

    logging_obj = None  # litellm's per-call logging: the gateway's ledger prices the stream

    def __init__(self, payloads: AsyncIterator[bytes], chunk: Any) -> None:
        self._payloads = payloads
        self._chunk = chunk
        self._peeked: list[Any] = []  # read by `peek`, not yet iterated
        self.reported_usage = False  # whether a chunk read so far carried `usage`

    def __aiter__(self) -> ChunkSource:
        return self

    async def peek(self) -> Any | None:
        """The first chunk not yet iterated, left for `__anext__` (None: the stream is
        over). Raises StreamFailed as `__anext__` would."""
        if not self._peeked:
            try:
                self._peeked.append(await self._read())
            except StopAsyncIteration:
                return None
        return self._peeked[0]

    async def __anext__(self) -> Any:
        if self._peeked:
            return self._peeked.pop(0)
        return await self._read()

    async def _read(self) -> Any:
        event = orjson.loads(await anext(self._payloads))
        if not isinstance(event, dict) or "error" in event:
            error = event.get("error") if isinstance(event, dict) else None
            message = error.get("message") if isinstance(error, dict) else None
            raise StreamFailed(str(message or "the upstream stream failed"))
        self.reported_usage = self.reported_usage or bool(event.get("usage"))
        return self._chunk(**event)

    def bill_failure_after_earlier_rounds(self, earlier: Any) -> None:
        """litellm's billing hook for a failed round: the ledger has priced it."""

    async def aclose(self) -> None:
        await self._payloads.aclose()  # type: ignore[attr-defined]


async def chat_payloads(frames: AsyncIterable[str | bytes | memoryview]) -> AsyncIterator[bytes]:
    """The `data:` payloads of a chat SSE stream, `[DONE]` left out."""
    buffer = b""
    try:
        async for frame in frames:
            buffer += frame.encode() if isinstance(frame, str) else bytes(frame)
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                for line in event.split(b"\n"):
                    if line.startswith(b"data: ") and line != b"data: [DONE]":
                        yield line[6:]
    finally:
        close = getattr(frames, "aclose", None)
        if close is not None:  # the relay settles its stream as it closes
            await close()


async def _once(content: bytes) -> AsyncIterator[bytes]:
    yield content


def sse(event: str, data: Mapping[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data, default=_plain) + b"\n\n"


def _plain(value: Any) -> Any:
    """orjson's fallback for the pydantic objects litellm leaves in its dicts."""
    dump = getattr(value, "model_dump", None)
    if dump is None:
        raise TypeError(f"cannot serialise {type(value).__name__}")
    return dump(mode="json", exclude_none=True)


def plain(value: Any) -> Any:
    """litellm's output (pydantic objects, TypedDicts holding them) as JSON values."""
    return orjson.loads(orjson.dumps(value, default=_plain))


def chat_form(chat: Mapping[str, Any], model: str) -> dict[str, Any]:
    """litellm's chat request as what an OpenAI-compatible upstream takes."""
    body = {k: v for k, v in chat.items() if k in CHAT_FIELDS and v is not None}
    body["model"] = model  # the route or deployment the client named, never rewritten
    body["messages"] = [_message(m) for m in plain(chat.get("messages") or [])]
    # OpenAI's reasoning models (o-series, gpt-5) refuse `max_tokens`; every chat model
    # takes `max_completion_tokens`, which budgets and deployment caps lower as they
    # lower `max_tokens`, and litellm maps per provider.
    if (limit := body.pop("max_tokens", None)) is not None:
        body["max_completion_tokens"] = limit
    return body


def _message(message: Any) -> Any:
    if not isinstance(message, dict):
        return message
    kept = {k: v for k, v in message.items() if k in MESSAGE_FIELDS and v is not None}
    calls = kept.get("tool_calls")
    if isinstance(calls, list):
        kept["tool_calls"] = [
            {k: v for k, v in c.items() if k in TOOL_CALL_FIELDS} if isinstance(c, dict) else c
            for c in calls
        ]
    return kept


def translated_request(translation: Translation) -> dict[str, Any]:
    """The chat body, checked as a chat request is; a body litellm cannot translate, or
    whose translation is no valid chat request, is the client's 400."""
    try:
        chat = translation.chat_body()
        raw = orjson.dumps(chat)
    except InvalidRequest:
        raise
    except Exception as exc:  # litellm's translation of an untrusted body: any failure
        log.debug("%s request not translated", translation.surface, exc_info=True)
        raise InvalidRequest(
            f"the {translation.surface} request could not be translated: {exc}"
        ) from None
    try:
        translation.chat = parse_body(raw, "chat")
        return translation.chat
    except InvalidRequest as error:
        param = error.param
        if param is not None and param.startswith("messages"):
            param = translation.input_field
        raise InvalidRequest(
            f"{error.message} (in the chat request this {translation.surface} request "
            "translates to)",
            param=param,
            code=error.code,
        ) from None


def translated_response(response: Response, translation: Translation) -> Response:
    """The chat pipeline's answer in the bridged API's format, its headers kept."""
    headers = {
        k: v for k, v in response.headers.items() if k not in ("content-length", "content-type")
    }
    if isinstance(response, StreamingResponse):  # relayed: settles as it ends
        chunks = ChunkSource(chat_payloads(response.body_iterator), translation.lib.chunk)
        response.body_iterator = translation.events(chunks)
        return response
    if response.media_type == SSE:  # a cascade's verified answer, as events
        chunks = ChunkSource(chat_payloads(_once(bytes(response.body))), translation.lib.chunk)
        return StreamingResponse(translation.events(chunks), media_type=SSE, headers=headers)
    try:
        content = orjson.dumps(translation.reply(orjson.loads(response.body)), default=_plain)
    except Exception as exc:  # the upstream's answer, through litellm: any failure
        log.warning("%s reply not translated: %s", translation.surface, exc)
        raise UpstreamError(
            f"the upstream's answer could not be translated to the {translation.surface} "
            f"format: {exc}"
        ) from None
    return Response(
        content, status_code=response.status_code, media_type="application/json", headers=headers
    )


async def bridge(
    request: Request, kind: type[Translation], authorization: str | None = None
) -> Response:
    """Serve one request of a bridged API through the chat pipeline."""
    try:
        came = await arrival(request, authorization)
    except ClientDisconnect:
        return client_gone(request)
    runtime = came.runtime
    size = len(came.raw)  # a big body is parsed, checked and translated off the loop
    body = await checked(size, _checked_body, request, runtime, came.raw, kind)
    # The raw bytes are not held through the call (up to the body limit, 20 MiB).
    came = dataclasses.replace(came, raw=b"")
    translation = kind(await library(), body, came.request_id)
    chat = await checked(size, translated_request, translation)
    native = translation.native_call(request.headers)
    try:
        response = await came.services.proxy.handle(
            runtime,
            came.principal,
            "chat",
            chat,
            came.request_id,
            size,
            came.started,
            surface=kind.wire,
            native=native,
        )
    except CapabilityUnavailable as error:
        field = native.required_by
        # Only a lacking native format is the bridge's to explain (not `remote_mcp`).
        if field is None or error.param != field or kind.wire not in error.lacking:
            raise
        why = f"; {translation.why_native}" if translation.why_native else ""
        raise CapabilityUnavailable(
            f"'{field}' needs a deployment that serves the {kind.surface} natively "
            f"(capability '{kind.wire}'{why}): {error.message}",
            param=field,
        ) from None
    if answered_natively(response, native, runtime):
        return response
    translation.counted_as = prompt_model(
        runtime, response.headers.get("x-cascade-deployment", translation.model)
    )
    return translated_response(response, translation)


def _checked_body(
    request: Request, runtime: Runtime, raw: bytes, kind: type[Translation]
) -> dict[str, Any]:
    """The body of a bridged request, parsed and checked (in a worker for a big one)."""
    body = parse_object(raw)
    label_route(request, runtime, requested_model(body))
    kind.check(body)
    return body


def requested_model(body: Mapping[str, Any]) -> str:
    """The body's `model`, which must name something (a route or deployment)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a non-empty string", param="model")
    return model


def prompt_model(runtime: Runtime, name: str) -> str:
    """The model a prompt sent to `name` is counted as, as admission counts it: a
    deployment's upstream model, a route's first deployment's; else `name` itself."""
    route = runtime.routes.get(name)
    deployment = runtime.deployments.get(route.deployments[0] if route is not None else name)
    return deployment.target.model if deployment is not None else name


def answered_natively(response: Response, native: NativeCall, runtime: Runtime) -> bool:
    """Is `response` a native deployment's answer, in the API's own format? Streamed,
    buffered, or a cascade's buffered stream (its events replayed from the reply)."""
    deployment = runtime.deployments.get(response.headers.get("x-cascade-deployment", ""))
    return deployment is not None and native.serves(deployment)
