"""What a `select` route needs per request: each candidate's predicted quality and
expected cost (`router.target_selection` orders them).

- Quality: the quality predictor's estimate for the deployment's `quality_profile`,
  moved by what live traffic showed of that deployment (`TrafficProfiles`).
- Cost: its price x (the prompt's tokens, estimated from its size, and the route's
  typical answer length, kept from the answers the ledger priced; `max_tokens` when
  smaller). Until a route has answers, `DEFAULT_OUTPUT_TOKENS`.

Learning from traffic: on a route that verifies (`verify: true`), each verified answer
is an observation of its deployment's quality: 1 when its score (the judge's where it
graded, else the verifier's) passed the route's `verify_threshold`, else 0, the scale
of the predictor's "share of answers that are right". A deployment's offset from the
predictor moves `LEARNING_RATE` of the way to each observation's residual and is
bounded by `MAX_SHIFT`: 7 answers move it about halfway (0.9^7 ~ 1/2), 22 answers 90%
of the way, and no run of answers moves a deployment by more than 0.25.

Without Redis, `TrafficProfiles` keeps the offsets in this process: each worker learns
on its own and starts at 0 on a restart. With Redis the gateway uses
`shared_profiles.SharedTrafficProfiles`: each observation, wherever it was made, moves
the one shared offset of its deployment by the rule above (so the speeds above count
the answers of every worker and replica), the others adopt it within 0.5 s (their poll),
and a restart keeps it; while Redis is down, learning is local again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.billing.tokens import estimate_prompt_tokens, prompt_list
from gateway.pipeline.accounting import OutputLengths
from gateway.request import asked_tokens
from gateway.runtime import DeploymentRuntime, RouteRuntime, Runtime
from gateway.upstreams.base import EndpointType
from policies.document import FieldPath
from policies.sections import Sections
from router.target_selection import Choice, Estimate, choose

if TYPE_CHECKING:
    from router.quality import QualityPredictor

DEFAULT_OUTPUT_TOKENS = 256
LEARNING_RATE = 0.1
MAX_SHIFT = 0.25


@dataclass(slots=True)
class Profile:
    """A deployment's learning: its offset from the predictor, from `observations`."""

    offset: float = 0.0
    observations: int = 0


def stepped(held: Profile, predicted: float, observed: float) -> Profile:
    """`held` moved by one observation (`shared_profiles.OBSERVE_LUA` is the same rule)."""
    moved = held.offset + LEARNING_RATE * (observed - predicted - held.offset)
    return Profile(min(MAX_SHIFT, max(-MAX_SHIFT, moved)), held.observations + 1)


class TrafficProfiles:
    """Per deployment, how far live answers put it from the predictor (bounded), in this
    process; `on_change(deployment, offset)` is told of every offset set (metrics)."""

    def __init__(self, on_change: Callable[[str, float], None] | None = None) -> None:
        self._profiles: dict[str, Profile] = {}
        self._on_change = on_change

    def offset(self, deployment: str) -> float:
        profile = self._profiles.get(deployment)
        return 0.0 if profile is None else profile.offset

    def observations(self, deployment: str) -> int:
        profile = self._profiles.get(deployment)
        return 0 if profile is None else profile.observations

    def observe(self, deployment: str, predicted: float, observed: float) -> None:
        """One live answer scored `observed`; the predictor (alone) said `predicted`."""
        self.adopt(
            deployment, stepped(self._profiles.get(deployment, Profile()), predicted, observed)
        )

    def adopt(self, deployment: str, profile: Profile) -> None:
        """From now on `deployment`'s profile is `profile` (a step, or what Redis shows)."""
        self._profiles[deployment] = profile
        if self._on_change is not None:
            self._on_change(deployment, profile.offset)

    def start(self, runtime: Callable[[], Runtime]) -> None:
        """Background work for the serving `runtime`: none here (the shared kind polls)."""

    async def stop(self) -> None:
        """Done serving: nothing to close here."""


def select_deployments(runtime: Runtime) -> list[str]:
    """The deployments whose learning `runtime`'s select routes use."""
    routes = runtime.routes.values()
    return sorted({d for r in routes if r.strategy == "select" for d in r.deployments})


