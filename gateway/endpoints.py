"""The OpenAI-compatible surface: /v1/chat/completions, /v1/completions,
/v1/embeddings and /v1/models."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.errors import PayloadTooLarge
from gateway.proxy import new_request_id
from gateway.services import Services, get_services
from gateway.upstreams.base import EndpointType
from gateway.validation import parse_body

router = APIRouter()
ServicesDep = Annotated[Services, Depends(get_services)]


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, services: ServicesDep) -> Response:
    return await _proxy(request, services, "chat")


@router.post("/v1/completions")
async def completions(request: Request, services: ServicesDep) -> Response:
    return await _proxy(request, services, "completions")


@router.post("/v1/embeddings")
async def embeddings(request: Request, services: ServicesDep) -> Response:
    return await _proxy(request, services, "embeddings")


@router.get("/v1/models")
async def models(request: Request, services: ServicesDep) -> Response:
    runtime = services.runtime
    principal = runtime.keys.authenticate(request.headers.get("authorization"))
    data = [
        {"id": name, "object": "model", "created": 0, "owned_by": "cascade-gateway"}
        for name in runtime.visible_models(principal)
    ]
    return JSONResponse({"object": "list", "data": data})


async def _proxy(request: Request, services: Services, endpoint: EndpointType) -> Response:
    request.state.request_id = request_id = new_request_id()
    runtime = services.runtime  # one snapshot for the whole request, even across a reload
    principal = runtime.keys.authenticate(request.headers.get("authorization"))
    raw = await read_body(request, runtime.max_body_bytes)

    def label_route(model: str) -> None:  # only known names: metric labels stay bounded
        if model in runtime.routes or model in runtime.deployments:
            request.state.route = model

    body = parse_body(raw, endpoint, label_route)
    return await services.proxy.handle(runtime, principal, endpoint, body, request_id, len(raw))


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
