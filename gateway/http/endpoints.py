"""The OpenAI-compatible surface: /v1/chat/completions, /v1/completions,
/v1/embeddings, /v1/models and /v1/models/{model}.

Plain Starlette routes, as every route of the gateway: the body is checked by
`gateway.http.validation`, without a framework's per-request dependency solving.

A big body is parsed and checked in a worker thread (`checked`), a few at a time: on
the event loop, one of tens of MB held up every other request for seconds. A client
that hangs up before its body is in ends its request quietly (`client_gone`).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import gc
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.auth import Origin, Principal
from gateway.errors import GatewayError, NotFound, PayloadTooLarge
from gateway.http.request_ids import bind_request_id
from gateway.http.services import Services, services_of
from gateway.http.validation import parse_body
from gateway.metrics import CLIENT_CLOSED
from gateway.runtime import Runtime
from gateway.upstreams.base import EndpointType

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

# Bodies from this size on are parsed and checked off the event loop, as long prompts
# are counted (`gateway.billing.tokens`). Below it a thread hop (~35 us) costs more
# than it saves: a typical chat body parses in tens of us, and the costliest shape
# (nested token-id arrays) holds the loop ~10 ms at this size (~40 ms at 256 KiB).
OFF_LOOP_BYTES = 64 * 1024
# Huge bodies parsed at once in this process; the others wait their turn. A parsed
# body takes far more memory than its bytes (a 17 MiB array of token-id arrays,
# ~480 MiB), so a burst of them must not be parsed all together. One: the interpreter's
# lock runs parses one at a time anyway, so a second thread added no throughput, only
# memory and longer stalls (four such bodies at once: peak RSS 1.27 GiB with one, 1.72
# with two; 0.89 when the event loop parsed them, one at a time). The pool's thread is
# the bound, not a semaphore: a request cancelled while its parse runs (its client
# gone) would release that, and let another parse start beside it. Smaller bodies
# never wait behind a huge one: theirs is the default pool (`to_thread`), as long
# prompts' counts are.
HUGE_BODY_BYTES = 1024 * 1024
MAX_HUGE_PARSES = 1
_HUGE_PARSES = ThreadPoolExecutor(max_workers=MAX_HUGE_PARSES, thread_name_prefix="body-parse")
# New objects past which a parse ending runs the collector (see `_collector_paused`).
COLLECT_AFTER_OBJECTS = 100_000


async def chat_completions(request: Request) -> Response:
    return await _proxy(request, "chat")


async def completions(request: Request) -> Response:
    return await _proxy(request, "completions")


async def embeddings(request: Request) -> Response:
    return await _proxy(request, "embeddings")


async def models(request: Request) -> Response:
    headers = _request_id(request)
    runtime = services_of(request).runtime
    principal = authenticate(request, runtime)
    data = [model_entry(name) for name in runtime.visible_models(principal)]
    return JSONResponse({"object": "list", "data": data}, headers=headers)


async def model(request: Request) -> Response:
    """One entry of /v1/models; a model this key may not see is as unknown as a typo."""
    name = request.path_params["model"]
    if not name:  # `/v1/models/`, which Starlette's slash redirect no longer reaches
        return await models(request)
    headers = _request_id(request)
    runtime = services_of(request).runtime
    principal = authenticate(request, runtime)
    if name not in runtime.visible_models(principal):
        raise NotFound(f"model '{name}' does not exist or this key may not use it", param="model")
    return JSONResponse(model_entry(name), headers=headers)


def _request_id(request: Request) -> dict[str, str]:
    """A listing's `x-request-id`, as every reply has; noted on `request.state`, where
    the error handler finds it."""
    request.state.request_id = request_id = services_of(request).proxy.request_ids.next()
    bind_request_id(request_id)  # on its log lines too
    return {"x-request-id": request_id}


def model_entry(name: str) -> dict[str, object]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "cascade-gateway"}


ROUTES = [
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/embeddings", embeddings, methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
    # `path`: a deployment name may hold a slash (`org/model`), sent raw or as %2F
    Route("/v1/models/{model:path}", model, methods=["GET"]),
]


async def _proxy(request: Request, endpoint: EndpointType) -> Response:
    try:
        came = await arrival(request)
    except ClientDisconnect:
        return client_gone(request)
    size = len(came.raw)
    body = await checked(
        size,
        parse_body,
        came.raw,
        endpoint,
        lambda model: label_route(request, came.runtime, model),
    )
    # The bytes are not kept through the upstream calls: a body may be tens of MB.
    came = dataclasses.replace(came, raw=b"")
    return await came.services.proxy.handle(
        came.runtime, came.principal, endpoint, body, came.request_id, size, came.started
    )


@dataclass(frozen=True, slots=True)
class Arrival:
    """What every proxied request (OpenAI's endpoints and the bridged APIs) starts
    with: its id and arrival time, one snapshot of the runtime for the whole request
    (even across a reload), the caller, and the body's bytes."""

    services: Services
    runtime: Runtime
    principal: Principal
    raw: bytes
    request_id: str
    started: float


async def arrival(request: Request, authorization: str | None = None) -> Arrival:
    """Authenticate and read a proxied request, noting on `request.state` what the
    error handler and metrics need (id, start, team). `authorization`: as `authenticate`.
    Raises starlette's `ClientDisconnect` if the client hangs up before its body is in:
    the caller ends the request with `client_gone`."""
    services = services_of(request)
    request.state.started = started = time.perf_counter()
    request.state.request_id = request_id = services.proxy.request_ids.next()
    bind_request_id(request_id)  # on the request's log lines from here on
    runtime = services.runtime
    principal = authenticate(request, runtime, authorization)
    request.state.team = principal.team  # a policy name: error metrics stay bounded
    raw = await read_body(request, runtime.max_body_bytes)
    return Arrival(services, runtime, principal, raw, request_id, started)


def label_route(request: Request, runtime: Runtime, model: str) -> None:
    """Name the request's route on its metrics: only known names, so labels stay bounded."""
    if model in runtime.routes or model in runtime.deployments:
        request.state.route = model


def authenticate(request: Request, runtime: Runtime, authorization: str | None = None) -> Principal:
    """The caller's principal, and its address in `request.state.client_address`. The
    socket peer is the server's `client`: `serve` runs uvicorn with its proxy headers
    off, so no header rewrites it; a forwarded request is never the anonymous team's.
    `authorization`: the credential when the API sends it elsewhere (`x-api-key`)."""
    peer = request.client.host if request.client else None
    origin = Origin.of(peer, request.headers, runtime.policy.gateway.trusted_proxies)
    request.state.client_address = origin.address
    credential = authorization or request.headers.get("authorization")
    return runtime.keys.authenticate(credential, origin.direct_peer)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refusing more than `limit` bytes without reading them all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body is {declared} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def client_gone(request: Request) -> Response:
    """End a request whose client hung up before its body was in: nobody is left to
    answer, and it is no error of the gateway's (counted under status 499, as the
    pipeline counts a client gone before its answer). The response goes nowhere."""
    request_id = getattr(request.state, "request_id", "-")
    log.info("request %s: the client went away before its body was read", request_id)
    services_of(request).metrics.count_client_closed("-", str(getattr(request.state, "team", "-")))
    return Response(status_code=int(CLIENT_CLOSED), headers={"x-request-id": request_id})


async def checked(size: int, check: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`check(*args, **kwargs)`, parsing or checking a request body of `size` bytes (or
    what it became): inline when it is small, else in a worker thread; at most
    `MAX_HUGE_PARSES` huge ones at once. The same result, the same errors."""
    if size < OFF_LOOP_BYTES:
        return check(*args, **kwargs)
    work = functools.partial(_collector_paused, check, *args, **kwargs)
    if size < HUGE_BODY_BYTES:
        return await asyncio.to_thread(work)
    context = contextvars.copy_context()  # its log lines keep the request's id
    return await asyncio.get_running_loop().run_in_executor(
        _HUGE_PARSES, functools.partial(context.run, work)
    )


_pause_lock = threading.Lock()
_pauses = 0  # parses running with the collector paused
_collector_was_enabled = False


def _collector_paused(check: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`check(...)`, in a worker thread, with the cyclic garbage collector paused (in
    the whole process, until no such parse runs).

    A thread keeps the event loop running while Python code parses, not while one C
    call holds the interpreter's lock: `orjson.loads` does, and a body of millions of
    small arrays set off collector passes inside it that took four times as long as
    the parse itself (1.5 s of 1.8 s for 17 MiB), stalling every request. Paused, what
    a parse made is scanned once, as it ends (one refused is freed first), by the
    collector run here when enough new objects wait for it: also what other requests
    left meanwhile, so back-to-back parses cannot keep it from running."""
    global _pauses, _collector_was_enabled
    with _pause_lock:
        if _pauses == 0:
            _collector_was_enabled = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        return check(*args, **kwargs)
    except GatewayError as error:
        # Without the frames that hold the parsed body (a refusal's traceback is never
        # shown): it is freed here, not on the event loop, where the error is rendered.
        cause: BaseException | None = error
        while cause is not None:
            cause.__traceback__ = None
            cause = cause.__context__
        raise
    finally:
        if _collector_was_enabled and gc.get_count()[0] > COLLECT_AFTER_OBJECTS:
            # The young generations only: a full pass over a big heap would hold the
            # interpreter's lock as long as the stall this pause avoids; the old one is
            # collected on the collector's own schedule once it runs again.
            gc.collect(1)
        with _pause_lock:
            _pauses -= 1
            if _pauses == 0 and _collector_was_enabled:
                gc.enable()
