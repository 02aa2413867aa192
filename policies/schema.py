"""The policy's shape: what ops may write in the YAML, and the cross-references checked.

Sections (`policies.section`) forbid unknown fields so a typo (`timeout: 5` for
`timeout_s: 5`) is an error with its path, not a silently ignored line; who may call and
how much (keys, teams, budgets) is in `policies.access`. Checks that span sections (a route naming a
deployment, a key naming a team) live in `policies.sections`: `Policy` runs them once
every section is valid, and the loader runs them on the entries that are valid when some
are not, so one `policy check` reports them beside the schema errors. They are reported
together through `CrossReferenceError`, whose `problems` keep each field path.

Regenerate the JSON schema shipped beside this module with:

    python -m policies.schema > policies/schema.json
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Mapping
from typing import Annotated, Literal, Self
from urllib.parse import urlsplit

from pydantic import (
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from policies.access import (
    Auth,
    Budget,
    Key,
    Network,
    Team,
)
from policies.capabilities import CAPABILITIES, CHAT_FEATURES, CapabilityType
from policies.engines import EngineSpec
from policies.errors import closest_spelling, did_you_mean
from policies.providers import litellm_providers
from policies.section import (
    MAX_SECONDS,
    MIN_RELOAD_INTERVAL_S,
    Bytes,
    CrossReferenceError,
    GpuHourUsd,
    Interval,
    Milliseconds,
    PositiveInt,
    Seconds,
    Secret,
    Section,
    TokensPerSecond,
    UnsetWhenEmpty,
    UsdRate,
    unset_or_empty,
)

RouteStrategyType = Literal["fixed", "fallback", "classifier", "cascade", "select"]
# Strategies whose answers may be escalated, so `max_escalations` applies (to a select
# route with verify: true; without, it is accepted and unused, as `verify` toggles it).
ESCALATING = ("cascade", "select")
StreamCascadeType = Literal["buffer", "classifier"]
# Which complexity classifier scores a route's requests: `features` (the default, under
# a millisecond) or `minilm` (plus a sentence embedding: tens of ms, the embeddings extra).
ClassifierType = Literal["features", "minilm"]
PriorityType = Literal["interactive", "batch"]
SlaMissType = Literal["degrade", "shed"]
FailModeType = Literal["open", "closed"]

OPENAI_COMPATIBLE = "openai"  # the provider spoken natively; others go through litellm
URL_SCHEMES = ("http", "https")


class Price(Section):
    """A price override in USD per million tokens, for models litellm does not know.

    The optional fields price token classes the provider bills apart (cached prompt
    reads, cache writes, reasoning, audio, image). One left unset takes litellm's rate
    for the model when its map has one (OpenAI's cached input, Anthropic's cache reads
    and writes), else the input price (prompt classes) or output price (the others)."""

    input_per_mtok: UsdRate
    output_per_mtok: UsdRate
    cached_input_per_mtok: UsdRate | None = None
    cache_write_per_mtok: UsdRate | None = None
    reasoning_per_mtok: UsdRate | None = None
    audio_input_per_mtok: UsdRate | None = None
    audio_output_per_mtok: UsdRate | None = None
    image_input_per_mtok: UsdRate | None = None
    image_output_per_mtok: UsdRate | None = None


class SelfHosted(Section):
    """A self-hosted deployment's cost: tokens are priced from GPU time and throughput."""

    gpu_hour_usd: GpuHourUsd
    tokens_per_second: TokensPerSecond


