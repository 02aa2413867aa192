"""A loaded policy compiled for the request path: prices, upstream targets, key table.

A `Runtime` is immutable. A reload builds a new one and swaps the reference, so a
request keeps the snapshot it started with while new requests see the new policy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from gateway.auth import ANONYMOUS_KEY_ID, KeyTable, Principal
from gateway.billing.pricing import (
    UNPRICED,
    TokenPrice,
    litellm_class_rates,
    lookup_litellm,
    policy_price,
    self_hosted_price,
)
from gateway.errors import NotFound
from gateway.upstreams.base import UpstreamTarget
from local_engine.sentence_model import missing as embeddings_missing
from policies import LoadedPolicy
from policies.capabilities import OPENAI_SERVES, default_capabilities
from policies.engines import EngineSpec
from policies.keys import hash_key
from policies.prices import litellm_entry, litellm_price_map
from policies.schema import OPENAI_COMPATIBLE, Deployment, Policy, Route, Sla
from router import DeploymentView, Plan, RouteSpec, Threshold, plan_route, sandbox
from router.target_selection import FLOOR_PROFILE, Choice, prior_profile

log = logging.getLogger(__name__)

# vLLM's `priority` request field for `--scheduling-policy priority` (lower runs first).
VLLM_PRIORITY = {"interactive": 0, "batch": 10}
# Tokens of a judge's prompt besides the question and the answer (rubric, framing),
# rounded up: what budgets hold for each judgement.
JUDGE_OVERHEAD_TOKENS = 256


@dataclass(frozen=True, slots=True)
class DeploymentRuntime:
    name: str
    tier: str
    provider: str
    target: UpstreamTarget
    price: TokenPrice
    max_retries: int
    retry_backoff_s: float
    unavailable_reason: str | None
    priority_scheduling: bool = False
    returns_logprobs: bool = False  # answers `logprobs: true` with token logprobs
    max_output_tokens: int | None = None  # never asked for more per answer
    # What it serves (policies.capabilities): requests needing more skip it.
    capabilities: frozenset[str] = OPENAI_SERVES
    unset_env: tuple[str, ...] = ()  # what to set for it to be available
    # The known model it behaves like, for `select` routes: the policy's
    # `quality_profile`, else the prior of its price (`prior_profile`).
    quality_profile: str = FLOOR_PROFILE

    @property
    def view(self) -> DeploymentView:
        return DeploymentView(self.name, self.tier, self.unavailable_reason, self.capabilities)

    def serves(self, needs: frozenset[str]) -> bool:
        return needs <= self.capabilities


@dataclass(frozen=True, slots=True)
class RouteSla:
    """A route's SLA as the request path uses it (seconds, not milliseconds)."""

    ttft_s: float | None
    timeout_s: float | None
    load_aware: bool
    on_miss: str
    hedge_after_s: float | None
    max_hedges: int
    priority: int | None  # vLLM's `priority` (lower runs first) for priority-scheduled engines
    p99_s: float | None = None  # end-to-end p99 target: reported against, not enforced

    @property
    def promises_time(self) -> bool:
        """Whether it sets a time to keep (a priority or a hedge alone promises none)."""
        return self.ttft_s is not None or self.timeout_s is not None

    def met(self, ttft_s: float, total_s: float) -> bool | None:
        """Did a request keep this SLA: first token within `ttft_s` (a non-streamed
        answer's first token is the answer) and all of it within `timeout_s`, counted from
        arrival? None when the SLA sets neither."""
        if not self.promises_time:
            return None
        return (self.ttft_s is None or ttft_s <= self.ttft_s) and (
            self.timeout_s is None or total_s <= self.timeout_s
        )


