"""From an upstream answer to a priced ledger record, metrics included.

Usage comes from the upstream when it reports it; otherwise it is counted with
the tokenizer (`usage_source="counted"`), which also covers streams cut short. The
prompt is counted once per encoding per request (`gateway.request.Call.prompt`, which admission's
count fills too). Settling never awaits, since a cancelled request must still be
priced, so the paths that settle first `await count_unreported(...)`: it counts a
long prompt off the event loop (cut short, settling counts it on the loop).
Records are queued on the ledger, whose writer batches them to the store, so the
reply never waits on Redis; the ledger spools when Redis is down and flushes at
shutdown, so a record accepted here is written exactly once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.billing.pricing import TokenPrice
from gateway.billing.tokens import PromptCounts, count_text
from gateway.billing.usage import CLASS_NAMES, NO_CLASSES, TokenClasses, token_classes, token_count
from gateway.ledger import CostLedger, SpendRecord
from gateway.ledger.record import UNANSWERED, StatusType, UsageSourceType, usd
from gateway.metrics import Metrics
from gateway.request import Call, asked_tokens, choices_of
from gateway.runtime import DeploymentRuntime, RouteRuntime, sla_met
from gateway.upstreams.base import EndpointType
from router.target_selection import Choice

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    source: UsageSourceType
    # Parts of the two totals priced apart (cache reads and writes, reasoning, audio,
    # image): only an upstream's usage reports them; counted tokens are plain.
    classes: TokenClasses = NO_CLASSES


def reported_usage(body: Mapping[str, Any]) -> Usage | None:
    """The usage a reply or stream chunk reports, its token classes included; None
    when it reports none, or no whole, non-negative prompt and completion counts."""
    usage = body.get("usage")
    if not isinstance(usage, Mapping):
        return None
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens", 0)
    if not _whole(prompt) or not _whole(completion):
        return None
    return Usage(token_count(prompt), token_count(completion), "upstream", token_classes(usage))


def _whole(value: Any) -> bool:
    if type(value) is int:  # the usual count, read without token_count's checks
        return value >= 0
    return value == token_count(value) and not isinstance(value, bool)


def choice_texts(body: Mapping[str, Any]) -> Iterable[str]:
    """Generated text in a reply or a stream chunk: content, tool-call arguments, text."""
    for choice in body.get("choices") or ():
        if not isinstance(choice, Mapping):
            continue
        message = choice.get("message") or choice.get("delta") or {}
        if isinstance(message, Mapping):
            if isinstance(message.get("content"), str):
                yield message["content"]
            for call in message.get("tool_calls") or ():
                arguments = (call.get("function") or {}).get("arguments")
                if isinstance(arguments, str):
                    yield arguments
        if isinstance(choice.get("text"), str):
            yield choice["text"]


def counted_usage(
    deployment: DeploymentRuntime,
    endpoint: EndpointType,
    request: Mapping[str, Any],
    texts: Iterable[str],
    prompt: PromptCounts,
) -> Usage:
    """The prompt and the text counted with the gateway's tokenizer for the model."""
    completion = counted_output(deployment, endpoint, request, texts)
    return Usage(prompt.get(deployment.target.model, endpoint, request), completion, "counted")


def counted_output(
    deployment: DeploymentRuntime,
    endpoint: EndpointType,
    request: Mapping[str, Any],
    texts: Iterable[str],
) -> int:
    """The text's tokens, never more than the upstream was asked for: each answer's cap
    (the request's, the deployment's) times the answers. A count above it is our
    tokenizer's, not the upstream's (another vocabulary, a script it splits finer):
    billing stays within what was sent, and so within what the budget held."""
    counted = sum(count_text(deployment.target.model, text) for text in texts)
    caps = [c for c in (asked_tokens(request), deployment.max_output_tokens) if c is not None]
    return min(counted, min(caps) * choices_of(endpoint, request)) if caps else counted


def reply_usage(
    deployment: DeploymentRuntime,
    endpoint: EndpointType,
    request: Mapping[str, Any],
    reply: Mapping[str, Any],
    prompt: PromptCounts,
) -> Usage:
    """A non-streamed reply's usage: as reported, else counted from its text."""
    return reported_usage(reply) or counted_usage(
        deployment, endpoint, request, choice_texts(reply), prompt
    )


