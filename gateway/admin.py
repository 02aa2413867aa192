"""Operational endpoints: liveness, readiness, metrics, and the admin API."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.errors import InvalidRequest
from gateway.metrics import CONTENT_TYPE
from gateway.services import Services, get_services
from policies import PolicyError

router = APIRouter()
ServicesDep = Annotated[Services, Depends(get_services)]


@router.get("/healthz")
async def healthz() -> Response:
    return JSONResponse({"status": "ok"})


@router.get("/readyz")
async def readyz(services: ServicesDep) -> Response:
    """Ready when some deployment is usable. A down ledger store does not make the
    gateway unready: spend is spooled locally and replayed."""
    runtime = services.runtime
    available = [d.name for d in runtime.deployments.values() if d.unavailable_reason is None]
    body = {
        "status": "ready" if available else "unready",
        "policy_digest": runtime.digest,
        "available_deployments": available,
        "ledger": "degraded" if services.ledger.degraded else "ok",
    }
    return JSONResponse(body, status_code=200 if available else 503)


@router.get("/metrics")
async def metrics(services: ServicesDep) -> Response:
    m = services.metrics
    m.ledger_degraded.set(1 if services.ledger.degraded else 0)
    m.ledger_spooled.set(services.ledger.spooled_count)
    for d in services.runtime.deployments.values():
        m.deployment_available.labels(d.name, d.tier).set(0 if d.unavailable_reason else 1)
    for route in services.runtime.routes.values():
        sla = route.sla
        if sla is None:
            continue
        for kind, target in (("ttft", sla.ttft_s), ("timeout", sla.timeout_s), ("p99", sla.p99_s)):
            if target is not None:
                m.sla_target.labels(route.name, kind).set(target)
    return Response(m.render(), media_type=CONTENT_TYPE)


@router.post("/admin/reload")
async def reload_policy(request: Request, services: ServicesDep) -> Response:
    services.runtime.keys.authenticate_admin(request.headers.get("authorization"))
    if services.reloader is None:
        raise InvalidRequest("this gateway was started without a reloadable policy file")
    try:
        loaded = services.reloader.reload_now()  # applies it through services.apply
    except PolicyError as exc:
        raise InvalidRequest(
            f"policy rejected, the last good policy keeps serving:\n{exc}", code="invalid_policy"
        ) from exc
    return JSONResponse({"status": "reloaded", "digest": loaded.digest})


@router.get("/admin/policy")
async def policy_status(request: Request, services: ServicesDep) -> Response:
    runtime = services.runtime
    runtime.keys.authenticate_admin(request.headers.get("authorization"))
    deployments: dict[str, Any] = {
        d.name: {
            "tier": d.tier,
            "provider": d.provider,
            "model": d.target.model,
            "price_source": d.price.source,
            "available": d.unavailable_reason is None,
            "unavailable_reason": d.unavailable_reason,
            "health": services.guard.health_report(d.name),
        }
        for d in runtime.deployments.values()
    }
    return JSONResponse(
        {
            "digest": runtime.digest,
            "loaded_at": runtime.loaded_at,
            "last_reload_error": services.last_reload_error(),
            "routes": {r.name: list(r.deployments) for r in runtime.routes.values()},
            "deployments": deployments,
            "ledger": {"degraded": services.ledger.degraded},
        }
    )