class Deployment(Section):
    """One model behind one upstream endpoint.

    `provider: openai` is any OpenAI-compatible server (OpenAI, vLLM, the embedded
    engine); any other provider name is handed to litellm.
    """

    # "openai" or "anthropic" or any other litellm provider name: typed as plain str so
    # an unknown provider name is accepted and a wrong type gives a single error
    provider: str = Field(OPENAI_COMPATIBLE, examples=["openai", "anthropic"])
    model: Annotated[str, Field(min_length=1)]  # sent upstream: never empty (an unset ${M:-})
    api_base: UnsetWhenEmpty = None
    api_key: Secret = None
    requires_key: bool = False
    # Once declared and never read: still accepted, ignored, and noted (`unserved_notes`).
    requires: list[str] = Field(default_factory=list, deprecated="ignored: see capabilities")
    tier: str = "default"
    timeout_s: Seconds = 60
    connect_timeout_s: Seconds = 5
    max_retries: Annotated[int, Field(ge=0, le=10)] = 2
    retry_backoff_s: Annotated[float, Field(ge=0, le=MAX_SECONDS)] = 0.2
    headers: dict[str, str] = {}
    price: Price | None = None
    pricing_model: str | None = None
    self_hosted: SelfHosted | None = None
    context_window: PositiveInt | None = None
    # The most output tokens per answer the gateway asks of this deployment (it lowers a
    # request's max_tokens to it): for engines whose context is small.
    max_output_tokens: PositiveInt | None = None
    # Load view: vLLM's Prometheus endpoint, scraped every `gateway.load_scrape_interval_s`
    # (default: `api_base` without its `/v1` suffix + `/metrics`, for self-hosted tiers).
    metrics_url: str | None = None
    scrape_metrics: bool | None = None
    # The engine runs `--scheduling-policy priority`: send the route's priority along.
    priority_scheduling: bool = False
    # Cascade routes ask this deployment for token logprobs (the verifier reads them) when
    # it is not the last tier. None: where the upstream is known to return them (see
    # gateway.runtime.returns_logprobs); false for an OpenAI-compatible server that
    # rejects the field; true to insist.
    cascade_logprobs: bool | None = None
    # A self-hosted engine from `engines`: it supplies api_base (and api_key,
    # self_hosted pricing, priority_scheduling) where this deployment leaves them unset.
    engine: str | None = None
    # What it serves (chat, completions, embeddings, tools, vision, json_schema; and the
    # wire formats it serves natively: responses, messages); requests needing something
    # else skip it. None: the default of its provider or engine kind (see
    # `policies.capabilities`).
    capabilities: list[CapabilityType] | None = Field(None, examples=[["chat", "tools"]])
    # `select` routes: the model the quality predictor knows that this deployment
    # behaves like (`cascade-gateway router predict --help` lists them). None: the known
    # model at or below its price (`router.target_selection.prior_profile`).
    quality_profile: str | None = Field(None, examples=["gpt-3.5-turbo-1106"])

    # field name -> env var names that were referenced but unset (set by `Policy`, with
    # the env vars that are set but empty)
    _unset_env: dict[str, list[str]] = PrivateAttr(default_factory=dict)
    _empty_env: frozenset[str] = PrivateAttr(default_factory=frozenset)

    @field_validator("provider")
    @classmethod
    def _check_provider(cls, provider: str) -> str:
        if provider == OPENAI_COMPATIBLE:
            return provider  # spoken natively: litellm's sources need not be read
        known = litellm_providers()
        if known is None or provider in known:
            return provider  # None: litellm's providers cannot be told here, none refused
        guess = closest_spelling(provider.lower(), [OPENAI_COMPATIBLE, *known])
        raise ValueError(
            f"unknown provider '{provider}'{did_you_mean(guess)} (providers: "
            f"'{OPENAI_COMPATIBLE}' for any OpenAI-compatible server, "
            "or a provider litellm serves, e.g. anthropic, bedrock, vertex_ai)"
        )

    @field_validator("capabilities", mode="before")
    @classmethod
    def _check_capability_names(cls, names: object) -> object:
        for name in names if isinstance(names, list) else ():
            if isinstance(name, str) and name not in CAPABILITIES:
                guess = closest_spelling(name.lower(), CAPABILITIES)
                raise ValueError(
                    f"unknown capability '{name}'{did_you_mean(guess)} (capabilities: "
                    f"{', '.join(CAPABILITIES)})"
                )
        return names

    @field_validator("capabilities")
    @classmethod
    def _check_capabilities(cls, names: list[str] | None) -> list[str] | None:
        if names is None:
            return None
        if not names:
            raise ValueError("capabilities is empty; list what it serves, e.g. [chat, tools]")
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"capabilities name {', '.join(repeated)} more than once")
        features = sorted(CHAT_FEATURES.intersection(names))
        if features and "chat" not in names:
            raise ValueError(
                f"capabilities has {', '.join(features)} but not chat; they are features of "
                "chat requests: add chat"
            )
        return names

    @field_validator("api_base", "metrics_url")
    @classmethod
    def _check_url(cls, url: str | None, info: ValidationInfo) -> str | None:
        if url is not None and (problem := _url_problem(url)):
            raise ValueError(f"{info.field_name} must be an http:// or https:// URL: {problem}")
        return url

    def unavailable_reason(self) -> str | None:
        """Why this deployment cannot be called with the current settings, or None."""
        if self.provider == OPENAI_COMPATIBLE:
            if self.api_base is None:
                return self._not_set("api_base")
            if self.requires_key and self.api_key is None:
                return self._not_set("api_key")
        elif self.api_key is None:
            return self._not_set("api_key")
        return None

    def unset_env(self) -> list[str]:
        """The environment variables this deployment referenced that are unset, in order:
        what to set for it to be called."""
        return list(dict.fromkeys(name for names in self._unset_env.values() for name in names))

    def _not_set(self, field: str) -> str:
        names = self._unset_env.get(field)
        if not names:
            return f"{field} is not set"
        return f"{field} is not set ({unset_or_empty(names, self._empty_env)})"