async def count_unreported(
    prompt: PromptCounts,
    endpoint: EndpointType,
    request: Mapping[str, Any],
    answers: Iterable[tuple[DeploymentRuntime, Mapping[str, Any] | None]],
) -> None:
    """Count the prompt for each answer that reports no usage (None: nothing reported,
    as for an attempt cut off), so that settling it later counts nothing on the loop."""
    models = [d.target.model for d, reply in answers if reply is None or not reported_usage(reply)]
    await prompt.prepare(models, endpoint, request)


def _sla_verdict(
    route: RouteRuntime,
    status: StatusType,
    label: str | None,
    ttft_s: float | None,
    latency_s: float,
    missed: bool,
    delivered: bool,
) -> bool | None:
    if label or not delivered:  # e.g. a hedge that lost the race: priced, not judged
        return None
    if status in UNANSWERED:  # no answer: missed if the route's fault, however fast it failed
        return False if missed and route.sla is not None and route.sla.promises_time else None
    return sla_met(route, ttft_s, latency_s)


def _selected(choice: Choice | None, deployment: str) -> dict[str, Any]:
    """A `select` route's record: the deployment's predicted quality and the target."""
    if choice is None:
        return {}
    estimate = choice.estimates.get(deployment)
    return {
        "predicted_quality": None if estimate is None else round(estimate.quality, 4),
        "quality_target": round(choice.target, 4),
    }


def _reference(route: RouteRuntime, endpoint: EndpointType) -> tuple[str | None, TokenPrice | None]:
    """The reference model (and its price) that `endpoint`'s records on `route` are
    compared with; none on a route without one (its first deployment is no
    counterfactual), nor for embeddings unless the reference is an embedding model: a
    chat model's input price is no counterfactual for a vector."""
    if endpoint == "embeddings" and not route.reference_embeds:
        return None, None
    return route.reference_model, route.reference_price


def _reference_cost(price: TokenPrice | None, usage: Usage) -> int:
    """What the usage would cost on the reference model; 0 without one."""
    if price is None:
        return 0
    return price.cost_nanos(usage.prompt_tokens, usage.completion_tokens, usage.classes)


def _classes(usage: Usage, price: TokenPrice) -> dict[str, int]:
    """A record's token classes and what the prompt cache saved (none: the defaults)."""
    classes = usage.classes
    if classes == NO_CLASSES:
        return {}
    counts = {f"{name}_tokens": getattr(classes, name) for name in CLASS_NAMES}
    saved = price.cache_savings_nanos(usage.prompt_tokens, usage.completion_tokens, classes)
    return {**counts, "cache_savings_nanos": saved}


def _record_id(request_id: str, attempt: int, label: str | None) -> str:
    """`<request id>` for the first answer, `<request id>:<n>` for the n-th answer after
    it (a cascade's escalations), `<request id>:<label>` for other extra attempts (`h1`:
    a hedge that lost the race, `o1`: a second opinion)."""
    if label is not None:
        return f"{request_id}:{label}"
    return request_id if attempt == 0 else f"{request_id}:{attempt}"


class OutputLengths:
    """Each route's typical answer length in tokens, from the answers priced: a moving
    mean in which each answer weighs `DECAY` (what `select` expects a request to cost)."""

    DECAY = 0.1

    def __init__(self) -> None:
        self._tokens: dict[str, float] = {}

    def get(self, route: str) -> float | None:
        return self._tokens.get(route)

    def add(self, route: str, completion_tokens: int) -> None:
        known = self._tokens.get(route)
        step = completion_tokens if known is None else self.DECAY * (completion_tokens - known)
        self._tokens[route] = (known or 0.0) + step


