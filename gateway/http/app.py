"""The application factory. No import-time side effects: clients, the ledger and the
policy reloader are created in the lifespan and closed with it.

    uvicorn gateway.http.app:create_app --factory
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from gateway.billing import tokens
from gateway.errors import GatewayError, InvalidRequest, NotFound, UpstreamUnavailable
from gateway.health.sla import build_guard
from gateway.http import admin, bridges, endpoints, openapi, spend_api
from gateway.http.dashboard import dashboard_routes
from gateway.http.disconnects import serve_watched
from gateway.http.openapi_schemas import Schema
from gateway.http.services import Services, counted_models, log_unserved
from gateway.http.shutdown import Requests
from gateway.ledger import (
    CostLedger,
    LedgerLayoutError,
    LedgerStore,
    LedgerUnavailable,
    MemoryStore,
    RedisStore,
    Spool,
)
from gateway.ledger.archive import ArchiveExporter, ArchiveOptions, build_exporter, check_installed
from gateway.limits import Limiter, RedisLimitStore
from gateway.limits.ledger_spend import LedgerSpend
from gateway.limits.rules import RuleBook, periods_at
from gateway.limits.store import LimitsLayoutError, LimitsStoreUnavailable
from gateway.metrics import Metrics
from gateway.pipeline.accounting import Accountant
from gateway.pipeline.executor import Executor
from gateway.pipeline.proxy import DECISIONS_LOGGER, Proxy, new_request_id
from gateway.pipeline.scoring import install_problems, warm
from gateway.pipeline.selector import TrafficProfiles
from gateway.pipeline.shared_profiles import SharedTrafficProfiles
from gateway.runtime import build_runtime, log_new_warnings
from gateway.settings import Settings, configure_logging
from gateway.upstreams.base import UpstreamClient
from gateway.upstreams.litellm_impl import LiteLLMClient
from gateway.upstreams.openai_impl import OpenAICompatibleClient
from policies import PolicyReloader, load_policy
from policies.document import FieldPath
from policies.schema import Policy
from policies.sections import Sections
from router import RoutingError, sandbox

log = logging.getLogger(__name__)

STOP_MARGIN_S = 5.0  # beyond shutdown_grace_s, for a component's own flush timeout


class GatewayApp(Starlette):
    """The gateway's ASGI app: plain Starlette routes, and its OpenAPI document. Its
    outermost layer answers the requests the shutdown grace cuts off
    (`gateway.http.shutdown`); the next one cancels those whose client disconnected
    before their answer (`gateway.http.disconnects`)."""

    def __init__(self, *args: Any, requests: Requests | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests = requests or Requests()  # the lifespan waits on the same

    def openapi(self) -> Schema:
        return openapi.document()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        await self.requests.serve(self._serve_watched, scope, receive, send, error_response)

    async def _serve_watched(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app, cancelled when its client disconnects before the answer."""
        await serve_watched(super().__call__, scope, receive, send)


async def openapi_json(request: Request) -> Response:
    return JSONResponse(openapi.document())


def create_app(settings: Settings | None = None) -> GatewayApp:
    settings = settings or Settings()
    # Set here, in every worker process (uvicorn's workers do not inherit the CLI's setup).
    configure_logging(settings.log_level, settings.log_format)
    decisions_level = logging.INFO if settings.log_decisions else logging.WARNING
    logging.getLogger(DECISIONS_LOGGER).setLevel(decisions_level)

    requests = Requests()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Services]]:
        services = await start_services(settings)
        unwatch = requests.watch_shutdown()  # the server's signals, noted first
        # Everything allocated so far lives as long as the process: keep it out of
        # the collector's scans, whose full passes would otherwise stall requests.
        gc.freeze()
        try:
            yield {"services": services}  # lifespan state: every request's `state`
        finally:
            # The requests the shutdown grace cancelled price what they had in flight
            # as they end: queued on the ledger before it flushes.
            await requests.settled()
            unwatch()
            await stop_services(services)

    routes: list[BaseRoute] = [
        *endpoints.ROUTES,
        *bridges.ROUTES,
        *spend_api.ROUTES,
        *dashboard_routes(),
        *admin.ROUTES,
    ]
    # The schema is served only when asked for (CASCADE_OPENAPI); `app.openapi()` builds
    # it either way.
    if settings.openapi:
        routes.append(Route("/openapi.json", openapi_json, methods=["GET"]))
    handlers = {
        GatewayError: gateway_error_handler,
        HTTPException: http_error_handler,
        RoutingError: routing_error_handler,
        Exception: unexpected_error_handler,
    }
    return GatewayApp(
        routes=routes,
        lifespan=lifespan,
        exception_handlers=handlers,
        requests=requests,
    )


