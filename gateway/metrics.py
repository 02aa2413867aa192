"""Prometheus metrics, on a registry owned by the app (no module globals), so
several apps in one process (tests) do not collide.

With several worker processes (`serve --workers N`) a scrape reaches one of them, so
counters and histograms are kept in prometheus_client's multiprocess files
(`PROMETHEUS_MULTIPROC_DIR`, which `serve` sets up) and every scrape sums every
worker's: a counter read from whichever worker answers would jump between their
values, and Prometheus would take each drop for a reset. Gauges are the answering
worker's own view (the policy it serves, its breakers, the engine load it scraped), but
for budgets remaining, which every worker reads from the limits store at the scrape.

Names are a contract with dashboards/ and alert rules: change them together.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
    values,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

# Where worker processes keep their counters (read by prometheus_client at import).
MULTIPROCESS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
# Whether prometheus_client keeps values in those files: what it chose when imported.
MULTIPROCESS = values.ValueClass is not values.MutexValue

# Latency buckets in seconds: gateway overhead is sub-millisecond, LLM calls take seconds.
# Dense from 0.5 s to 5 s, where SLA targets sit (`histogram_quantile` interpolates
# within a bucket: with 1-2.5 s one bucket, a 1.1 s p99 read as 2.48 s against a 2 s
# target), and up to `request_timeout_s`'s 300 s.
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0,
    7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0,
)  # fmt: skip

ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST
CLIENT_CLOSED = "499"  # the status label of a request whose client hung up first


class Metrics:
    def __init__(self) -> None:
        self.child = LabelCache()  # self.child(self.requests, "auto", ...).inc()
        self.registry = CollectorRegistry()
        r = self.registry
        if not MULTIPROCESS:  # one process's figures would pass for every worker's
            ProcessCollector(registry=r)  # process_*: memory, CPU, open files
            PlatformCollector(registry=r)
            GCCollector(registry=r)
        self.requests = Counter(
            "cascade_requests",
            "Requests answered, by route, deployment, team and HTTP status",
            ["route", "deployment", "team", "status"],
            registry=r,
        )
        self.errors = Counter(
            "cascade_errors", "Error replies by route and error type", ["route", "type"], registry=r
        )
        self.latency = Histogram(
            "cascade_request_duration_seconds",
            "End-to-end request latency through the gateway",
            ["route", "deployment"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "cascade_ttft_seconds",
            "Time to first token through the gateway, of streamed requests only (to the "
            "first chunk relayed); a non-streamed answer's is cascade_request_duration_seconds",
            ["route", "deployment"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "cascade_tokens",
            "Tokens by route, deployment, team and kind (prompt or completion)",
            ["route", "deployment", "team", "kind"],
            registry=r,
        )
        self.cost = Counter(
            "cascade_cost_usd",
            "Spend in USD by route, deployment and team",
            ["route", "deployment", "team"],
            registry=r,
        )
        self.reference_cost = Counter(
            "cascade_reference_cost_usd",
            "What the same requests would have cost on the route's reference model",
            ["route", "team"],
            registry=r,
        )
        self.router_score = Histogram(
            "cascade_router_score",
            "Complexity scores of requests on routes that route by score",
            ["route"],
            buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
            registry=r,
        )
        self.verifier_score = Histogram(
            "cascade_verifier_score",
            "Cascade verifier scores of the answers it judged (below verify_threshold "
            "escalates), by route",
            ["route"],
            # Finer near 1, where thresholds of confident verifiers sit.
            buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 1.0),
            registry=r,
        )
        self.escalations = Counter(
            "cascade_escalations",
            "Cascade escalations: answers the verifier rejected, by route",
            ["route"],
            registry=r,
        )
        self.second_opinions = Counter(
            "cascade_second_opinions",
            "Second opinions on verified cascade answers, by route, deployment and outcome "
            "(agree, disagree, no_answer: nothing to compare, failed: errored or too late)",
            ["route", "deployment", "outcome"],
            registry=r,
        )
        self.code_runs = Counter(
            "cascade_code_runs",
            "Cascade answers' code run against their own examples (routes with "
            "run_code_examples), by route and outcome (held: every example held, failed: "
            "some failed or the code did not run, none: no examples to run or no time "
            "left, busy: every run slot and queue place taken, error: the sandbox "
            "could not start)",
            ["route", "outcome"],
            registry=r,
        )
        self.judge_calls = Counter(
            "cascade_judge_calls",
            "Cascade answers graded by the route's judge, by route and outcome (ok; "
            "fallback_timeout, fallback_error, unparsed: the verifier decided)",
            ["route", "outcome"],
            registry=r,
        )
        self.select_choices = Counter(
            "cascade_select_choices",
            "Requests of select routes by the deployment chosen first and whether its "
            "predicted quality met the route's target (met: true/false)",
            ["route", "deployment", "met"],
            registry=r,
        )
        self.select_offset = Gauge(
            "cascade_select_quality_offset",
            "What live verdicts moved a deployment's predicted quality by (bounded to "
            "+-0.25), on select routes that verify",
            ["deployment"],
            registry=r,
        )
        self.upstream_attempts = Counter(
            "cascade_upstream_attempts",
            "Upstream calls by deployment and outcome (ok, retry, fallback, cancelled hedge; "
            "stream_error: a stream counted ok when it opened that its upstream broke later)",
            ["deployment", "outcome"],
            registry=r,
        )
        self.unpriced = Counter(
            "cascade_unpriced_requests",
            "Requests served by a deployment with no known price",
            ["deployment"],
            registry=r,
        )
        self.ledger_spooled = Gauge(
            "cascade_ledger_spooled_records",
            "Spend records in the local spool, waiting for the ledger store to return",
            registry=r,
        )
        self.ledger_expired = Gauge(
            "cascade_ledger_expired_records",
            "Spooled spend records older than the ledger's dedupe window: not replayed "
            "(they may be written already), kept in the spool's .expired file to reconcile",
            registry=r,
        )
        self.ledger_degraded = Gauge(
            "cascade_ledger_degraded", "1 while the ledger store is unreachable", registry=r
        )
        self.ledger_lost = Counter(
            "cascade_ledger_lost_records",
            "Spend records lost: the ledger store was down and the spool could not be "
            "written (every worker's, summed)",
            registry=r,
        )
        self.policy_reloads = Counter(
            "cascade_policy_reloads", "Policy reload attempts by result", ["result"], registry=r
        )
        self.policy_edit_rejected = Gauge(
            "cascade_policy_edit_rejected",
            "1 while the policy on disk is an edit that was rejected (the last good policy "
            "keeps serving)",
            registry=r,
        )
        self.deployment_available = Gauge(
            "cascade_deployment_available",
            "1 when a deployment is configured and usable",
            ["deployment", "tier"],
            registry=r,
        )

        self._add_sla_metrics(r)
        self._add_limit_metrics(r)
        self.archive = ArchiveMetrics(r)

    def _add_sla_metrics(self, r: CollectorRegistry) -> None:
        self.tier_requests = Counter(
            "cascade_tier_requests",
            "Answered requests by route and the tier that answered (the router's tier mix)",
            ["route", "tier"],
            registry=r,
        )
        self.sla_requests = Counter(
            "cascade_sla_requests",
            "Requests on routes with an SLA, by whether they met it (met, missed)",
            ["route", "outcome"],
            registry=r,
        )
        self.sla_target = Gauge(
            "cascade_sla_target_seconds",
            "A route's SLA targets from the policy (kind: ttft, timeout, p99), for alert rules",
            ["route", "kind"],
            registry=r,
        )
        self.sla_shed = Counter(
            "cascade_sla_shed",
            "Requests refused (429) because no deployment was predicted to meet the SLA",
            ["route"],
            registry=r,
        )
        self.hedges = Counter(
            "cascade_hedges",
            "Hedged requests: fired (a second deployment asked) and won (it answered first)",
            ["route", "outcome"],
            registry=r,
        )
        self.breaker_state = Gauge(
            "cascade_breaker_state",
            "Circuit breaker per deployment: 0 closed, 1 half-open, 2 open (ejected)",
            ["deployment"],
            registry=r,
        )
        self.deployment_warming = Gauge(
            "cascade_deployment_warming",
            "1 while a deployment's self-hosted engine is loading (requests wait for it or "
            "go elsewhere; its breaker does not count the refused connections)",
            ["deployment"],
            registry=r,
        )
        self.upstream_ttft = Histogram(
            "cascade_upstream_ttft_seconds",
            "Upstream time to first token per deployment (non-streaming: to the answer)",
            ["deployment"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.upstream_itl = Histogram(
            "cascade_upstream_itl_seconds",
            "Mean inter-token (inter-event) time of each upstream stream, per deployment",
            ["deployment"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.upstream_duration = Histogram(
            "cascade_upstream_duration_seconds",
            "Upstream time of successful attempts, per deployment: a non-streamed answer's "
            "whole time, a stream's from its first events to its end",
            ["deployment"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.predicted_ttft = Gauge(
            "cascade_deployment_predicted_ttft_seconds",
            "The latency model's predicted TTFT per deployment (p90 scaled by queue)",
            ["deployment"],
            registry=r,
        )
        self.engine_requests = Gauge(
            "cascade_engine_requests",
            "Requests in a self-hosted engine as it reports them (running, waiting)",
            ["deployment", "state"],
            registry=r,
        )
        self.engine_kv_cache = Gauge(
            "cascade_engine_kv_cache_usage",
            "KV-cache usage (0..1) a self-hosted engine reports",
            ["deployment"],
            registry=r,
        )

    def _add_limit_metrics(self, r: CollectorRegistry) -> None:
        budget = ["scope", "name", "period"]
        self.budget_remaining = Gauge(
            "cascade_budget_remaining_usd",
            "Budget left in the current period (limit minus settled spend), read from the "
            "limits store at the scrape",
            budget,
            registry=r,
        )
        self.budget_soft_remaining = Gauge(
            "cascade_budget_soft_limit_remaining_usd",
            "What is left before a budget's soft limit in the current period (negative: past "
            "it), read with cascade_budget_remaining_usd; budgets with a soft limit only",
            budget,
            registry=r,
        )
        self.budget_soft_crossings = Counter(
            "cascade_budget_soft_limit_crossings",
            "Settlements that took a budget's spend past its soft limit",
            budget,
            registry=r,
        )
        self.budget_rejections = Counter(
            "cascade_budget_rejections",
            "Requests refused (429) by a hard budget",
            budget,
            registry=r,
        )
        self.budget_downgrades = Counter(
            "cascade_budget_downgrades",
            "Requests sent to a budget's downgrade tier because it is past its soft limit",
            budget,
            registry=r,
        )
        self.budget_overrun = Counter(
            "cascade_budget_overrun_usd",
            "What requests cost beyond the worst case their budgets reserved (an upstream "
            "that billed more than it was asked for, or timed-out attempts' prompts)",
            ["route", "deployment"],
            registry=r,
        )
        self.rate_limit_rejections = Counter(
            "cascade_rate_limit_rejections",
            "Requests refused (429) by a rate limit, by scope (key or team), name and kind",
            ["scope", "name", "kind"],
            registry=r,
        )
        self.limits_unavailable = Counter(
            "cascade_limits_unavailable",
            "Requests whose limits could not be checked (store down), by action: "
            "served_unchecked (fail open) or refused (fail closed)",
            ["action"],
            registry=r,
        )
        self.limits_degraded = Gauge(
            "cascade_limits_degraded", "1 while the limits store is unreachable", registry=r
        )
        self.limits_pending = Gauge(
            "cascade_limits_pending_settlements",
            "Budget settlements waiting to be written to the limits store",
            registry=r,
        )

    def count_client_closed(self, route: str, team: str) -> None:
        """A request whose client hung up before its answer: status 499, as proxies log
        it, under no deployment (not an error of the gateway's)."""
        self.child(self.requests, route, "-", team, CLIENT_CLOSED).inc()

    def render(self) -> bytes:
        if MULTIPROCESS:
            return generate_latest(_AllWorkers(self.registry))
        return generate_latest(self.registry)

    def prune(self, gauge: Gauge, keep: Callable[[tuple[str, ...]], bool]) -> None:
        """Drop `gauge`'s series whose label values `keep` refuses (what a reloaded policy
        no longer has: a gauge left behind reads as a live figure, and can keep an alert
        firing), and the cached children that would write to them."""
        # prometheus_client's series by label values, edited under its lock: its
        # `remove` refuses (with a warning) in multiprocess mode, where this worker's
        # own gauges are all a scrape shows of them anyway.
        with gauge._lock:
            for values in [v for v in gauge._metrics if not keep(tuple(v))]:
                del gauge._metrics[values]
                self.child.forget(gauge, tuple(values))


class ArchiveMetrics:
    """The spend archive's exporter (gateway.ledger.archive), by ledger event stream. Its
    figures are read from Redis, the same whichever exporter reads them: max them across
    instances. A `spend export` sidecar serves these alone (--metrics-port)."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.backlog = Gauge(
            "cascade_ledger_archive_backlog_records",
            "Spend records in the ledger's event stream not archived yet (unread and "
            "pending): MAXLEN drops the oldest once the stream reaches its cap",
            ["stream"],
            registry=r,
        )
        self.dropped = Gauge(
            "cascade_ledger_archive_dropped_records",
            "Spend records trimmed from the event stream (MAXLEN) before they were "
            "archived, since the archive began: a total kept in Redis, so it only grows",
            ["stream"],
            registry=r,
        )
        self.stream_cap = Gauge(
            "cascade_ledger_archive_stream_cap",
            "The event stream's MAXLEN (CASCADE_LEDGER_STREAM_MAXLEN), for the backlog alert",
            ["stream"],
            registry=r,
        )
        self.archived = Counter(
            "cascade_ledger_archived_records",
            "Spend records this process archived (written to Parquet and acked)",
            ["stream"],
            registry=r,
        )


class _AllWorkers:
    """A multiprocess scrape: every worker's counters and histograms, summed from their
    files, and this worker's gauges."""

    def __init__(self, own: CollectorRegistry) -> None:
        self._own = own

    def collect(self) -> Iterator[Metric]:
        for family in MultiProcessCollector(None).collect():  # type: ignore[no-untyped-call]
            if family.type != "gauge":
                yield family
        for family in self._own.collect():
            if family.type == "gauge":
                yield family


class LabelCache:
    """Children of labelled metrics by label values. `labels()` validates and locks on
    every call; the request path asks for the same few children over and over."""

    def __init__(self) -> None:
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def __call__(self, metric: MetricWrapperBase, *labels: str) -> Any:
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def forget(self, metric: MetricWrapperBase, labels: tuple[str, ...]) -> None:
        self._children.pop((id(metric), labels), None)
