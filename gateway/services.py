"""Everything a handler needs, built in the app's lifespan and closed with it."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from starlette.requests import Request

from gateway.accounting import Accountant
from gateway.ledger import CostLedger, LedgerStore
from gateway.limits import Limiter
from gateway.metrics import Metrics
from gateway.proxy import Proxy
from gateway.runtime import Runtime, build_runtime
from gateway.scoring import warm
from gateway.settings import Settings
from gateway.sla import SlaGuard
from gateway.upstreams.base import UpstreamClient
from policies import LoadedPolicy, PolicyError, PolicyReloader
from policies.unserved import unserved_notes

log = logging.getLogger(__name__)


@dataclass
class Services:
    settings: Settings
    runtime: Runtime  # swapped whole on reload; a request reads it once
    metrics: Metrics
    store: LedgerStore
    ledger: CostLedger
    accountant: Accountant
    proxy: Proxy
    clients: dict[str, UpstreamClient]
    guard: SlaGuard
    limits: Limiter
    reloader: PolicyReloader | None = None

    def apply(self, loaded: LoadedPolicy) -> None:
        """Swap in a newly loaded policy (called by the reloader, also for /admin/reload)."""
        self.runtime = build_runtime(loaded)
        log_unserved(loaded)
        warm(self.runtime.routes.values(), self.settings.embedding_threads)
        self.guard.configure(loaded.policy)
        self.metrics.policy_reloads.labels("ok").inc()
        log.info("policy reloaded (digest %s)", loaded.digest[:12])

    def reject(self, error: PolicyError) -> None:
        """A bad edit was refused (by the poller or /admin/reload): count it."""
        self.metrics.policy_reloads.labels("rejected").inc()

    def last_reload_error(self) -> str | None:
        error = self.reloader.last_error if self.reloader is not None else None
        return None if error is None else str(error)


def log_unserved(loaded: LoadedPolicy) -> None:
    for note in unserved_notes(loaded.policy):
        log.warning("policy %s: %s", ", ".join(map(str, loaded.source)), note)


def services_of(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


async def get_services(request: Request) -> Services:
    """FastAPI dependency. Async on purpose: FastAPI runs a plain `def` dependency in
    a worker thread, which costs more than the whole proxying of a request."""
    return services_of(request)
