"""What a `select` route needs per request: each candidate's predicted quality and
expected cost (`router.target_selection` orders them).

- Quality: the quality predictor's estimate for the deployment's `quality_profile`,
  moved by what live traffic showed of that deployment (`TrafficProfiles`).
- Target: the route's `quality_target` x the reference's quality, moved by what traffic
  showed of it as the candidates' are (a reference deployment always meets its own).
- Cost: its price x (the prompt's tokens, estimated from its size, and the route's
  typical answer length, kept from the answers the ledger priced; `max_tokens` when
  smaller). Until a route has answers, `DEFAULT_OUTPUT_TOKENS`.

Learning from traffic: on a route that verifies (`verify: true`), each verified answer
is an observation of its deployment's quality: 1 when its score (the judge's where it
graded, else the verifier's) passed the route's `verify_threshold`, else 0, the scale
of the predictor's "share of answers that are right". A deployment's offset from the
predictor moves `LEARNING_RATE` of the way to each observation's residual and is
bounded by `MAX_SHIFT`: 7 answers move it about halfway (0.9^7 ~ 1/2), 22 answers 90%
of the way, and no run of answers moves a deployment by more than 0.25. An offset
belongs to the `quality_profile` it was learned against: when a reload gives the
deployment another, the offset is set aside (logged once) and the next verdict starts
its learning again from the predictor.

Without Redis, `TrafficProfiles` keeps the offsets in this process: each worker learns
on its own and starts at 0 on a restart. With Redis the gateway uses
`shared_profiles.SharedTrafficProfiles`: each observation, wherever it was made, moves
the one shared offset of its deployment by the rule above (so the speeds above count
the answers of every worker and replica), the others adopt it within 0.5 s (their poll),
and a restart keeps it; while Redis is down, learning is local again.
"""

from __future__ import annotations

import logging
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

log = logging.getLogger(__name__)

DEFAULT_OUTPUT_TOKENS = 256
LEARNING_RATE = 0.1
MAX_SHIFT = 0.25


@dataclass(slots=True)
class Profile:
    """A deployment's learning: its offset from the predictor, from `observations`,
    against `quality_profile` (None: not recorded, taken for whichever it has now)."""

    offset: float = 0.0
    observations: int = 0
    quality_profile: str | None = None

    def learned_under(self, quality_profile: str | None) -> bool:
        """Whether it was learned against `quality_profile` (None: any)."""
        return quality_profile is None or self.quality_profile in (None, quality_profile)


def stepped(
    held: Profile, predicted: float, observed: float, quality_profile: str | None = None
) -> Profile:
    """`held` moved by one observation against `quality_profile` (`shared_profiles.
    OBSERVE_LUA` is the same rule): learned against another profile, it starts over."""
    start = held if held.learned_under(quality_profile) else Profile()
    moved = start.offset + LEARNING_RATE * (observed - predicted - start.offset)
    bounded = min(MAX_SHIFT, max(-MAX_SHIFT, moved))
    return Profile(bounded, start.observations + 1, quality_profile or start.quality_profile)


class TrafficProfiles:
    """Per deployment, how far live answers put it from the predictor (bounded), in this
    process; `on_change(deployment, offset)` is told of every offset set (metrics)."""

    def __init__(self, on_change: Callable[[str, float], None] | None = None) -> None:
        self._profiles: dict[str, Profile] = {}
        self._on_change = on_change
        self._set_aside: set[tuple[str, str]] = set()  # (deployment, profile) logged

    def offset(self, deployment: str, quality_profile: str | None = None) -> float:
        """Its learned offset; 0 when learned against another `quality_profile`."""
        held = self._profiles.get(deployment)
        if held is None:
            return 0.0
        if not held.learned_under(quality_profile):
            self._note_set_aside(deployment, held, quality_profile)
            return 0.0
        return held.offset

    def _note_set_aside(self, deployment: str, held: Profile, quality_profile: str | None) -> None:
        if (deployment, str(quality_profile)) in self._set_aside:
            return
        self._set_aside.add((deployment, str(quality_profile)))
        log.info(
            "deployment '%s' now has quality_profile '%s': the offset %+.3f learned under "
            "'%s' is set aside; its learning starts again from the predictor",
            deployment,
            quality_profile,
            held.offset,
            held.quality_profile,
        )

    def observations(self, deployment: str) -> int:
        profile = self._profiles.get(deployment)
        return 0 if profile is None else profile.observations

    def observe(
        self,
        deployment: str,
        predicted: float,
        observed: float,
        quality_profile: str | None = None,
    ) -> None:
        """One live answer scored `observed`; the predictor (alone) said `predicted`,
        rating the deployment as `quality_profile`."""
        held = self._profiles.get(deployment, Profile())
        self.adopt(deployment, stepped(held, predicted, observed, quality_profile))

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
    """The deployments whose learning `runtime`'s select routes use: their candidates
    and the deployments their targets are relative to."""
    routes = [r for r in runtime.routes.values() if r.strategy == "select"]
    references = (r.reference_deployment for r in routes)
    named = {d for r in routes for d in r.deployments}
    return sorted(named | {d.name for d in references if d is not None})


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
        runtime: Runtime,
        route: RouteRuntime,
        endpoint: EndpointType,
        body: Mapping[str, Any],
    ) -> Choice:
        """Every candidate of `route` (in `runtime`) with its quality and cost for this
        request, ordered."""
        candidates = {name: runtime.deployments[name] for name in route.deployments}
        profiles = [d.quality_profile for d in candidates.values()]
        reference = self.reference_profile(route)
        asked = profiles if reference is None else [*profiles, reference]
        predicted = self.predictor.predict_batch([_chat_body(endpoint, body)], asked)[0]
        prompt_tokens = estimate_prompt_tokens(endpoint, body)
        output_tokens = self.output_tokens(route.name, body)
        estimates = {
            name: Estimate(
                self._learned(d, predicted),
                d.price.cost_nanos(prompt_tokens, output_tokens) / 1e9,
                predicted[d.quality_profile],
                d.quality_profile,
            )
            for name, d in candidates.items()
        }
        # The reference moved by its learning as the candidates are (a candidate
        # reference: `choose` takes its estimate); none: the best candidate.
        deployment = route.reference_deployment
        if reference is None:
            reference_quality = max(e.quality for e in estimates.values())
        elif deployment is not None:
            reference_quality = self._learned(deployment, predicted)
        else:
            reference_quality = predicted[reference]
        named = None if deployment is None else deployment.name
        return choose(estimates, reference_quality, route.quality_target, named)

    def _learned(self, deployment: DeploymentRuntime, predicted: Mapping[str, float]) -> float:
        """Its predicted quality moved by what traffic showed of it."""
        profile = deployment.quality_profile
        return _clipped(predicted[profile] + self.traffic.offset(deployment.name, profile))

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
            observed = 1.0 if accepted else 0.0
            self.traffic.observe(deployment, estimate.predicted, observed, estimate.profile)


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