def make_store(settings: Settings) -> LedgerStore:
    if settings.redis_url:
        return RedisStore.from_settings(settings)
    log.warning("REDIS_URL is not set: the ledger is in memory and lost on restart")
    return MemoryStore(
        stream_maxlen=settings.ledger_stream_maxlen, dedupe_ttl_s=settings.ledger_dedupe_window_s
    )


def start_archive(
    settings: Settings, store: LedgerStore, metrics: Metrics
) -> ArchiveExporter | None:
    """The archive exporter, running in the background, when CASCADE_LEDGER_ARCHIVE_DIR
    is set: it reads the ledger's streams, never the request path."""
    if settings.ledger_archive_dir is None:
        return None
    if not isinstance(store, RedisStore):
        log.warning("CASCADE_LEDGER_ARCHIVE_DIR is set without REDIS_URL: nothing is archived")
        return None
    options = ArchiveOptions(
        flush_s=settings.ledger_archive_flush_s, compact=settings.ledger_archive_compact
    )
    exporter = build_exporter(store, settings.ledger_archive_dir, options, metrics.archive)
    exporter.start()
    return exporter


def traffic_profiles(settings: Settings, metrics: Metrics) -> TrafficProfiles:
    """What select routes learn from traffic: shared through Redis when it is set."""

    def on_change(deployment: str, offset: float) -> None:
        metrics.child(metrics.select_offset, deployment).set(offset)

    if not settings.redis_url:
        return TrafficProfiles(on_change)
    return SharedTrafficProfiles.connect(
        settings.redis_url,
        settings.redis_prefix,
        cluster=settings.redis_cluster,
        on_change=on_change,
    )


async def check_ledger_layout(store: LedgerStore) -> None:
    """Refuse to start on a ledger laid out over another shard count (every write would
    fail); a Redis that does not answer yet is the ledger's outage, spooled as ever."""
    if not isinstance(store, RedisStore):
        return
    try:
        await store.check_layout()
    except LedgerUnavailable as exc:
        log.warning("cannot check the ledger's layout at startup (%s); checked on first use", exc)
    except LedgerLayoutError as exc:
        log.critical("refusing to start: %s", exc)
        await store.close()
        raise


async def check_limits_layout(
    limit_store: RedisLimitStore, policy: Policy, ledger_store: LedgerStore
) -> None:
    """On a cluster, refuse to start while this period's budgets still have their spend
    in the one `{limits}` slot it no longer reads (they would start again from zero)."""
    book = RuleBook.build(policy)
    periods = periods_at(time.time())
    budgets = [(rule, periods[rule.period]) for rules in book.budgets.values() for rule in rules]
    try:
        unmoved = await limit_store.unmoved(budgets)
    except LimitsStoreUnavailable as exc:
        log.warning("cannot check where the budgets are at startup (%s)", exc)
        return
    if unmoved:
        log.critical(
            "refusing to start: %s still in the one-slot layout; stop every gateway and run "
            "`cascade-gateway spend reshard --shards N` with CASCADE_REDIS_CLUSTER=true",
            ", ".join(unmoved),
        )
        await limit_store.close()
        await ledger_store.close()
        raise LimitsLayoutError(", ".join(unmoved))