class QualitySelector:
    """Estimates for a `select` route's candidates (see the module docstring)."""

    def __init__(
        self,
        lengths: OutputLengths,
        predictor: QualityPredictor | None = None,
        traffic: TrafficProfiles | None = None,
    ) -> None:
        self._lengths = lengths
        self._predictor = predictor
        self.traffic = TrafficProfiles() if traffic is None else traffic

    @property
    def predictor(self) -> QualityPredictor:
        if self._predictor is None:  # a JSON file (and numpy), when a select route asks
            from router.quality import shipped

            self._predictor = shipped()
        return self._predictor

    def choose(
        self,
        route: RouteRuntime,
        candidates: Mapping[str, DeploymentRuntime],
        endpoint: EndpointType,
        body: Mapping[str, Any],
    ) -> Choice:
        """Every candidate's quality and cost for this request, ordered."""
        profiles = [d.quality_profile for d in candidates.values()]
        reference = self.reference_profile(route)
        asked = profiles if reference is None else [*profiles, reference]
        predicted = self.predictor.predict_batch([_chat_body(endpoint, body)], asked)[0]
        prompt_tokens = estimate_prompt_tokens(endpoint, body)
        output_tokens = self.output_tokens(route.name, body)
        estimates = {
            name: Estimate(
                _clipped(predicted[d.quality_profile] + self.traffic.offset(name)),
                d.price.cost_nanos(prompt_tokens, output_tokens) / 1e9,
                predicted[d.quality_profile],
            )
            for name, d in candidates.items()
        }
        best = max(e.quality for e in estimates.values())
        reference_quality = best if reference is None else predicted[reference]
        return choose(estimates, reference_quality, route.quality_target)

    def reference_profile(self, route: RouteRuntime) -> str | None:
        """What the target is relative to: the reference's profile; a reference model
        the predictor does not know (gpt-4o, say) counts as the strongest it knows."""
        from router.quality import STRONG_MODEL, UnknownModelError

        name = route.reference_profile
        if name is None:
            return None
        try:
            self.predictor.resolve([name])
        except UnknownModelError:
            return STRONG_MODEL
        return name

    def output_tokens(self, route: str, body: Mapping[str, Any]) -> int:
        """The answer length a request of `route` is expected to have."""
        known = self._lengths.get(route)
        typical = DEFAULT_OUTPUT_TOKENS if known is None else max(1, round(known))
        asked = asked_tokens(body)
        return typical if asked is None else min(typical, asked)

    def learn(self, choice: Choice, deployment: str, accepted: bool) -> None:
        """A verified answer of `deployment` on a route that chose by `choice`, which
        its verifier `accepted` or not: an observation of its quality."""
        estimate = choice.estimates.get(deployment)
        if estimate is not None:  # against the predictor's own figure, as it was then
            prior = estimate.quality if estimate.prior is None else estimate.prior
            self.traffic.observe(deployment, prior, 1.0 if accepted else 0.0)


def _chat_body(endpoint: EndpointType, body: Mapping[str, Any]) -> Mapping[str, Any]:
    """The request as chat messages, which the predictor reads."""
    if endpoint == "chat":
        return body
    prompts = prompt_list(body.get("prompt"))
    text = " ".join(p for p in prompts if isinstance(p, str))
    return {"messages": [{"role": "user", "content": text}]}


def _clipped(quality: float) -> float:
    return min(1.0, max(0.0, quality))


def profile_problems(sections: Sections) -> Iterator[tuple[FieldPath, str]]:
    """Deployments whose `quality_profile` the quality predictor does not know (the
    message lists the known ones); reads the predictor only when one names a profile."""
    named = {
        name: d.quality_profile
        for name, d in (sections.deployments or {}).items()
        if d is not None and d.quality_profile is not None
    }
    if not named:
        return
    from router.quality import UnknownModelError, shipped

    predictor = shipped()
    for name, profile in named.items():
        try:
            predictor.resolve([profile])
        except UnknownModelError as exc:
            yield ("deployments", name, "quality_profile"), str(exc)
