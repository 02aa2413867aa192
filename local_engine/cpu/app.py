"""The CPU engine's HTTP surface: OpenAI's API as vLLM serves it, plus `/metrics`.

    app = create_app(EngineService(runner, tokenizer, metrics, "local-tiny"))

Routes: POST /v1/chat/completions, POST /v1/completions (both stream as OpenAI's SSE,
with `stream_options.include_usage`), POST /v1/embeddings (MiniLM, with the
`embeddings` extra), GET /v1/models, GET /health, GET /metrics.
Plain Starlette routes; bodies are read by `local_engine.cpu.validation`. Errors are
OpenAI's `{"error": {"message", "type", "param", "code"}}`; an unknown path or method is
vLLM's (and FastAPI's) `{"detail": "Not Found"}`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from local_engine.cpu.embeddings import DIMENSIONS, MODEL_NAME, SentenceEncoder
from local_engine.cpu.errors import CpuEngineError, InvalidRequest, ModelNotFound
from local_engine.cpu.metrics import EngineMetrics
from local_engine.cpu.protocol import (
    ChatCompletionBody,
    CompletionBody,
    EmbeddingBody,
    GenerationBody,
)
from local_engine.cpu.runner import EngineRunner
from local_engine.cpu.sequence import Output
from local_engine.cpu.sequence import Request as EngineRequest
from local_engine.cpu.tokenizer import Tokenizer
from local_engine.cpu.validation import read_body

DROPPED = "the engine dropped the request (see the engine's log)"
# The chat template knows system, user and assistant turns.
ROLE_ALIASES = {"developer": "system", "tool": "user"}
# Builds one streamed chunk's `choices[0]` from (text, finish_reason, first chunk?).
ChoiceBuilder = Callable[[str, str | None, bool], dict[str, Any]]


@dataclass(frozen=True)
class EngineService:
    runner: EngineRunner
    tokenizer: Tokenizer
    metrics: EngineMetrics
    model_name: str
    model_root: str = ""
    encoder: SentenceEncoder = field(default_factory=SentenceEncoder)


def create_app(service: EngineService) -> Starlette:
    """The app over `service`, whose engine thread runs as long as the app's lifespan."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        service.runner.start()
        try:
            yield
        finally:
            service.runner.stop()

    # Starlette types a handler as taking any Exception; each of these takes its own.
    app = Starlette(routes=ROUTES, lifespan=lifespan, exception_handlers=HANDLERS)  # type: ignore[arg-type]
    app.state.service = service
    return app


def _service(request: Request) -> EngineService:
    service: EngineService = request.app.state.service
    return service


async def health(request: Request) -> Response:
    return Response(status_code=200 if _service(request).runner.is_alive() else 503)