@dataclass(frozen=True, slots=True)
class RouteRuntime:
    name: str
    strategy: str
    deployments: tuple[str, ...]
    # What savings are counted against; None without a `reference_model` (and for a
    # deployment asked for by name): no counterfactual, so no reference cost.
    reference_model: str | None
    reference_price: TokenPrice | None
    max_body_bytes: int | None = None
    # The reference is an embedding model in litellm's map: embeddings are compared
    # with it. Otherwise they carry no reference (a chat model prices no vector).
    reference_embeds: bool = False
    direct: bool = False  # `model` named a deployment, not a route
    tiers: tuple[Threshold, ...] = ()
    classifier: str = "features"  # which model scores requests for `tiers`
    verify_threshold: float = 0.5
    max_escalations: int = 2
    stream_cascade: str = "buffer"
    sla: RouteSla | None = None
    max_output_tokens: int = 4096
    # Cascades: deployments asked alongside the first tier, whose answers the verifier
    # compares with the one it judges (resolved here: they are not part of the plan).
    second_opinions: tuple[DeploymentRuntime, ...] = ()
    # Cascades: run code answers against their own examples (in the sandbox) for the
    # verifier; off where the policy asked for it but this host cannot isolate them.
    run_code_examples: bool = False
    # Cascades: the deployment grading verified answers (`gateway.pipeline.judge`); None: the
    # learned verifier alone.
    judge: DeploymentRuntime | None = None
    judge_timeout_s: float = 3.0
    # `select`: the share of the reference's predicted quality to meet, the profile
    # the reference behaves like (None: the best candidate is the reference), and
    # whether the chosen answer is verified (and escalated, as a cascade's).
    quality_target: float = 0.95
    reference_profile: str | None = None
    reference_deployment: DeploymentRuntime | None = None  # `reference_model`, a deployment
    verify: bool = False
    explore: float = 0.0  # verified `select`: the share of requests that explore


def climbs(route: RouteRuntime, strategy: str, needs: Collection[str]) -> bool:
    """Whether a `select` request's answer is verified and climbs to the next candidate
    when rejected: its route asks for it (`verify: true`) and the answer is text the
    verifier can judge (a tool call's content is empty: every one would be rejected).
    The proxy and `policy explain` ask this; budgets hold a climb for every request of
    such a route, which errs high for tool requests, never low."""
    return strategy == "select" and route.verify and "tools" not in needs


def sla_met(route: RouteRuntime, ttft_s: float | None, total_s: float) -> bool | None:
    """Did a request keep its route's SLA? `ttft_s` None: a non-streamed answer, whose
    first token is the whole answer. None when the route promises no time."""
    if route.sla is None:
        return None
    return route.sla.met(total_s if ttft_s is None else ttft_s, total_s)


def _every(route: str) -> bool:
    return True


@dataclass(frozen=True)
class Runtime:
    policy: Policy
    digest: str
    keys: KeyTable
    deployments: Mapping[str, DeploymentRuntime]
    routes: Mapping[str, RouteRuntime]
    max_body_bytes: int
    request_timeout_s: float
    loaded_at: float = field(default_factory=time.time)
    # What the build found wrong but servable (a missing price, code runs off), as
    # (logging level, message): the caller logs those the serving runtime did not have.
    warnings: tuple[tuple[int, str], ...] = ()

    def resolve(self, model: str, can_use: Callable[[str], bool] = _every) -> RouteRuntime:
        """The route for a request's `model`: a route name or a deployment name. An
        unknown one is a 404 listing the routes `can_use` lets the caller see (a key's
        own: the others' names are not its business)."""
        route = self.routes.get(model)
        if route is not None:
            return route
        deployment = self.deployments.get(model)
        if deployment is not None:
            return RouteRuntime(
                name=deployment.name,
                strategy="fixed",
                deployments=(deployment.name,),
                reference_model=None,
                reference_price=None,
                direct=True,
            )
        known = ", ".join(sorted(name for name in self.routes if can_use(name))) or "none"
        raise NotFound(
            f"model '{model}' is neither a route nor a deployment; routes: {known}",
            param="model",
        )

    def plan(
        self,
        route: RouteRuntime,
        score: float | None = None,
        strategy: str | None = None,
        needs: frozenset[str] = frozenset(),
        choice: Choice | None = None,
    ) -> Plan:
        """The plan for `route`; `strategy` overrides the route's (a cascade route
        routes streams by classifier when its policy says so); deployments that do not
        serve all of `needs` (capabilities) are skipped; `choice`: a `select` route's
        qualities and costs."""
        views = [self.deployments[name].view for name in route.deployments]
        spec = RouteSpec(route.name, strategy or route.strategy, views, route.tiers, needs, choice)
        return plan_route(spec, score)

    def visible_models(self, principal: Principal) -> list[str]:
        names = list(self.routes) + list(self.deployments)
        return [name for name in names if principal.can_use(name)]


