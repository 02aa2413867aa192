"""Upstream calls to providers that do not speak OpenAI's API (Anthropic, Bedrock, ...),
translated both ways by litellm.

    client = LiteLLMClient()
    reply = await client.complete(target, "chat", {"messages": [...]})
    async for payload in client.stream(target, "chat", body): ...
    await client.close()

litellm is imported on the first call (or by `preload()`), in a worker thread, because
the import costs ~4 s of CPU. Only OpenAI chat parameters from `CHAT_PARAMS` reach it:
litellm reads many other keyword arguments as its own settings (`api_base`,
`mock_response`, `aws_*`, credentials), so an unchecked client field could redirect a
request, with our key, to another host. Fields outside the table are dropped (and
logged at debug level); `completions` is not offered for these providers.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
import os
import re
import warnings
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import httpx
import orjson
import pydantic

from gateway.upstreams.base import (
    EndpointType,
    UpstreamConnectFailed,
    UpstreamFailure,
    UpstreamReply,
    UpstreamStatus,
    UpstreamTarget,
    UpstreamTimedOut,
    UpstreamUnsupported,
    messages_url,
    retry_after,
)
from gateway.upstreams.error_bodies import HTML_PREFIX_BYTES, html_note

log = logging.getLogger(__name__)

# Set (unless already set) before litellm is imported. Without the first three litellm
# fetches its price map from GitHub at import, and a cost call on some model names
# fetches a tokenizer from the Hugging Face hub, blocking ~24 s where the network is
# closed. Without LITELLM_MODE, its import runs `dotenv.load_dotenv()`, copying a
# `.env` found above litellm's install directory (the repo root, for an in-repo venv)
# into os.environ, around our settings and the tests' environment isolation.
IMPORT_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_OFFLINE_MODE": "true",
    "HF_HUB_OFFLINE": "1",
    "LITELLM_MODE": "PRODUCTION",
}

# litellm's import silences this pydantic warning with a process-wide filter, which a
# test runner's per-test warning state undoes; its models are built under it instead.
READONLY_WARNING = ".*`ReadOnly` qualifier.*"

# OpenAI chat parameters (plus `thinking` and `top_k`, which litellm maps per provider)
# passed to litellm; everything else in the body is dropped. See the module docstring.
CHAT_PARAMS = frozenset(
    {
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "messages",
        "modalities",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "reasoning_effort",
        "response_format",
        "seed",
        "service_tier",
        "stop",
        "temperature",
        "thinking",
        "tool_choice",
        "tools",
        "top_k",
        "top_logprobs",
        "top_p",
        "user",
        "web_search_options",
    }
)
EMBEDDING_PARAMS = frozenset({"input", "dimensions", "encoding_format", "user"})

# Body fields the client sets itself, never worth a "dropped" log line.
OWN_FIELDS = frozenset({"model", "stream", "stream_options"})

# Providers whose litellm handler accepts our `AsyncHTTPHandler` (`client=`). Others
# (OpenAI-SDK based ones) need an SDK client there; they use litellm's cached clients.
OWN_CLIENT_PROVIDERS = frozenset({"anthropic"})

# max_tokens sent when the client gives none, for providers that require one.
DEFAULT_MAX_TOKENS: dict[str, int] = {"anthropic": 4096}

# Message and delta fields litellm adds that are not OpenAI's.
LITELLM_ONLY_FIELDS = frozenset({"provider_specific_fields", "thinking_blocks", "citations"})

# litellm's `UnsupportedParamsError` names what the provider lacks in one of these forms
# ("anthropic does not support parameters: ['n', 'seed'], for model=...", "Setting
# `seed` is not supported by ..."), then advises on its own settings and proxy, which
# mean nothing to our clients: only the names are kept.
# The names come as a list, a dict of the values sent, backticked or bare.
UNSUPPORTED_NAMES = re.compile(
    r"does not support parameters: (.+?)(?:, for model=|$)|Setting (.+?) is not supported",
    re.DOTALL,
)
QUOTED_KEY = re.compile(r"""['"]([^'"]+)['"]\s*:""")
QUOTED_NAME = re.compile(r"""['"`]([^'"`]+)['"`]""")
BARE_NAME = re.compile(r"[A-Za-z_]\w*")
LITELLM_ADVICE = re.compile(r"\s*(To drop|If you want to use these params)\b.*", re.DOTALL)

HTML_IN_TEXT = re.compile(r"<(!doctype\s+html|html)\b", re.IGNORECASE)
MAX_MESSAGE_CHARS = 500
MAX_CHAIN = 16  # exceptions searched for the transport error under a litellm one


@functools.cache
def _import_litellm() -> Any:
    """Import and configure litellm once (blocking; call through `_litellm()`)."""
    for name, value in IMPORT_ENV.items():
        os.environ.setdefault(name, value)
    litellm: Any = importlib.import_module("litellm")
    _build_response_models(importlib.import_module("litellm.types.utils"))
    litellm.suppress_debug_info = True  # no "Give Feedback / Get Help" prints on errors
    litellm.set_verbose = False
    # Never drop an unsupported parameter silently (without `n` or `logprobs` the answer
    # changes shape): litellm refuses it, and the next deployment is tried instead.
    litellm.drop_params = False
    litellm.disable_aiohttp_transport = True  # plain httpx: one transport, closable
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
        logging.getLogger(name).setLevel(logging.WARNING)  # its DEBUG logs carry payloads
    return litellm


def _build_response_models(module: Any) -> None:
    """Build litellm's lazily-built response models now, off the request path, with
    pydantic's one-time `ReadOnly` warning silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=READONLY_WARNING, category=UserWarning)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, pydantic.BaseModel)
                and value.__module__ == module.__name__
                and not value.__pydantic_complete__
            ):
                value.model_rebuild()


async def _litellm() -> Any:
    """The litellm module, imported off the event loop the first time."""
    if _import_litellm.cache_info().currsize:
        return _import_litellm()
    return await asyncio.to_thread(_import_litellm)


# Public for the format bridges (gateway.http.bridges), which use litellm's translations.
load_litellm = _litellm


class LiteLLMClient:
    """`UpstreamClient` for every litellm provider; one per application.

    It owns the HTTP connection pools it hands to litellm (one per connect timeout),
    so `close()` releases them in the event loop that opened them."""

    def __init__(self) -> None:
        self._handlers: dict[float, Any] = {}

    async def preload(self) -> None:
        """Import litellm now rather than on the first request."""
        await _litellm()

    async def complete(
        self, target: UpstreamTarget, endpoint: EndpointType, body: dict[str, Any]
    ) -> UpstreamReply:
        """One non-streaming chat (or embeddings) call. Raises UpstreamFailure."""
        litellm = await _litellm()
        if endpoint == "embeddings":
            kwargs = self._call_kwargs(target, body, EMBEDDING_PARAMS, target.answer_wait_s)
            embedding = await _call(target, litellm.aembedding(**kwargs))
            return UpstreamReply(body=embedding_body(embedding.model_dump()))
        _require_chat(target, endpoint)
        response = await _call(target, litellm.acompletion(**self._chat_kwargs(target, body)))
        return UpstreamReply(body=chat_body(response.model_dump()))

    async def stream(
        self, target: UpstreamTarget, endpoint: EndpointType, body: dict[str, Any]
    ) -> AsyncIterator[list[bytes]]:
        """Stream a chat call as OpenAI chunk JSON payloads. litellm is always asked for
        usage, so the last payload carries it (the caller strips it if not wanted)."""
        _require_chat(target, endpoint)
        litellm = await _litellm()
        kwargs = self._chat_kwargs(target, body, stream=True)
        chunks = await _call(target, litellm.acompletion(**kwargs))
        try:
            while True:
                try:
                    chunk = await _call(target, anext(chunks))
                except StopAsyncIteration:
                    return
                yield [orjson.dumps(chunk_body(chunk.model_dump()))]
        finally:
            await chunks.aclose()  # releases the connection when the caller stops early

    async def close(self) -> None:
        """Close the connection pools (ours, and litellm's cached ones if it was used)."""
        handlers, self._handlers = list(self._handlers.values()), {}
        for handler in handlers:
            await handler.close()
        if _import_litellm.cache_info().currsize:
            cleanup = importlib.import_module("litellm.llms.custom_httpx.async_client_cleanup")
            await cleanup.close_litellm_async_clients()

    def _chat_kwargs(
        self, target: UpstreamTarget, body: dict[str, Any], *, stream: bool = False
    ) -> dict[str, Any]:
        # A non-streamed answer comes whole, at the end: waited for as long as the target
        # says, not the per-read `timeout_s` a stream's events each have.
        wait_s = target.timeout_s if stream else target.answer_wait_s
        kwargs = self._call_kwargs(target, body, CHAT_PARAMS, wait_s)
        default_max = DEFAULT_MAX_TOKENS.get(target.provider)
        if default_max is not None and not {"max_tokens", "max_completion_tokens"} & set(kwargs):
            # Anthropic requires max_tokens; litellm would fill in the model's maximum
            # (128000 for names missing from its map), which the real API rejects.
            kwargs["max_tokens"] = default_max
        if stream:
            kwargs.update(stream=True, stream_options={"include_usage": True})
        return kwargs

    def _call_kwargs(
        self,
        target: UpstreamTarget,
        body: Mapping[str, Any],
        allowed: frozenset[str],
        timeout_s: float,
    ) -> dict[str, Any]:
        """litellm's keyword arguments: the allowed body fields plus the target's settings,
        with `timeout_s` for litellm's `timeout` (its reads', connect capped apart)."""
        dropped = sorted(set(body) - allowed - OWN_FIELDS)
        if dropped:
            log.debug("%s: fields not passed to litellm: %s", target.deployment, dropped)
        kwargs = {name: value for name, value in body.items() if name in allowed}
        kwargs.update(
            model=f"{target.provider}/{target.model}",
            api_base=_api_base(target),
            api_key=target.api_key,
            timeout=timeout_s,
            num_retries=0,  # the gateway's executor owns retries and fallback
            max_retries=0,
        )
        if target.headers:
            kwargs["extra_headers"] = dict(target.headers)
        if target.provider in OWN_CLIENT_PROVIDERS:
            kwargs["client"] = self._handler(target.connect_timeout_s)
        return kwargs

    def _handler(self, connect_timeout_s: float) -> Any:
        """litellm's HTTP handler over our httpx transport, one per connect timeout."""
        handler = self._handlers.get(connect_timeout_s)
        if handler is None:
            module = importlib.import_module("litellm.llms.custom_httpx.http_handler")
            transport = _ConnectTimeoutTransport(connect_timeout_s)
            handler = module.AsyncHTTPHandler(transport=transport, follow_redirects=False)
            self._handlers[connect_timeout_s] = handler
        return handler


class _ConnectTimeoutTransport(httpx.AsyncHTTPTransport):
    """Caps the connect phase: litellm turns an `httpx.Timeout` into one float for most
    providers, so the deployment's connect timeout is applied here instead."""

    def __init__(self, connect_timeout_s: float) -> None:
        super().__init__()
        self._connect_timeout_s = connect_timeout_s

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = dict(request.extensions.get("timeout") or {})
        connect = timeouts.get("connect")
        if connect is None or connect > self._connect_timeout_s:
            timeouts["connect"] = self._connect_timeout_s
        request.extensions["timeout"] = timeouts
        return await super().handle_async_request(request)


def _api_base(target: UpstreamTarget) -> str | None:
    """The base litellm is given. An Anthropic deployment's is its Messages endpoint,
    which litellm takes as it is: given a `/v1` base (as the native Messages calls
    accept) it would ask `/v1/v1/messages`."""
    if target.provider == "anthropic" and target.api_base:
        return messages_url(target.api_base)
    return target.api_base


def _require_chat(target: UpstreamTarget, endpoint: EndpointType) -> None:
    if endpoint != "chat":
        raise UpstreamStatus(
            f"deployment '{target.deployment}': the {endpoint} endpoint is not supported by "
            f"provider '{target.provider}' (through litellm only chat and embeddings are)",
            status=501,  # not the client's fault: the executor moves to the next deployment
        )


async def _call(target: UpstreamTarget, awaitable: Any) -> Any:
    """Await a litellm call, translating its failures into `UpstreamFailure`s."""
    try:
        return await awaitable
    except (StopAsyncIteration, UpstreamFailure):
        raise
    except Exception as exc:
        raise translate_error(target, exc) from exc


def translate_error(target: UpstreamTarget, exc: Exception) -> UpstreamFailure:
    """The `UpstreamFailure` for one litellm (or httpx) exception.

    litellm reports transport failures inconsistently (a refused connection is an
    `InternalServerError` 500, a mid-stream reset a `MidStreamFallbackError`), so the
    exception's chain is searched for the transport error first; the HTTP status
    decides only when the upstream really answered. A parameter the provider does not
    support is refused by litellm before any call: `UpstreamUnsupported`."""
    text = target.redact(str(exc))  # a provider's error may quote the key it was sent
    message = f"deployment '{target.deployment}': {type(exc).__name__}: {_short(text)}"
    chain = _chain(exc)
    refusal = next((c for c in chain if type(c).__name__ == "UnsupportedParamsError"), None)
    if refusal is not None:
        return unsupported(target, refusal)
    unreachable = f"cannot connect to deployment '{target.deployment}'"
    for cause in chain:
        if isinstance(cause, httpx.ConnectError | httpx.ConnectTimeout):
            return UpstreamConnectFailed(unreachable, detail=message)
        if isinstance(cause, httpx.TimeoutException) or type(cause).__name__ == "Timeout":
            return UpstreamTimedOut(message)
        if isinstance(cause, httpx.TransportError) or type(cause).__name__ == "APIConnectionError":
            return UpstreamConnectFailed(unreachable, detail=message)
    # The upstream's own response, when litellm kept it, has the true status (529 stays
    # 529 rather than litellm's 500) and the Retry-After header.
    answered = next((c for c in chain if isinstance(c, httpx.HTTPStatusError)), None)
    status = answered.response.status_code if answered else getattr(exc, "status_code", None)
    if isinstance(status, int) and 400 <= status <= 599:
        headers = answered.response.headers if answered else _headers(exc)
        return UpstreamStatus(
            message, status=status, retry_after_s=retry_after(headers), body=_error_body(text)
        )
    log.warning("%s: unexpected litellm failure", target.deployment, exc_info=exc)
    return UpstreamFailure(message)


def unsupported(target: UpstreamTarget, exc: BaseException) -> UpstreamUnsupported:
    """The failure for litellm's `UnsupportedParamsError`, in our words: the parameter
    names it gives, without its advice (`drop_params`, its proxy's settings)."""
    text = str(getattr(exc, "message", "") or exc).removeprefix("litellm.UnsupportedParamsError: ")
    params = unsupported_params(text)
    if params:
        what = f"parameters: {', '.join(params)}"
    else:  # a form without names: its own sentence, advice cut off
        what = f"this request: {_short(LITELLM_ADVICE.sub('', text))}"
    return UpstreamUnsupported(
        f"deployment '{target.deployment}' (provider '{target.provider}') does not support {what}",
        deployment=target.deployment,
        provider=target.provider,
        params=params,
    )


def unsupported_params(text: str) -> tuple[str, ...]:
    """The parameter names in an `UnsupportedParamsError` message, in its order."""
    found = UNSUPPORTED_NAMES.search(text)
    if found is None:
        return ()
    named = (found.group(1) or found.group(2)).strip()
    if named.startswith("{"):  # {'dimensions': 256}: the keys
        return tuple(QUOTED_KEY.findall(named))
    if named[:1] in "['\"`":
        return tuple(QUOTED_NAME.findall(named))
    bare = [name.strip() for name in named.split(",")]  # "tools, tool_choice"
    return tuple(bare) if all(BARE_NAME.fullmatch(name) for name in bare) else ()


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception, the one litellm wrapped (`original_exception`), and their causes."""
    seen: list[BaseException] = []
    pending: list[BaseException | None] = [exc]
    while pending and len(seen) < MAX_CHAIN:
        current = pending.pop(0)
        if current is None or any(current is known for known in seen):
            continue
        seen.append(current)
        pending += [
            getattr(current, "original_exception", None),
            current.__cause__,
            current.__context__,
        ]
    return seen


def _headers(exc: Exception) -> Mapping[str, str] | None:
    response_headers = getattr(getattr(exc, "response", None), "headers", None)
    return response_headers or getattr(exc, "litellm_response_headers", None)


def _error_body(text: str) -> Any:
    """The upstream's error JSON, which litellm keeps only inside its message."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return None
    try:
        return orjson.loads(text[start : end + 1])
    except orjson.JSONDecodeError:
        return None


def _short(text: str) -> str:
    """`text` cut to `MAX_MESSAGE_CHARS`, an HTML page in it (a proxy's error page that
    litellm quotes) reduced to its title."""
    page = HTML_IN_TEXT.search(text)
    if page is not None:
        start = page.start()
        text = text[:start] + html_note(text[start : start + HTML_PREFIX_BYTES].encode())
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + "..."


def chat_body(raw: dict[str, Any]) -> dict[str, Any]:
    """litellm's ModelResponse dump as OpenAI's `chat.completion` object."""
    return _choices_body(raw, "chat.completion", "message", _message)


def chunk_body(raw: dict[str, Any]) -> dict[str, Any]:
    """litellm's stream chunk dump as OpenAI's `chat.completion.chunk` object."""
    return _choices_body(raw, "chat.completion.chunk", "delta", _delta)


def _choices_body(
    raw: dict[str, Any],
    obj: str,
    key: str,
    convert: Callable[[dict[str, Any]], dict[str, Any]],
) -> dict[str, Any]:
    body = _envelope(raw, obj)
    body["choices"] = [
        {
            "index": choice.get("index", index),
            key: convert(choice.get(key) or {}),
            "logprobs": choice.get("logprobs"),
            "finish_reason": choice.get("finish_reason"),
        }
        for index, choice in enumerate(raw.get("choices") or [])
    ]
    if raw.get("usage"):
        body["usage"] = _usage(raw["usage"])
    return body


def _usage(raw: dict[str, Any]) -> dict[str, Any]:
    """The usage as the upstream counted it, less litellm's `cost`: its list price, not
    what the gateway charges (`x-cascade-cost-usd`, the ledger), so a client reading it
    would be misled."""
    return {k: v for k, v in _without_none(raw).items() if k != "cost"}


def embedding_body(raw: dict[str, Any]) -> dict[str, Any]:
    """litellm's EmbeddingResponse dump as OpenAI's embeddings list."""
    body: dict[str, Any] = {
        "object": "list",
        "data": raw.get("data") or [],
        "model": raw.get("model"),
    }
    if raw.get("usage"):
        body["usage"] = _usage(raw["usage"])
    return body


def _envelope(raw: dict[str, Any], obj: str) -> dict[str, Any]:
    body = {
        "id": raw.get("id"),
        "object": obj,
        "created": raw.get("created"),
        "model": raw.get("model"),
    }
    if raw.get("system_fingerprint"):
        body["system_fingerprint"] = raw["system_fingerprint"]
    return body


def _message(raw: dict[str, Any]) -> dict[str, Any]:
    message = {"role": raw.get("role") or "assistant", "content": raw.get("content")}
    for name, value in raw.items():
        if name not in message and name not in LITELLM_ONLY_FIELDS and value is not None:
            message[name] = value
    return message


def _delta(raw: dict[str, Any]) -> dict[str, Any]:
    return {
        name: value
        for name, value in raw.items()
        if value is not None and name not in LITELLM_ONLY_FIELDS
    }


def _without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    return value