def load_check(sections: Sections) -> Iterator[tuple[FieldPath, str]]:
    """`install_problems`, run where policies are loaded: in a worker thread. The sandbox's
    probe (a child process, up to 20 s, once) is started there too, so a (re)load that
    turns code runs on never makes the event loop wait for it at apply."""
    if any(
        route is not None and route.run_code_examples for route in (sections.routes or {}).values()
    ):
        sandbox.available()
    yield from install_problems(sections)


async def start_services(settings: Settings) -> Services:
    if settings.ledger_archive_dir is not None:
        check_installed()  # a clear error naming the extra, before serving
    loaded = await asyncio.to_thread(load_policy, settings.policy, install_check=load_check)
    metrics = Metrics()
    store = make_store(settings)
    await check_ledger_layout(store)
    redis_url, prefix = settings.redis_url, settings.redis_prefix
    limit_store = (
        RedisLimitStore(redis_url, prefix, cluster=settings.redis_cluster) if redis_url else None
    )
    if limit_store is not None:
        await check_limits_layout(limit_store, loaded.policy, store)
    spool = Spool(settings.spool_path, settings.ledger_dedupe_window_s)
    if redis_url and (problem := spool.unwritable()):
        # Said now, not at the first Redis outage, when spend would start to be lost.
        log.error(
            "the ledger's spool %s cannot be written (%s): spend recorded while Redis is "
            "away will be lost; set CASCADE_SPOOL_PATH to a writable file",
            settings.spool_path,
            problem,
        )
    ledger = CostLedger(store, spool, on_lost=metrics.ledger_lost.inc)
    ledger.start()
    # Where `serve` runs its autostart engines (gateway.cli); `engine up`'s default too.
    engines_dir = settings.spool_path.parent / "engines"
    guard = build_guard(
        metrics,
        loaded.policy,
        settings.redis_url,
        settings.redis_prefix,
        engines_dir,
        cluster=settings.redis_cluster,
    )
    clients: dict[str, UpstreamClient] = {
        "openai": OpenAICompatibleClient(
            settings.upstream_max_connections,
            settings.upstream_transport,
            on_load_report=guard.load.observe_header,
        ),
        "litellm": LiteLLMClient(),
    }
    accountant = Accountant(ledger, metrics, guard.load.prices)
    executor = Executor(clients, metrics, settings.max_retry_wait_s, guard)
    limits = Limiter(limit_store, metrics, ledger_spend=LedgerSpend(store))
    log_unserved(loaded)
    runtime = build_runtime(loaded)
    log_new_warnings(runtime, None)
    services = Services(
        settings=settings,
        runtime=runtime,
        metrics=metrics,
        store=store,
        ledger=ledger,
        accountant=accountant,
        proxy=Proxy(
            executor,
            accountant,
            metrics,
            guard=guard,
            limits=limits,
            traffic=traffic_profiles(settings, metrics),
        ),
        guard=guard,
        limits=limits,
        clients=clients,
        archive=start_archive(settings, store, metrics),
    )
    warm(services.runtime.routes.values(), settings.embedding_threads)
    await asyncio.wrap_future(tokens.warm(counted_models(services.runtime)))
    services.reloader = PolicyReloader(
        settings.policy,
        services.apply,
        interval_s=loaded.policy.gateway.reload_interval_s,
        initial=loaded,
        on_reject=services.reject,
        install_check=load_check,
    )
    services.reloader.start()
    guard.start(lambda: services.runtime)
    services.proxy.selector.traffic.start(lambda: services.runtime)
    limits.watch(lambda: services.runtime)
    return services


