"""The OpenAI-compatible surface: /v1/chat/completions, /v1/completions,
/v1/embeddings, /v1/models and /v1/models/{model}.

Plain Starlette routes, as every route of the gateway: the body is checked by
`gateway.http.validation`, without a framework's per-request dependency solving.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.auth import Origin, Principal
from gateway.errors import NotFound, PayloadTooLarge
from gateway.http.request_ids import bind_request_id
from gateway.http.services import Services, services_of
from gateway.http.validation import parse_body
from gateway.runtime import Runtime
from gateway.upstreams.base import EndpointType


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
    came = await arrival(request)
    body = parse_body(came.raw, endpoint, lambda model: label_route(request, came.runtime, model))
    # The bytes are not kept through the upstream calls: a body may be tens of MB.
    size, came = len(came.raw), dataclasses.replace(came, raw=b"")
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
    error handler and metrics need (id, start, team). `authorization`: as `authenticate`."""
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