def build_runtime(loaded: LoadedPolicy) -> Runtime:
    policy = loaded.policy
    warnings: list[tuple[int, str]] = []
    can_embed = embeddings_missing() is None  # the embedded engine's MiniLM
    deployments = {
        name: _deployment(name, spec, policy.engines, can_embed, warnings)
        for name, spec in policy.deployments.items()
    }
    routes = {
        name: RouteRuntime(
            name=name,
            strategy=spec.strategy,
            deployments=tuple(spec.deployments),
            reference_model=_reference_name(spec.reference_model, deployments),
            reference_price=_reference_price(spec.reference_model, deployments, warnings),
            reference_embeds=_reference_embeds(spec.reference_model, policy.deployments),
            max_body_bytes=spec.max_body_bytes,
            tiers=tuple(Threshold(t.tier, t.below) for t in spec.tiers),
            classifier=spec.classifier,
            verify_threshold=spec.verify_threshold,
            max_escalations=spec.max_escalations,
            stream_cascade=spec.stream_cascade,
            sla=_route_sla(spec.sla),
            max_output_tokens=spec.max_output_tokens,
            second_opinions=tuple(deployments[d] for d in spec.second_opinions),
            run_code_examples=spec.run_code_examples and _sandbox_usable(name, warnings),
            judge=_judge(name, spec, deployments, warnings),
            judge_timeout_s=spec.judge_timeout_ms / 1000,
            quality_target=spec.quality_target,
            reference_profile=_reference_profile(spec.reference_model, deployments),
            reference_deployment=deployments.get(spec.reference_model or ""),
            verify=spec.verify,
            explore=spec.explore if spec.verify else 0.0,
        )
        for name, spec in policy.routes.items()
    }
    return Runtime(
        policy=policy,
        digest=loaded.digest,
        keys=_key_table(policy),
        deployments=deployments,
        routes=routes,
        max_body_bytes=policy.gateway.max_body_bytes,
        request_timeout_s=policy.gateway.request_timeout_s,
        warnings=tuple(warnings),
    )


def log_new_warnings(runtime: Runtime, serving: Runtime | None) -> None:
    """Log what `runtime`'s build warned of, except what `serving` (the runtime it
    replaces) had already: a reload re-logs no standing warning."""
    for level, message in new_warnings(runtime, serving):
        log.log(level, "%s", message)


def new_warnings(runtime: Runtime, serving: Runtime | None) -> list[tuple[int, str]]:
    """`runtime`'s build warnings that `serving` did not have."""
    known = set(serving.warnings) if serving is not None else set()
    return [warning for warning in runtime.warnings if warning not in known]


def _route_sla(sla: Sla | None) -> RouteSla | None:
    if sla is None:
        return None

    def seconds(ms: float | None) -> float | None:
        return None if ms is None else ms / 1000.0

    return RouteSla(
        ttft_s=seconds(sla.ttft_ms),
        timeout_s=seconds(sla.timeout_ms),
        load_aware=sla.load_aware,
        on_miss=sla.on_miss,
        hedge_after_s=seconds(sla.hedge_after_ms),
        max_hedges=sla.max_hedges,
        priority=VLLM_PRIORITY[sla.priority],
        p99_s=seconds(sla.p99_ms),
    )


def _deployment(
    name: str,
    spec: Deployment,
    engines: Mapping[str, EngineSpec],
    can_embed: bool,
    warnings: list[tuple[int, str]],
) -> DeploymentRuntime:
    target = UpstreamTarget(
        deployment=name,
        provider=spec.provider,
        model=spec.model,
        api_base=spec.api_base,
        api_key=spec.api_key,
        timeout_s=spec.timeout_s,
        connect_timeout_s=spec.connect_timeout_s,
        headers=dict(spec.headers),
        load_report=wants_load_view(spec),
    )
    price = _deployment_price(name, spec, warnings)
    return DeploymentRuntime(
        name=name,
        tier=spec.tier,
        provider=spec.provider,
        target=target,
        price=price,
        max_retries=spec.max_retries,
        retry_backoff_s=spec.retry_backoff_s,
        unavailable_reason=spec.unavailable_reason(),
        priority_scheduling=spec.priority_scheduling,
        returns_logprobs=returns_logprobs(spec, engines),
        max_output_tokens=spec.max_output_tokens,
        capabilities=capabilities(spec, engines, can_embed),
        unset_env=tuple(spec.unset_env()),
        quality_profile=spec.quality_profile or _price_profile(price),
    )