def _url_problem(url: str) -> str | None:
    """What keeps `url` from being an http(s) URL, or None. The URL itself is not
    echoed: it may carry credentials."""
    scheme, separator, _ = url.partition("://")
    if not separator:
        return "it has no scheme (e.g. http://127.0.0.1:8000/v1)"
    if scheme.lower() not in URL_SCHEMES:
        guess = closest_spelling(scheme.lower(), URL_SCHEMES)
        return f"its scheme is '{scheme}'{did_you_mean(guess, '://')}"
    if any(character.isspace() for character in url):
        return "it contains whitespace"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        return f"it does not parse ({exc})"
    if not parts.hostname:
        return "it has no host"
    return None


class TierThreshold(Section):
    """One step of a classifier route: requests scoring below `below` go to `tier`;
    the last step has no `below` and takes the rest."""

    tier: str
    below: Annotated[float, Field(ge=0, le=1)] | None = None


class Sla(Section):
    """A route's latency promise and what the gateway does to keep it.

    `ttft_ms` is the first-token target (the whole answer, for non-streaming requests,
    is held to `timeout_ms`); deployments predicted to miss it are skipped (when
    `load_aware`), and when none can meet it `on_miss` decides: `degrade` tries the
    faster tiers anyway, in predicted order; `shed` answers 429 with `Retry-After`.
    `hedge_after_ms`: when the first token is that late, the next candidate is asked
    too; the first to answer wins, the other is cancelled, both are priced."""

    ttft_ms: Milliseconds | None = None
    timeout_ms: Milliseconds | None = None
    p99_ms: Milliseconds | None = None
    priority: PriorityType = "interactive"
    load_aware: bool = True
    on_miss: SlaMissType = "degrade"
    hedge_after_ms: Milliseconds | None = None
    max_hedges: Annotated[int, Field(ge=1, le=3)] = 1

    @model_validator(mode="after")
    def _check_ttft_within_timeout(self) -> Self:
        ttft, timeout = self.ttft_ms, self.timeout_ms
        if ttft is not None and timeout is not None and ttft > timeout:
            # Not unmeetable (a request within timeout_ms has its first token sooner), but
            # the first-token target would never bind, and load-aware routing would keep
            # deployments predicted to answer after the request is cut off.
            message = (
                f"ttft_ms {ttft:g} is above timeout_ms {timeout:g}, which ends the request first: "
                "the first-token target would never apply and load-aware routing would pick "
                "deployments predicted to time out; set ttft_ms to at most timeout_ms"
            )
            raise CrossReferenceError([(("ttft_ms",), message)])
        return self