async def stop_services(services: Services) -> None:
    """Stop everything, in order; each step is bounded, so one stuck component (a Redis
    that stopped answering, say) cannot keep the process from exiting."""
    grace = services.settings.shutdown_grace_s
    reloader = [("policy reloader", services.reloader.stop)] if services.reloader else []
    steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
        *reloader,
        ("SLA guard", services.guard.stop),
        ("select routes' learning", services.proxy.selector.traffic.stop),
        ("limits", lambda: services.limits.stop(grace)),
        ("ledger", lambda: services.ledger.stop(grace)),
        *([("ledger archive", services.archive.stop)] if services.archive else []),
        *((f"{name} client", client.close) for name, client in services.clients.items()),
        ("ledger store", services.store.close),
    ]
    for name, stop in steps:
        try:
            async with asyncio.timeout(grace + STOP_MARGIN_S):
                await stop()
        except TimeoutError:
            log.error("stopping the %s took over %.0f s; going on without it", name, grace)


def error_response(request: Request, error: GatewayError) -> Response:
    request_id = getattr(request.state, "request_id", None) or new_request_id()
    services: Services | None = getattr(request.state, "services", None)
    route = str(getattr(request.state, "route", "-"))  # only names the policy has
    if services is not None:
        team = str(getattr(request.state, "team", "-"))
        m = services.metrics
        m.child(m.errors, route, error.type).inc()
        m.child(m.requests, route, "-", team, str(error.status)).inc()
        started = getattr(request.state, "started", None)
        if error.status >= 500 and route != "-" and started is not None:
            # What its client waited for nothing (a timeout, every upstream down): the
            # latency panels and p99 alerts must see it, under no deployment.
            m.child(m.latency, route, "-").observe(time.perf_counter() - started)
    if error.status >= 500:  # the gateway's or the upstreams' fault: an operator's to see
        told = error.message if error.detail is None else f"{error.message} ({error.detail})"
        log.warning("%s answered %d %s: %s", request_id, error.status, error.code, told)
    headers = {"x-request-id": request_id, **error.headers, **_error_headers(route, error)}
    body = bridges.error_body(request.url.path, error)  # each API in its own shape
    return JSONResponse(body, status_code=error.status, headers=headers)


def _error_headers(route: str, error: GatewayError) -> dict[str, str]:
    """What an error reply says of the route and the upstream calls behind it. After
    the gateway's own retries and fallbacks (more than one call) an upstream failure
    (502, 504, every deployment rate limiting) tells the SDKs not to retry: theirs
    would repeat every one of the gateway's calls (3 SDK tries x 3 calls each)."""
    headers = {"x-cascade-route": route} if route != "-" else {}
    if error.attempts:
        headers["x-cascade-attempts"] = str(error.attempts)
    upstream_failed = error.status in (502, 504) or error.code == "upstream_rate_limited"
    if error.attempts > 1 and upstream_failed:
        headers["x-should-retry"] = "false"
    return headers


async def gateway_error_handler(request: Request, exc: GatewayError) -> Response:
    return error_response(request, exc)


async def http_error_handler(request: Request, exc: HTTPException) -> Response:
    if exc.status_code == 404:
        error: GatewayError = NotFound(f"no such endpoint: {request.url.path}", code="not_found")
    else:
        # Its headers too: a 405 must say which methods are allowed (`Allow`).
        headers = dict(exc.headers or {})
        error = InvalidRequest(str(exc.detail), code=f"http_{exc.status_code}", headers=headers)
        error.status = exc.status_code  # type: ignore[misc]
    return error_response(request, error)


async def routing_error_handler(request: Request, exc: RoutingError) -> Response:
    """The router could not decide (e.g. its model file is unreadable): no guessing."""
    log.error("routing failed: %s", exc)
    error = UpstreamUnavailable(f"the router could not route this request: {exc}")
    return error_response(request, error)


async def unexpected_error_handler(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    error = GatewayError("internal error in the gateway; the request id identifies it in the logs")
    return error_response(request, error)