def capabilities(
    spec: Deployment, engines: Mapping[str, EngineSpec], can_embed: bool
) -> frozenset[str]:
    """What a deployment serves: the policy's `capabilities`, else its kind's default."""
    if spec.capabilities is not None:
        return frozenset(spec.capabilities)
    engine = engines.get(spec.engine) if spec.engine is not None else None
    return default_capabilities(spec.provider, engine, embeddings_installed=can_embed)


def wants_load_view(spec: Deployment) -> bool:
    """Is this deployment an engine whose load the gateway watches (`/metrics` scraped,
    load asked for on every response)? Self-hosted ones are, unless told otherwise."""
    if spec.scrape_metrics is not None:
        return spec.scrape_metrics
    return spec.metrics_url is not None or spec.self_hosted is not None


def returns_logprobs(spec: Deployment, engines: Mapping[str, EngineSpec]) -> bool:
    """Does this deployment answer `logprobs: true` (OpenAI's chat field) with token
    logprobs? OpenAI-compatible servers do (OpenAI, vLLM); the embedded CPU engine
    refuses the field with a 400, litellm's providers (Anthropic, ...) have none, and
    OpenAI's reasoning models (o1, o3, gpt-5: `supports_reasoning` in litellm's model
    map) refuse it too. The policy's `cascade_logprobs` overrides the guess."""
    if spec.cascade_logprobs is not None:  # the policy knows this server
        return spec.cascade_logprobs
    engine = engines.get(spec.engine) if spec.engine is not None else None
    if spec.provider != OPENAI_COMPATIBLE or (engine is not None and engine.kind == "cpu"):
        return False
    entry = litellm_price_map().get(spec.pricing_model or spec.model) or {}
    return not entry.get("supports_reasoning")


def _deployment_price(name: str, spec: Deployment, warnings: list[tuple[int, str]]) -> TokenPrice:
    if spec.price is not None and not (spec.price.input_per_mtok or spec.price.output_per_mtok):
        # A zero price is no price (docs/policy.md), not free: counted as unpriced.
        warnings.append(
            (
                logging.WARNING,
                f"deployment '{name}' has a zero price in the policy: its requests are "
                "recorded as unpriced",
            )
        )
        return UNPRICED
    if spec.price is not None:
        # A token class the policy leaves unpriced keeps the provider's rate for it.
        classes = litellm_class_rates(spec.pricing_model or spec.model, spec.provider)
        return policy_price(spec.price, classes)
    if spec.self_hosted is not None:
        return self_hosted_price(spec.self_hosted.gpu_hour_usd, spec.self_hosted.tokens_per_second)
    price = lookup_litellm(spec.pricing_model or spec.model, spec.provider)
    if not price.priced:
        model = spec.pricing_model or spec.model
        warnings.append(
            (
                logging.WARNING,
                f"deployment '{name}' (model '{model}') has no price in litellm's map and "
                "none in the policy: its requests are recorded as unpriced",
            )
        )
    return price


def _sandbox_usable(route: str, warnings: list[tuple[int, str]]) -> bool:
    """Whether code can be run isolated here; if not, the route's code runs stay off
    (its cascade verifies without them) and the load says why."""
    reason = sandbox.available()
    if reason is not None:
        message = f"route {route}: run_code_examples is off: cannot isolate code here: {reason}"
        warnings.append((logging.ERROR, message))
    return reason is None


def _judge(
    route: str,
    spec: Route,
    deployments: Mapping[str, DeploymentRuntime],
    warnings: list[tuple[int, str]],
) -> DeploymentRuntime | None:
    """The route's judge, warned of where it grades its own answers or its model's."""
    if spec.judge is None:
        return None
    judge = deployments[spec.judge]
    # A verified `select` picks its climb per request: what its judge grades is not
    # known here.
    if spec.strategy == "cascade":
        graded = _graded_by_judge([deployments[name] for name in spec.deployments], spec)
        warnings += [
            (logging.WARNING, _self_judged(route, judge, deployment))
            for deployment in graded
            if deployment.target.model == judge.target.model  # the judge itself too
        ]
    return judge


