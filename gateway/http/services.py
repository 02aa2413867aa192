"""Everything a handler needs, built in the app's lifespan and closed with it."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.requests import Request

from gateway.billing import tokens
from gateway.health.sla import SlaGuard
from gateway.ledger import CostLedger, LedgerStore
from gateway.limits import Limiter
from gateway.metrics import Metrics
from gateway.pipeline.accounting import Accountant
from gateway.pipeline.proxy import Proxy
from gateway.pipeline.scoring import warm
from gateway.runtime import Runtime, build_runtime, new_warnings
from gateway.settings import Settings
from gateway.upstreams.base import UpstreamClient
from policies import LoadedPolicy, Policy, PolicyError, PolicyReloader
from policies.changes import policy_changes
from policies.unserved import unserved_notes

if TYPE_CHECKING:
    from gateway.ledger.archive import ArchiveExporter

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
    archive: ArchiveExporter | None = None  # CASCADE_LEDGER_ARCHIVE_DIR's exporter

    def apply(self, loaded: LoadedPolicy) -> None:
        """Swap in a newly loaded policy (called by the reloader, also for /admin/reload)."""
        serving = self.runtime
        self.runtime = build_runtime(loaded)
        log_changes(serving.policy, loaded, new_warnings(self.runtime, serving))
        warm(self.runtime.routes.values(), self.settings.embedding_threads)
        tokens.warm(counted_models(self.runtime))
        self.guard.configure(loaded.policy)
        self.metrics.policy_reloads.labels("ok").inc()

    def reject(self, error: PolicyError) -> None:
        """A bad edit was refused (by the poller or /admin/reload): count it."""
        self.metrics.policy_reloads.labels("rejected").inc()

    def last_reload_error(self) -> str | None:
        error = self.reloader.last_error if self.reloader is not None else None
        return None if error is None else str(error)


def counted_models(runtime: Runtime) -> set[str]:
    """The upstream models whose tokens the gateway may count (those reporting no usage)."""
    return {deployment.target.model for deployment in runtime.deployments.values()}


def log_unserved(loaded: LoadedPolicy) -> None:
    """The first load's full picture: every warning the policy has."""
    for note in unserved_notes(loaded.policy):
        log.warning("policy %s: %s", ", ".join(map(str, loaded.source)), note)


def log_changes(
    serving: Policy, loaded: LoadedPolicy, built: Sequence[tuple[int, str]] = ()
) -> None:
    """A reload's log: what changed from the serving policy, one line each, then the new
    runtime's own new warnings (`built`: a deployment left unpriced...); a warning the
    serving policy had already stays silent."""
    changes = policy_changes(serving, loaded.policy)
    source, digest = ", ".join(map(str, loaded.source)), loaded.digest[:12]
    if not changes and not built:
        log.debug("policy reloaded from %s (digest %s): nothing changed", source, digest)
        return
    warned = len(changes.warnings) + len(built)
    counts = f"{len(changes.changed)} changes, {warned} new warnings"
    log.info("policy reloaded from %s (digest %s): %s", source, digest, counts)
    for line in changes.changed:
        log.info("policy change: %s", line)
    for line in changes.warnings:
        log.warning("policy change: %s", line)
    for level, message in built:
        log.log(level, "%s", message)


def services_of(request: Request) -> Services:
    services: Services = request.state.services
    return services