class Route(Section):
    """What a request's `model` names: an ordered list of deployments and how to use it.

    Strategies: `fixed` (one deployment), `fallback` (in order), `classifier` (the
    router scores the request in [0, 1]; `tiers` map scores to the tier tried first,
    cheapest first, with the tiers above as fallbacks), `cascade` (the deployments'
    tiers in the order listed, cheapest first: each answer is verified and, when its
    score is below `verify_threshold`, the next tier is asked, at most
    `max_escalations` times; streams are verified whole before they are sent
    (`stream_cascade: buffer`) or routed by the classifier's `tiers` instead).
    `second_opinions` (cascade only): deployments asked the same question alongside
    the first tier; whether their final answers (or their code) agree is evidence for
    the verifier. `run_code_examples` (cascade only): run a code answer against the
    examples it claims, in a sandbox (`router.sandbox`), as evidence for the verifier;
    off by default, since it executes model-written code. `judge` (cascade only): a
    deployment that grades each verified answer with a fixed rubric (`gateway.pipeline.judge`);
    when it answers within `judge_timeout_ms`, its grade replaces the verifier's score,
    else the verifier decides. `select`: per request, the quality predictor rates each
    deployment (by its `quality_profile`), and the cheapest whose predicted quality is
    at least `quality_target` x the reference model's is asked first, then the others
    in cost order; with `verify: true` its answer is verified as a cascade's is and an
    escalation goes to the cheapest candidate predicted to do better. `classifier` picks the model
    that scores requests for `tiers`:
    `features` (the default) or `minilm` (adds a sentence embedding; slower, and on the
    shipped data no better: for a model retrained on your own traffic)."""

    strategy: RouteStrategyType = "fallback"
    deployments: Annotated[list[str], Field(min_length=1)]
    tiers: list[TierThreshold] = []
    classifier: ClassifierType = "features"
    verify_threshold: Annotated[float, Field(ge=0, le=1)] = 0.5
    max_escalations: Annotated[int, Field(ge=0, le=10)] = 2
    stream_cascade: StreamCascadeType = "buffer"
    second_opinions: list[str] = []
    run_code_examples: bool = False
    judge: str | None = None
    judge_timeout_ms: Annotated[int, Field(gt=0, le=60_000)] = 3000
    reference_model: str | None = None
    # `select`: the fraction of the reference model's predicted quality to meet.
    quality_target: Annotated[float, Field(gt=0, le=1)] = 0.95
    verify: bool = False  # `select`: verify the chosen answer and escalate (a cascade)
    # `select` with `verify`: the share of requests that first try a candidate just under
    # the target, verified (escalated when rejected), so that one placed below it can
    # earn its place back from traffic.
    explore: Annotated[float, Field(ge=0, le=1)] = 0.05
    max_body_bytes: Bytes | None = None
    # Output tokens assumed for a request without `max_tokens` when reserving budget.
    max_output_tokens: PositiveInt = 4096
    sla: Sla | None = None
    description: str = ""

    @property
    def verifies(self) -> bool:
        """Are its answers verified (and escalated when rejected)?"""
        return self.strategy == "cascade" or (self.strategy == "select" and self.verify)

    @model_validator(mode="after")
    def _check_strategy(self) -> Self:
        if self.strategy == "fixed" and len(self.deployments) != 1:
            raise ValueError(
                f"strategy 'fixed' takes exactly one deployment, got {len(self.deployments)}"
            )
        uses_tiers = self.strategy == "classifier" or (
            self.strategy == "cascade" and self.stream_cascade == "classifier"
        )
        if uses_tiers:
            _check_tiers(self.tiers)
        elif self.tiers or self.classifier != "features":
            field = "tiers apply" if self.tiers else "classifier applies"
            raise ValueError(
                f"{field} to strategy 'classifier' (or 'cascade' with stream_cascade: "
                f"classifier), not '{self.strategy}'"
            )
        return self

    @model_validator(mode="after")
    def _check_second_opinions(self) -> Self:
        if "explore" in self.model_fields_set and not (self.strategy == "select" and self.verify):
            raise ValueError(
                "explore applies to strategy 'select' with verify: true (only a verified "
                "answer can be escalated and learned from)"
            )
        if self.verify and self.strategy != "select":
            raise ValueError(
                f"verify applies to strategy 'select' (a cascade always verifies), "
                f"not '{self.strategy}'"
            )
        if "quality_target" in self.model_fields_set and self.strategy != "select":
            raise ValueError(f"quality_target applies to strategy 'select', not '{self.strategy}'")
        for value, field in (
            (self.second_opinions, "second_opinions apply"),
            (self.run_code_examples, "run_code_examples applies"),
            (self.judge, "judge applies"),
        ):
            if value and not self.verifies:
                raise ValueError(
                    f"{field} to strategy 'cascade' or 'select' with verify: true (routes "
                    f"whose answers are judged), not '{self.strategy}'"
                )
        # Kept on a select route whatever its `verify`, so that switching verification
        # off (an incident) is one edit, not three.
        for field in ("verify_threshold", "max_escalations", "judge_timeout_ms"):
            if field in self.model_fields_set and self.strategy not in ESCALATING:
                raise ValueError(
                    f"{field} applies to strategy 'cascade' or 'select' (routes that "
                    f"escalate), not '{self.strategy}'"
                )
        if "stream_cascade" in self.model_fields_set and self.strategy != "cascade":
            raise ValueError(f"stream_cascade applies to strategy 'cascade', not '{self.strategy}'")
        if repeated := _repeated(self.second_opinions):
            raise ValueError(
                f"second_opinions name {repeated} more than once; each deployment gives one opinion"
            )
        # A select route's deployments are candidates, one each (a fallback chain may
        # come back to one on purpose).
        if self.strategy == "select" and (repeated := _repeated(self.deployments)):
            raise ValueError(
                f"deployments name {repeated} more than once; a select route weighs each "
                "candidate once"
            )
        return self