def _graded_by_judge(candidates: list[DeploymentRuntime], spec: Route) -> list[DeploymentRuntime]:
    """The deployments of a cascade whose answers its judge grades: every tier climbed
    (at most `max_escalations` past the first) but the last, whose answer is kept
    unverified."""
    climbed = tier_groups(candidates)[: spec.max_escalations + 1]
    return [deployment for group in climbed[:-1] for deployment in group]


def _self_judged(route: str, judge: DeploymentRuntime, graded: DeploymentRuntime) -> str:
    tier, model = graded.tier, graded.target.model
    what = f"is a deployment of tier '{tier}'"
    if graded.name != judge.name:
        what = f"runs the same model ('{model}') as '{graded.name}' of tier '{tier}'"
    return (
        f"route '{route}': judge '{judge.name}' {what}, whose answers it grades: a model "
        "rates its own answers too kindly, so answers that should escalate are kept; name "
        "a judge of another model"
    )


def _reference_name(
    reference: str | None, deployments: Mapping[str, DeploymentRuntime]
) -> str | None:
    if reference is None:  # no counterfactual: a route is no reference for itself
        return None
    return deployments[reference].target.model if reference in deployments else reference


def _reference_profile(
    reference: str | None, deployments: Mapping[str, DeploymentRuntime]
) -> str | None:
    """The known model a route's reference behaves like: its deployment's profile, or
    the model it names (`select` checks that the predictor knows it)."""
    if reference is None:
        return None
    return deployments[reference].quality_profile if reference in deployments else reference


def _price_profile(price: TokenPrice) -> str:
    return prior_profile(price.input_usd * 1e6, price.output_usd * 1e6)


def _reference_price(
    reference: str | None,
    deployments: Mapping[str, DeploymentRuntime],
    warnings: list[tuple[int, str]],
) -> TokenPrice | None:
    if reference is None:
        return None
    if reference in deployments:
        return deployments[reference].price
    price = lookup_litellm(reference)
    if not price.priced:
        warnings.append(
            (logging.WARNING, f"reference model '{reference}' has no price in litellm's map")
        )
    return price if price.priced else UNPRICED


def _reference_embeds(reference: str | None, specs: Mapping[str, Deployment]) -> bool:
    """Whether a route's reference is an embedding model (`mode: embedding` in
    litellm's map, under a deployment's `pricing_model` or `model`)."""
    if reference is None:
        return False
    spec = specs.get(reference)
    name, provider = (
        (reference, None) if spec is None else (spec.pricing_model or spec.model, spec.provider)
    )
    found = litellm_entry(name, provider)
    return found is not None and found[1].get("mode") == "embedding"


def _key_table(policy: Policy) -> KeyTable:
    principals: dict[str, Principal] = {}
    for key_id, key in policy.keys.items():
        digest = key.hash or (hash_key(key.secret) if key.secret else None)
        if digest is None:  # its ${ENV} secret is unset: the key is disabled
            continue
        principals[digest] = Principal(
            key_id, key.team, _allowed(policy, key.team, key.allowed_routes)
        )
    admin = frozenset(hash_key(secret) for secret in policy.admin_keys if secret)
    anonymous = None
    if policy.auth.anonymous_team is not None:
        team = policy.auth.anonymous_team
        anonymous = Principal(ANONYMOUS_KEY_ID, team, _allowed(policy, team, None))
    # Listed but all unset (`${METRICS_KEY}` empty) still closes /metrics: fail closed.
    metrics = (
        frozenset(hash_key(s) for s in policy.metrics_keys if s) if policy.metrics_keys else None
    )
    return KeyTable(principals, admin, anonymous, metrics_hashes=metrics)


def _allowed(policy: Policy, team: str, key_routes: list[str] | None) -> frozenset[str] | None:
    team_spec = policy.teams.get(team)
    routes = (
        key_routes if key_routes is not None else (team_spec.allowed_routes if team_spec else ["*"])
    )
    return None if "*" in routes else frozenset(routes)


def tier_groups(candidates: list[DeploymentRuntime]) -> list[list[DeploymentRuntime]]:
    """Candidates grouped by tier, in the order the tiers first appear."""
    groups: dict[str, list[DeploymentRuntime]] = {}
    for deployment in candidates:
        groups.setdefault(deployment.tier, []).append(deployment)
    return list(groups.values())
