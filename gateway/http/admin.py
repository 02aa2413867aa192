"""Operational endpoints: liveness, readiness, metrics, and the admin API."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.errors import InvalidRequest
from gateway.health.breaker import STATE_VALUES
from gateway.http.services import Services, services_of
from gateway.metrics import CONTENT_TYPE
from policies import PolicyError


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready when some deployment is usable. A down ledger store does not make the
    gateway unready: spend is spooled locally and replayed."""
    services = services_of(request)
    runtime = services.runtime
    available = [d.name for d in runtime.deployments.values() if d.unavailable_reason is None]
    body = {
        "status": "ready" if available else "unready",
        "policy_digest": runtime.digest,
        "available_deployments": available,
        "ledger": "degraded" if services.ledger.degraded else "ok",
    }
    return JSONResponse(body, status_code=200 if available else 503)


async def metrics(request: Request) -> Response:
    """Prometheus text; open unless the policy lists `metrics_keys`."""
    services = services_of(request)
    services.runtime.keys.authenticate_metrics(request.headers.get("authorization"))
    m = services.metrics
    m.ledger_degraded.set(1 if services.ledger.degraded else 0)
    m.ledger_spooled.set(services.ledger.spooled_count)
    m.ledger_expired.set(services.ledger.expired_count)
    m.policy_edit_rejected.set(1 if services.last_reload_error() else 0)
    # Budgets first: a reload during their read must not bring a dropped one back.
    await services.limits.show_budgets(services.runtime)
    _policy_gauges(services)
    return Response(m.render(), media_type=CONTENT_TYPE)


def _policy_gauges(services: Services) -> None:
    """The gauges that describe the serving policy, as of now: set for what it has, and
    pruned of what a reload removed (a deployment, its old tier, an SLA, a budget)."""
    m, runtime, breakers = services.metrics, services.runtime, services.guard.breakers
    deployments = runtime.deployments
    available = {(d.name, d.tier): 0 if d.unavailable_reason else 1 for d in deployments.values()}
    targets = {
        (route.name, kind): target
        for route in runtime.routes.values()
        if route.sla is not None
        for kind, target in (
            ("ttft", route.sla.ttft_s),
            ("timeout", route.sla.timeout_s),
            ("p99", route.sla.p99_s),
        )
        if target is not None
    }
    budgets = {(b.scope, b.name, b.period) for b in runtime.policy.budgets}
    soft = {
        (b.scope, b.name, b.period) for b in runtime.policy.budgets if b.soft_limit_usd is not None
    }
    m.prune(m.deployment_available, available.__contains__)
    m.prune(m.sla_target, targets.__contains__)
    m.prune(m.budget_remaining, budgets.__contains__)
    m.prune(m.budget_soft_remaining, soft.__contains__)
    for gauge in (m.breaker_state, m.predicted_ttft, m.engine_requests, m.engine_kv_cache):
        m.prune(gauge, lambda labels: labels[0] in deployments)
    for labels, value in available.items():
        m.deployment_available.labels(*labels).set(value)
    for labels, target in targets.items():
        m.sla_target.labels(*labels).set(target)
    for name in deployments:  # an open breaker whose cooldown is over reads half-open
        m.child(m.breaker_state, name).set(STATE_VALUES[breakers.state(name)])


async def reload_policy(request: Request) -> Response:
    services = services_of(request)
    services.runtime.keys.authenticate_admin(request.headers.get("authorization"))
    if services.reloader is None:
        raise InvalidRequest("this gateway was started without a reloadable policy file")
    try:
        # parsed in a worker thread; applied (services.apply) back on the event loop
        loaded = await services.reloader.reload_now()
    except PolicyError as exc:
        raise InvalidRequest(
            f"policy rejected, the last good policy keeps serving:\n{exc}", code="invalid_policy"
        ) from exc
    return JSONResponse({"status": "reloaded", "digest": loaded.digest})


async def policy_status(request: Request) -> Response:
    services = services_of(request)
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


ROUTES = [
    Route("/healthz", healthz, methods=["GET"]),
    Route("/readyz", readyz, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/admin/reload", reload_policy, methods=["POST"]),
    Route("/admin/policy", policy_status, methods=["GET"]),
]
