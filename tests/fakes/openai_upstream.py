"""A local server speaking OpenAI's HTTP API, with knobs for latency, errors and stalls.

    with FakeOpenAI() as fake:              # or fake.start() ... fake.stop()
        fake.reply_text = "Paris."
        fake.fail(503, times=1, retry_after="2")
        httpx.post(f"{fake.url}/chat/completions", json={...})
        assert fake.requests[-1]["body"]["model"] == "gpt-4o-mini"

`FakeServer` (also the base of `FakeAnthropic`) runs a Starlette app under uvicorn in
a background thread on a free loopback port. Each request takes its `Behaviour` from
the next scripted entry (`script(...)`) or, when none is queued, from the knob
attributes of the same names. Usage is deterministic: prompt tokens are the words of
the prompt (structured parts such as images, and tool schemas, by their JSON size at 4
characters a token, as providers bill them; token ids one each), completion tokens are
the words of the reply (or `tokens` when set), for each answer (`n` per prompt).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import math
import random
import re
import socket
import struct
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, fields
from types import TracebackType
from typing import Any, Self

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

DEFAULT_REPLY = "Hello! This is a fake upstream answering your request."
DEFAULT_EMBEDDING_DIM = 8
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}

# OpenAI's error `type` and `code` per status, as its API sends them.
OPENAI_ERRORS: dict[int, tuple[str, str | None, str]] = {
    400: ("invalid_request_error", None, "Invalid request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: ("invalid_request_error", "unsupported_country_region_territory", "Forbidden."),
    404: ("invalid_request_error", "model_not_found", "The model does not exist."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached for requests."),
    500: ("server_error", None, "The server had an error while processing your request."),
    502: ("server_error", None, "Bad gateway."),
    503: ("server_error", None, "The server is overloaded or not ready yet."),
    504: ("server_error", None, "Gateway timeout."),
}


@dataclass
class Behaviour:
    """How the fake answers one request. The fake's attributes of the same names are
    the behaviour of every request that has no scripted entry."""

    delay_s: float = 0.0  # before the first byte (headers included)
    itl_s: float = 0.0  # between stream chunks
    tokens: int | None = None  # completion tokens: reply is this many words when set
    reply_text: str = DEFAULT_REPLY
    fail_status: int | None = None  # answer with this error status instead
    fail_message: str | None = None  # that error's message (else the API's usual one)
    retry_after: str | None = None  # Retry-After header on failures
    omit_usage: bool = False  # no `usage` in the body, no usage chunk in the stream
    stall_after_chunks: int | None = None  # stream: hang after this many content chunks
    reset_after_chunks: int | None = None  # stream: abort the connection after this many
    fail_in_stream: bool = False  # stream: end with the API's in-band failure event
    malformed_json: bool = False  # body (or first content chunk) is not valid JSON
    logprob: float = -0.25  # every token's logprob, when the request asks for logprobs
    ignore_max_tokens: bool = False  # answer in full whatever max_tokens says (bills past it)
    # Usage details. OpenAI: `cached_tokens` of the prompt's tokens (at most all of them)
    # were a cache read, `reasoning_tokens` more completion tokens were reasoning,
    # `audio_prompt_tokens` more prompt tokens were audio. Anthropic: `cached_tokens`
    # and `cache_write_tokens` were read from and written to the cache, on top of
    # `input_tokens` as its API counts them.
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    audio_prompt_tokens: int = 0


KNOBS = tuple(f.name for f in fields(Behaviour))


class _AbortConnection(Exception):
    """Raised inside a streaming body so uvicorn drops the connection mid-response."""


class _QuietAborts(logging.Filter):
    """Drops uvicorn's traceback for the connection aborts the fakes cause on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not _contains_abort(exc)


def _contains_abort(exc: BaseException | None) -> bool:
    if exc is None:
        return False
    if isinstance(exc, _AbortConnection):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return any(_contains_abort(inner) for inner in exc.exceptions)
    return _contains_abort(exc.__cause__ or exc.__context__)


_ABORT_FILTER = _QuietAborts()