async def metrics(request: Request) -> Response:
    return Response(_service(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def models(request: Request) -> Response:
    service = _service(request)
    card = {
        "id": service.model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "cascade-gateway",
        "root": service.model_root or service.model_name,
        "parent": None,
        "max_model_len": service.runner.engine.max_model_len,
    }
    return JSONResponse({"object": "list", "data": [card]})


async def chat(request: Request) -> Response:
    service, body = _service(request), await read_body(request, ChatCompletionBody)
    _check_model(service, body)
    messages = [
        {"role": ROLE_ALIASES.get(m.role, m.role), "content": m.text()} for m in body.messages
    ]
    ids = service.tokenizer.encode(service.tokenizer.render_chat(messages))
    engine_request = _request("chatcmpl", ids, body.sampling_params(), service, "messages")
    if body.stream:
        return _sse(_chat_chunks(service, engine_request, body))
    text, last = await _collect(service, engine_request)
    message = {"role": "assistant", "content": text}
    choice = {"index": 0, "message": message, "logprobs": None}
    return JSONResponse(_reply(service, engine_request, "chat.completion", choice, last))


async def completions(request: Request) -> Response:
    service, body = _service(request), await read_body(request, CompletionBody)
    _check_model(service, body)
    ids = _completion_ids(service.tokenizer, body.prompt)
    engine_request = _request("cmpl", ids, body.sampling_params(), service, "prompt")
    if body.stream:
        return _sse(_completion_chunks(service, engine_request, body))
    text, last = await _collect(service, engine_request)
    choice = {"index": 0, "text": text, "logprobs": None}
    return JSONResponse(_reply(service, engine_request, "text_completion", choice, last))


async def embeddings(request: Request) -> Response:
    service, body = _service(request), await read_body(request, EmbeddingBody)
    # The engine's own name (what the gateway's deployment asks for) or MiniLM's.
    if body.model not in (service.model_name, MODEL_NAME):
        raise ModelNotFound(f"The model `{body.model}` does not exist.")
    if body.dimensions not in (None, DIMENSIONS):
        message = f"dimensions is {body.dimensions}; {MODEL_NAME} has {DIMENSIONS}"
        raise InvalidRequest(message, "dimensions")
    vectors, tokens = await asyncio.to_thread(service.encoder.encode, body.texts)
    data = [
        {"object": "embedding", "index": i, "embedding": _encoded(v, body.encoding_format)}
        for i, v in enumerate(vectors)
    ]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return JSONResponse({"object": "list", "data": data, "model": MODEL_NAME, "usage": usage})


def _encoded(vector: list[float], encoding_format: str) -> list[float] | str:
    """A vector as floats, or as base64 of little-endian float32 (what the SDKs ask for)."""
    if encoding_format == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def _completion_ids(tokenizer: Tokenizer, prompt: str | list[str] | list[int]) -> list[int]:
    """A text prompt (alone or as a one-item list) gets BOS, as Llama tokenizers add it."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return [tokenizer.bos_id, *tokenizer.encode(prompt)]
    ids = [int(token) for token in prompt]
    bad = [token for token in ids if not 0 <= token < tokenizer.vocab_size]
    if bad:
        raise InvalidRequest(
            f"prompt has token id {bad[0]}; ids are in [0, {tokenizer.vocab_size})", "prompt"
        )
    return ids


def _check_model(service: EngineService, body: GenerationBody) -> None:
    if body.model != service.model_name:
        raise ModelNotFound(f"The model `{body.model}` does not exist.")


def _request(
    prefix: str, ids: list[int], params: Any, service: EngineService, param: str
) -> EngineRequest:
    request = EngineRequest(f"{prefix}-{uuid.uuid4().hex}", ids, params)
    service.runner.engine.check(request, param)
    return request


async def _collect(service: EngineService, request: EngineRequest) -> tuple[str, Output]:
    parts: list[str] = []
    last: Output | None = None
    async for output in service.runner.generate(request):
        parts.append(output.text)
        last = output
    if last is None or last.finish_reason == "abort":
        raise CpuEngineError(DROPPED)
    return "".join(parts), last


def _usage(output: Output) -> dict[str, int]:
    return {
        "prompt_tokens": output.prompt_tokens,
        "completion_tokens": output.completion_tokens,
        "total_tokens": output.prompt_tokens + output.completion_tokens,
    }


def _reply(
    service: EngineService,
    request: EngineRequest,
    kind: str,
    choice: dict[str, Any],
    last: Output,
) -> dict[str, Any]:
    return {
        "id": request.request_id,
        "object": kind,
        "created": int(time.time()),
        "model": service.model_name,
        "choices": [choice | {"finish_reason": last.finish_reason}],
        "usage": _usage(last),
    }


def _sse(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream")


async def _chat_chunks(
    service: EngineService, request: EngineRequest, body: ChatCompletionBody
) -> AsyncIterator[str]:
    def choice(text: str, finish: str | None, first: bool) -> dict[str, Any]:
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        if finish is not None and not text and not first:
            delta = {}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    async for event in _chunks(service, request, body, "chat.completion.chunk", choice):
        yield event


async def _completion_chunks(
    service: EngineService, request: EngineRequest, body: CompletionBody
) -> AsyncIterator[str]:
    def choice(text: str, finish: str | None, first: bool) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

    async for event in _chunks(service, request, body, "text_completion", choice):
        yield event


async def _chunks(
    service: EngineService,
    request: EngineRequest,
    body: GenerationBody,
    kind: str,
    choice: ChoiceBuilder,
) -> AsyncIterator[str]:
    """OpenAI's SSE: one chunk per engine output, `usage` last when asked for, `[DONE]`."""
    base = {"id": request.request_id, "object": kind, "created": int(time.time())}
    base["model"] = service.model_name
    usage_field = {"usage": None} if body.include_usage else {}
    first, last = kind == "chat.completion.chunk", None
    async for output in service.runner.generate(request):
        last = output
        if output.finish_reason == "abort":
            yield _event(_error_body(DROPPED, "server_error", None, None))
            return
        if not output.text and output.finish_reason is None and not first:
            continue
        chunk = base | {"choices": [choice(output.text, output.finish_reason, first)]}
        yield _event(chunk | usage_field)
        first = False
    if body.include_usage and last is not None:
        yield _event(base | {"choices": [], "usage": _usage(last)})
    yield "data: [DONE]\n\n"


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def _error_body(message: str, kind: str, param: str | None, code: Any) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _error(status: int, message: str, kind: str, param: str | None, code: Any) -> JSONResponse:
    return JSONResponse(_error_body(message, kind, param, code), status_code=status)


async def _invalid_request(request: Request, exc: InvalidRequest) -> Response:
    return _error(400, str(exc), "invalid_request_error", exc.param, None)


async def _unavailable(request: Request, exc: CpuEngineError) -> Response:
    return _error(503, str(exc), "server_error", None, None)


async def _no_model(request: Request, exc: ModelNotFound) -> Response:
    return _error(404, str(exc), "invalid_request_error", "model", "model_not_found")


async def _http_error(request: Request, exc: HTTPException) -> Response:
    """Unknown paths and methods, as FastAPI (and so vLLM) answers them: `{"detail"}`."""
    return JSONResponse({"detail": exc.detail}, exc.status_code, headers=exc.headers)


ROUTES = [
    Route("/health", health, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/v1/models", models, methods=["GET"]),
    Route("/v1/chat/completions", chat, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/embeddings", embeddings, methods=["POST"]),
]
# Looked up along the exception's MRO: InvalidRequest and ModelNotFound before their base.
HANDLERS = {
    InvalidRequest: _invalid_request,
    ModelNotFound: _no_model,
    CpuEngineError: _unavailable,
    HTTPException: _http_error,
}