def _repeated(names: list[str]) -> str:
    """The names listed more than once, quoted (Counter, not list.count: quadratic)."""
    return ", ".join(sorted(f"'{name}'" for name, n in Counter(names).items() if n > 1))


def _check_tiers(tiers: list[TierThreshold]) -> None:
    if not tiers:
        raise ValueError(
            "strategy 'classifier' needs tiers (e.g. [{tier: cheap, below: 0.5}, {tier: premium}])"
        )
    bounds = [t.below for t in tiers[:-1]]
    if any(b is None for b in bounds) or tiers[-1].below is not None:
        raise ValueError("every tier but the last needs 'below'; the last takes the rest")
    numbers = [b for b in bounds if b is not None]
    if numbers != sorted(set(numbers)):
        raise ValueError(f"tier thresholds must increase, got {numbers}")


class CircuitBreaker(Section):
    """Eject a deployment after consecutive failures or timeouts; after `cooldown_s`
    let `half_open_probes` requests through, and close again on their success."""

    failure_threshold: PositiveInt = 5
    cooldown_s: Seconds = 30.0
    half_open_probes: PositiveInt = 1


class GatewaySection(Section):
    """Gateway-wide knobs that belong with the policy rather than the process settings."""

    max_body_bytes: Bytes = 20 * 1024 * 1024  # OpenAI takes a 20 MB image (50 MB a request)
    default_route: str | None = None
    reload_interval_s: Annotated[float, Field(ge=MIN_RELOAD_INTERVAL_S, le=MAX_SECONDS)] = 2.0
    # Upper bound on one request across all its attempts, retries and fallbacks (until
    # the first streamed byte, for streams); a non-streamed attempt may wait this long,
    # a stream's silences are bounded by deployments' timeout_s.
    request_timeout_s: Seconds = 300.0
    circuit_breaker: CircuitBreaker = CircuitBreaker()
    # When Redis is unreachable: serve without budget/rate checks (open) or refuse (closed).
    limits_when_redis_down: FailModeType = "open"
    load_scrape_interval_s: Interval = 2.0
    # Sliding window of the live latency model (TTFT, inter-token time, error rate).
    latency_window_s: Seconds = 60.0
    # Proxies (CIDRs) whose X-Forwarded-For gives the client's address for logs and
    # limits. A forwarded request is never key-less (auth.anonymous_team), trusted or not.
    trusted_proxies: list[Network] = []


class Policy(Section):
    """The whole policy file (or directory), validated.

    Validation context `{"unset_env": {"keys.ci.secret": ["CI_KEY"], ...}, "empty_env":
    {"CI_KEY"}}` (the loader passes it) tells deployments and keys which env vars they
    missed, and which of those are set but empty.
    """

    deployments: dict[str, Deployment]
    routes: dict[str, Route]
    teams: dict[str, Team] = {}
    keys: dict[str, Key] = {}
    admin_keys: list[str | None] = []
    # Keys for the spend API and the finance dashboard (read-only); admin keys work too.
    finance_keys: list[str | None] = []
    # Keys for /metrics; admin keys work too. None listed: /metrics is open.
    metrics_keys: list[str | None] = []
    budgets: list[Budget] = []
    auth: Auth = Auth()
    gateway: GatewaySection = GatewaySection()
    engines: dict[str, EngineSpec] = {}

    @model_validator(mode="after")
    def _check_references(self, info: ValidationInfo) -> Self:
        from policies.sections import Sections  # its checks need this module's models

        context = info.context if isinstance(info.context, Mapping) else {}
        sections = Sections.of(self)
        sections.note_unset_env(context.get("unset_env", {}), context.get("empty_env", ()))
        problems = list(sections.problems())
        if problems:
            raise CrossReferenceError(problems)
        self._apply_engines()
        return self

    def _apply_engines(self) -> None:
        for deployment in self.deployments.values():
            engine = self.engines.get(deployment.engine or "")
            if engine is None:
                continue
            deployment.api_base = deployment.api_base or engine.api_base
            deployment.api_key = deployment.api_key or engine.api_key
            if deployment.self_hosted is None and engine.gpu_hour_usd and engine.tokens_per_second:
                deployment.self_hosted = SelfHosted(
                    gpu_hour_usd=engine.gpu_hour_usd, tokens_per_second=engine.tokens_per_second
                )
            if engine.scheduling_policy == "priority":
                deployment.priority_scheduling = True


def schema_json() -> str:
    """The JSON schema of `Policy`, as shipped in `policies/schema.json`."""
    return json.dumps(Policy.model_json_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.stdout.write(schema_json())