class FakeServer:
    """Background uvicorn server with the knobs, the request log and the script."""

    url_suffix = ""

    delay_s: float
    itl_s: float
    tokens: int | None
    reply_text: str
    fail_status: int | None
    retry_after: str | None
    omit_usage: bool
    stall_after_chunks: int | None
    reset_after_chunks: int | None
    malformed_json: bool
    logprob: float
    cached_tokens: int
    cache_write_tokens: int
    reasoning_tokens: int
    audio_prompt_tokens: int

    def __init__(self) -> None:
        for name, value in vars(Behaviour()).items():
            setattr(self, name, value)
        self.fail_times: int | None = None  # with fail_status: fail only this many requests
        self.requests: list[dict[str, Any]] = []
        self.port = 0
        self._script: deque[Behaviour] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:PORT`, without any API path."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The base URL an SDK for this API expects."""
        return self.base_url + self.url_suffix

    def script(self, *behaviours: Behaviour) -> None:
        """Queue one behaviour per coming request; the knob attributes apply after."""
        with self._lock:
            self._script.extend(behaviours)

    def fail(self, status: int, *, times: int | None = 1, retry_after: str | None = None) -> None:
        """Fail the next `times` requests (all of them when None) with `status`."""
        self.fail_status, self.fail_times, self.retry_after = status, times, retry_after

    def next_behaviour(self) -> Behaviour:
        """The behaviour for the request being handled now (consumes script / fail_times)."""
        with self._lock:
            if self._script:
                return self._script.popleft()
            current = Behaviour(**{name: getattr(self, name) for name in KNOBS})
            if self.fail_status is not None and self.fail_times is not None:
                self.fail_times -= 1
                if self.fail_times <= 0:
                    self.fail_status, self.fail_times = None, None
            return current

    async def record(self, request: Request) -> dict[str, Any]:
        """Parse the body (None unless it is JSON) and append the request to `requests`."""
        raw = await request.body()
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            body = None
        entry = {
            "method": request.method,
            "path": request.url.path,
            "headers": {k.lower(): v for k, v in request.headers.items()},
            "body": body,
            "raw": raw,
        }
        self.requests.append(entry)
        return entry

    async def sleep(self, seconds: float) -> None:
        """Sleep, waking early when the server is stopping (so stalls never block stop)."""
        deadline = time.monotonic() + seconds
        while not self._stopping.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(left, 0.05))

    async def pace(self, sent: int, behaviour: Behaviour) -> None:
        """Before content chunk number `sent` (from 0): stall, reset, or wait `itl_s`."""
        if sent == behaviour.stall_after_chunks:
            await self.sleep(math.inf)  # returns only when the server stops
            raise _AbortConnection
        if sent == behaviour.reset_after_chunks:
            raise _AbortConnection
        if sent:
            await self.sleep(behaviour.itl_s)

    def routes(self) -> list[Route]:
        raise NotImplementedError

    def start(self) -> Self:
        """Bind a free port and serve until `stop()`."""
        # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on such sockets (else Nagle
        # holds each reply ~40 ms for the client's delayed ACK).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self._socket, self.port = sock, sock.getsockname()[1]
        logging.getLogger("uvicorn.error").addFilter(_ABORT_FILTER)
        config = uvicorn.Config(
            Starlette(routes=self.routes()),
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="off",
            ws="none",
            http="h11",
            loop="asyncio",
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{type(self).__name__} did not start on port {self.port}")
            time.sleep(0.005)
        return self

    def stop(self) -> None:
        """Stop serving; stalled streams and pending delays end at once."""
        self._stopping.set()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._socket is not None:
            self._socket.close()
        self._server = self._thread = self._socket = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def reply_pieces(behaviour: Behaviour, limit: int | None) -> tuple[list[str], bool]:
    """The reply as word pieces (leading space kept, so they concatenate to the text),
    cut to `limit` tokens; the flag says whether the limit cut it."""
    if behaviour.tokens is not None:
        pieces = [f"{' ' if i else ''}word{i}" for i in range(behaviour.tokens)]
    else:
        pieces = re.findall(r"\s*\S+", behaviour.reply_text)
    if limit is not None and 0 < limit < len(pieces):
        return pieces[:limit], True
    return pieces, False


def count_words(value: Any) -> int:
    """Words in a prompt: strings, lists of them, content parts or messages."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(count_words(item) for item in value)
    if isinstance(value, dict):
        if value.get("type") in (None, "text"):
            return count_words(value.get("content")) + count_words(value.get("text"))
        return by_size(value)  # an image, audio, a file: billed by size
    if isinstance(value, int):  # a token id in a pre-tokenised prompt
        return 1
    return 0


def by_size(value: Any) -> int:
    return len(json.dumps(value)) // 4


def chat_prompt_tokens(body: dict[str, Any]) -> int:
    """The messages' words, plus tool schemas and response formats by size."""
    extra = sum(by_size(body[f]) for f in ("tools", "response_format") if body.get(f))
    return count_words(body["messages"]) + extra


def output_limit(body: dict[str, Any], behaviour: Behaviour) -> int | None:
    """The output cap the request sets (None with `ignore_max_tokens`)."""
    if behaviour.ignore_max_tokens:
        return None
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    return limit if isinstance(limit, int) else None


def prompt_count(body: dict[str, Any]) -> int:
    """How many prompts a completion request carries (a list of them is answered each)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        return len(prompt)
    return 1


def sse(payload: Any, event: str | None = None) -> bytes:
    """One server-sent event: `data: <json>` (with an `event:` line when named)."""
    data = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + data + b"\n\n"


def placeholder_arguments(parameters: dict[str, Any] | None) -> dict[str, Any]:
    """Arguments for a forced tool call: a value of the right type per property."""
    samples = {"string": "test", "integer": 1, "number": 1.5, "boolean": True}
    properties = (parameters or {}).get("properties", {})
    return {name: samples.get(spec.get("type", "string")) for name, spec in properties.items()}


class FakeOpenAI(FakeServer):
    """OpenAI's `/v1` API: chat completions, completions, embeddings, models, health.

    Extra knobs: `api_key` (when set, `Authorization: Bearer <key>` is required),
    `models` (what `/v1/models` lists), `healthy` (False: `/health` answers 503),
    `engine_load` (running, waiting, KV-cache usage that `/metrics` reports with vLLM's
    metric names), `slow_share` / `slow_delay_s` (that share of requests, drawn from a
    seeded generator, waits `slow_delay_s` more before its first byte)."""

    url_suffix = "/v1"

    def __init__(self) -> None:
        super().__init__()
        self.api_key: str | None = None
        self.models: list[str] = ["fake-model"]
        self.healthy = True
        self.engine_load: tuple[float, float, float] = (0.0, 0.0, 0.0)
        self.slow_share = 0.0
        self.generated_tokens = 0  # non-streamed completion tokens, on /metrics
        self.slow_delay_s = 0.0
        self._slow_rng = random.Random(7)

    def routes(self) -> list[Route]:
        return [
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/completions", self._completions, methods=["POST"]),
            Route("/v1/embeddings", self._embeddings, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/health", self._health, methods=["GET"]),
            Route("/metrics", self._metrics, methods=["GET"]),
        ]

    async def _chat(self, request: Request) -> Response:
        return await self._handle(request, "messages", self._chat_body, self._chat_stream)

    async def _completions(self, request: Request) -> Response:
        return await self._handle(request, "prompt", self._text_body, self._text_stream)

    async def _embeddings(self, request: Request) -> Response:
        return await self._handle(request, "input", self._embedding_body, None)

    async def _handle(
        self,
        request: Request,
        required: str,
        build: Callable[[dict[str, Any], Behaviour], dict[str, Any]],
        stream: Callable[[dict[str, Any], Behaviour], AsyncIterator[bytes]] | None,
    ) -> Response:
        """The steps every POST shares: record, auth, delay, scripted failure, validation."""
        entry = await self.record(request)
        behaviour = self.next_behaviour()
        slow = self.slow_share and self._slow_rng.random() < self.slow_share
        await self.sleep(behaviour.delay_s + (self.slow_delay_s if slow else 0.0))
        body = entry["body"]
        if self.api_key is not None and entry["headers"].get("authorization") != (
            f"Bearer {self.api_key}"
        ):
            return openai_error(401)
        if behaviour.fail_status is not None:
            return openai_error(
                behaviour.fail_status, behaviour.fail_message, retry_after=behaviour.retry_after
            )
        if not isinstance(body, dict) or required not in body:
            return openai_error(400, f"'{required}' is a required property", param=required)
        headers = self._load_report(entry["headers"])
        if body.get("stream") and stream is not None:
            return StreamingResponse(
                stream(body, behaviour),
                media_type="text/event-stream",
                headers={**SSE_HEADERS, **headers},
            )
        if behaviour.malformed_json:
            return Response(b'{"id": "broken", "choices": [', media_type="application/json")
        reply = build(body, behaviour)
        self.generated_tokens += (reply.get("usage") or {}).get("completion_tokens", 0)
        return JSONResponse(reply, headers=headers)

    def _load_report(self, request_headers: dict[str, str]) -> dict[str, str]:
        """vLLM's per-response load report, when the request asks for one."""
        if "endpoint-load-metrics-format" not in request_headers:
            return {}
        running, waiting, kv = self.engine_load
        value = (
            f"TEXT named_metrics.num_requests_running={running}, "
            f"named_metrics.num_requests_waiting={waiting}, "
            f"named_metrics.kv_cache_usage_perc={kv}"
        )
        return {"endpoint-load-metrics": value}

    async def _models(self, request: Request) -> Response:
        await self.record(request)
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in self.models]
        return JSONResponse({"object": "list", "data": data})

    async def _health(self, request: Request) -> Response:
        return Response(status_code=200 if self.healthy else 503)

    async def _metrics(self, request: Request) -> Response:
        running, waiting, kv = self.engine_load
        label = '{model_name="fake-model"}'
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{label} {running}",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{label} {waiting}",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{label} {kv}",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{label} {self.generated_tokens}",
        ]
        return Response("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    def _chat_body(self, body: dict[str, Any], behaviour: Behaviour) -> dict[str, Any]:
        pieces, cut = reply_pieces(behaviour, output_limit(body, behaviour))
        tool = forced_tool(body)
        n = int(body.get("n") or 1)
        choices = []
        for index in range(n):
            message: dict[str, Any] = {"role": "assistant", "content": "".join(pieces)}
            message["refusal"] = None
            finish = "length" if cut else "stop"
            if tool is not None:
                message["content"], finish = None, "tool_calls"
                message["tool_calls"] = [tool_call(tool)]
            choice = {"index": index, "message": message, "logprobs": None, "finish_reason": finish}
            if body.get("logprobs"):
                logprobs = [token_logprob(p, behaviour.logprob) for p in pieces]
                choice["logprobs"] = {"content": logprobs}
            choices.append(choice)
        reply = completion_envelope("chat.completion", body, "chatcmpl-")
        reply["choices"] = choices
        if not behaviour.omit_usage:
            reply["usage"] = usage(chat_prompt_tokens(body), len(pieces) * n, behaviour)
        return reply

    async def _chat_stream(
        self, body: dict[str, Any], behaviour: Behaviour
    ) -> AsyncIterator[bytes]:
        pieces, cut = reply_pieces(behaviour, output_limit(body, behaviour))
        tool = forced_tool(body)
        n = int(body.get("n") or 1)
        with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        envelope = completion_envelope("chat.completion.chunk", body, "chatcmpl-")
        if with_usage:
            envelope["usage"] = None

        def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
            return sse({**envelope, "choices": [choice]})

        for index in range(n):
            yield chunk(index, {"role": "assistant", "content": "" if tool is None else None})
        deltas: Iterable[dict[str, Any]]
        if tool is not None:
            deltas = tool_call_deltas(tool)
        else:
            deltas = ({"content": piece} for piece in pieces)
        async for payload in self._paced(deltas, behaviour, n, chunk):
            yield payload
        finish = "tool_calls" if tool is not None else ("length" if cut else "stop")
        for index in range(n):
            yield chunk(index, {}, finish)
        if with_usage and not behaviour.omit_usage:
            yield sse(
                {
                    **envelope,
                    "choices": [],
                    "usage": usage(chat_prompt_tokens(body), len(pieces) * n, behaviour),
                }
            )
        yield b"data: [DONE]\n\n"

    async def _paced(
        self,
        deltas: Iterable[dict[str, Any]],
        behaviour: Behaviour,
        n: int,
        chunk: Callable[[int, dict[str, Any]], bytes],
    ) -> AsyncIterator[bytes]:
        """Content chunks with the inter-token delay, the stall, the reset, the bad JSON."""
        for sent, delta in enumerate(deltas):
            await self.pace(sent, behaviour)
            if sent == 0 and behaviour.malformed_json:
                yield b'data: {"id": "broken", "choices": [\n\n'
                continue
            for index in range(n):
                yield chunk(index, delta)

    def _text_body(self, body: dict[str, Any], behaviour: Behaviour) -> dict[str, Any]:
        pieces, cut = reply_pieces(behaviour, output_limit(body, behaviour))
        n = int(body.get("n") or 1) * prompt_count(body)
        reply = completion_envelope("text_completion", body, "cmpl-")
        reply["choices"] = [
            {
                "text": "".join(pieces),
                "index": i,
                "logprobs": None,
                "finish_reason": "length" if cut else "stop",
            }
            for i in range(n)
        ]
        if not behaviour.omit_usage:
            reply["usage"] = usage(count_words(body["prompt"]), len(pieces) * n, behaviour)
        return reply

    async def _text_stream(
        self, body: dict[str, Any], behaviour: Behaviour
    ) -> AsyncIterator[bytes]:
        pieces, cut = reply_pieces(behaviour, output_limit(body, behaviour))
        n = int(body.get("n") or 1) * prompt_count(body)
        with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        envelope = completion_envelope("text_completion", body, "cmpl-")
        if with_usage:
            envelope["usage"] = None

        def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"text": delta.get("content", ""), "index": index, "logprobs": None}
            return sse({**envelope, "choices": [{**choice, "finish_reason": finish}]})

        async for payload in self._paced(({"content": p} for p in pieces), behaviour, n, chunk):
            yield payload
        for index in range(n):
            yield chunk(index, {}, "length" if cut else "stop")
        if with_usage and not behaviour.omit_usage:
            yield sse(
                {
                    **envelope,
                    "choices": [],
                    "usage": usage(count_words(body["prompt"]), len(pieces) * n, behaviour),
                }
            )
        yield b"data: [DONE]\n\n"

    def _embedding_body(self, body: dict[str, Any], behaviour: Behaviour) -> dict[str, Any]:
        raw_inputs = body["input"]
        inputs = (
            raw_inputs
            if isinstance(raw_inputs, list) and raw_inputs and not isinstance(raw_inputs[0], int)
            else [raw_inputs]
        )
        dim = int(body.get("dimensions") or DEFAULT_EMBEDDING_DIM)
        data = []
        for index, text in enumerate(inputs):
            vector = fake_vector(str(text), dim)
            encoded: Any = vector
            if body.get("encoding_format") == "base64":
                encoded = base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        reply: dict[str, Any] = {"object": "list", "data": data, "model": body.get("model")}
        if not behaviour.omit_usage:
            prompt = count_words(raw_inputs)
            reply["usage"] = {"prompt_tokens": prompt, "total_tokens": prompt}
        return reply


def completion_envelope(obj: str, body: dict[str, Any], prefix: str) -> dict[str, Any]:
    return {
        "id": new_id(prefix),
        "object": obj,
        "created": int(time.time()),
        "model": body.get("model", "fake-model"),
        "system_fingerprint": "fp_fake",
    }


def usage(prompt: int, completion: int, behaviour: Behaviour | None = None) -> dict[str, Any]:
    """OpenAI's usage object: reasoning and audio tokens are inside the totals."""
    details = behaviour or Behaviour()
    prompt += details.audio_prompt_tokens
    completion += details.reasoning_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {
            "cached_tokens": min(details.cached_tokens, prompt),
            "audio_tokens": details.audio_prompt_tokens,
        },
        "completion_tokens_details": {
            "reasoning_tokens": details.reasoning_tokens,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def token_logprob(piece: str, logprob: float = -0.25) -> dict[str, Any]:
    return {"token": piece, "logprob": logprob, "bytes": list(piece.encode()), "top_logprobs": []}


def forced_tool(body: dict[str, Any]) -> dict[str, Any] | None:
    """The function spec `tool_choice` forces (a named function, or "required"), if any."""
    tools = body.get("tools") or []
    choice = body.get("tool_choice")
    if not tools:
        return None
    if choice == "required":
        return dict(tools[0].get("function", {}))
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        for tool in tools:
            if tool.get("function", {}).get("name") == name:
                return dict(tool["function"])
    return None


def tool_call(function: dict[str, Any]) -> dict[str, Any]:
    arguments = orjson.dumps(placeholder_arguments(function.get("parameters"))).decode()
    return {
        "id": new_id("call_"),
        "type": "function",
        "function": {"name": function.get("name"), "arguments": arguments},
    }


def tool_call_deltas(function: dict[str, Any]) -> list[dict[str, Any]]:
    """The stream deltas of one tool call: id and name first, then the arguments."""
    call = tool_call(function)
    head = {**call, "index": 0, "function": {"name": call["function"]["name"], "arguments": ""}}
    tail = {"index": 0, "function": {"arguments": call["function"]["arguments"]}}
    return [{"tool_calls": [head]}, {"tool_calls": [tail]}]


def fake_vector(text: str, dim: int) -> list[float]:
    """A deterministic unit vector for `text`."""
    digest = hashlib.sha256(text.encode()).digest()
    raw = [(digest[i % len(digest)] - 127.5) / 127.5 for i in range(dim)]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]


def openai_error(
    status: int,
    message: str | None = None,
    *,
    param: str | None = None,
    retry_after: str | None = None,
) -> JSONResponse:
    """An error response in OpenAI's shape."""
    kind, code, default = OPENAI_ERRORS.get(status, ("api_error", None, f"Error {status}."))
    body = {"error": {"message": message or default, "type": kind, "param": param, "code": code}}
    headers = {"retry-after": retry_after} if retry_after is not None else None
    return JSONResponse(body, status_code=status, headers=headers)