class Accountant:
    def __init__(
        self,
        ledger: CostLedger,
        metrics: Metrics,
        measured_prices: Mapping[str, TokenPrice] | None = None,
    ) -> None:
        self._ledger = ledger
        self._metrics = metrics
        # Self-hosted deployments priced from measured throughput (kept by the load view);
        # a deployment missing here is priced from the policy.
        self._measured = measured_prices if measured_prices is not None else {}
        self.output_lengths = OutputLengths()

    def settle(
        self,
        call: Call,
        deployment: DeploymentRuntime,
        usage: Usage,
        *,
        attempt: int = 0,
        escalations: int | None = None,
        status: StatusType = "ok",
        ttft_s: float | None = None,
        label: str | None = None,
        verifier_score: float | None = None,
        answered_at: float | None = None,
        missed_sla: bool = False,
        delivered: bool = True,
        reference: Usage | None = None,
    ) -> SpendRecord:
        """Price one attempt, count it in metrics and hand it to the ledger.
        `answered_at` (perf_counter) is when the answer came, if it is settled later
        (a cascade judges it first); its time and latency are those of then. Only an
        answer the client got (`delivered`, and no `label`) is judged against the SLA.

        The request's first answer (attempt 0, no `label`) carries the reference cost:
        what the request would have cost sent once to the route's reference model.
        Escalations, hedges and second opinions add cost only, so savings are not
        counted once per attempt. `reference`: the tokens it prices, when not this
        answer's own (a cascade's delivered answer). A route without a reference model
        records none, nor do embeddings against a chat model (`_reference`)."""
        first_answer = attempt == 0 and label is None and status not in UNANSWERED
        route = call.route
        reference_model, reference_price = _reference(route, call.endpoint)
        now = time.perf_counter()
        ended = now if answered_at is None else answered_at
        latency_ms = round((ended - call.started) * 1000, 3)
        ttft_ms = None if ttft_s is None else round(ttft_s * 1000, 3)
        price = self.price_of(deployment)
        record = SpendRecord(
            # Escalations of a cascade are priced too, each under its own id.
            record_id=_record_id(call.request_id, attempt, label),
            request_id=call.request_id,
            ts=time.time() - (now - ended),  # when it finished, though settled later
            team=call.team,
            key=call.key,
            route=route.name,
            tier=deployment.tier,
            deployment=deployment.name,
            model=deployment.target.model,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cost_nanos=price.cost_nanos(
                usage.prompt_tokens, usage.completion_tokens, usage.classes
            ),
            reference_model=reference_model,
            reference_cost_nanos=(
                _reference_cost(reference_price, reference or usage) if first_answer else 0
            ),
            status=status,
            usage_source=usage.source,
            stream=call.stream,
            latency_ms=latency_ms,
            ttft_ms=ttft_ms,
            escalations=attempt if escalations is None else escalations,
            score=call.score,
            sla_met=_sla_verdict(
                route, status, label, ttft_s, latency_ms / 1000, missed_sla, delivered
            ),
            verifier_score=verifier_score,
            surface=call.surface,
            **_selected(call.choice, deployment.name),
            **_classes(usage, price),
        )
        if call.choice is not None and record.status == "ok" and label is None:
            self.output_lengths.add(route.name, record.completion_tokens)  # what `select` expects
        self._observe(record, deployment)
        self._ledger.submit(record)
        call.records.append(record)
        return record

    def settle_failure(
        self,
        call: Call,
        deployment: DeploymentRuntime,
        missed_sla: bool,
        status: StatusType = "error",
    ) -> SpendRecord:
        """A request that got no answer at all: one `error` record under its id, with no
        tokens, cost or reference, so that the ledger's `requests` and `errors` count it
        (`deployment`: the first the plan named; which of them failed is in the logs).
        `missed_sla`: the route's fault (upstreams failed), not the client's. `status`
        `cancelled`: its client hung up first; `requests` counts it, `errors` does not."""
        usage = Usage(0, 0, "none")
        return self.settle(call, deployment, usage, status=status, missed_sla=missed_sla)

    def cut_off_pricer(self, call: Call) -> Callable[[DeploymentRuntime], None]:
        """What prices an attempt of `call` that was sent and then timed out: its prompt
        (of `call.body` as it is then), as for a losing hedge (`<request id>:t<n>`,
        `partial`); the upstream had it."""

        def price(deployment: DeploymentRuntime) -> None:
            usage = counted_usage(deployment, call.endpoint, call.body, (), call.prompt)
            prefix = f"{call.request_id}:t"
            n = 1 + sum(r.record_id.startswith(prefix) for r in call.records)
            self.settle(call, deployment, usage, status="partial", label=f"t{n}")

        return price

    def price_of(self, deployment: DeploymentRuntime) -> TokenPrice:
        return self._measured.get(deployment.name) or deployment.price

    def _observe(self, record: SpendRecord, deployment: DeploymentRuntime) -> None:
        m = self._metrics
        labels = (record.route, record.deployment, record.team)
        m.child(m.tokens, *labels, "prompt").inc(record.prompt_tokens)
        m.child(m.tokens, *labels, "completion").inc(record.completion_tokens)
        m.child(m.cost, *labels).inc(usd(record.cost_nanos))
        if record.has_reference:  # else no series: a zero one would read as a 100% loss
            reference = usd(record.reference_cost_nanos)
            m.child(m.reference_cost, record.route, record.team).inc(reference)
        if not deployment.price.priced and record.status not in UNANSWERED:
            m.child(m.unpriced, record.deployment).inc()
