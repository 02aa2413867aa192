"""The `select` strategy's choice: the cheapest candidate whose predicted quality meets
the route's target. Pure logic; the gateway supplies the qualities (the quality
predictor, moved by what live traffic showed) and the expected costs.

    choice = choose(
        {"mixtral": Estimate(0.71, 0.0004), "gpt-4": Estimate(0.80, 0.0120)},
        reference_quality=0.80,
        fraction=0.95,
    )
    choice.order     # ("gpt-4", "mixtral"): 0.71 < 0.95 x 0.80, so only gpt-4 qualifies
    choice.chain()   # the escalation order when the chosen answer is verified

Order: the candidates that meet the target, cheapest first; then the rest, best
predicted quality first (an answer below the target beats an error). The chain for a
verified selection starts at the choice, and each escalation goes to the cheapest
remaining candidate predicted to do strictly better than the answer just rejected: a
higher target each time. Where that ends short of them, it goes on to the strongest
candidate by the predictor alone (a learned offset may have lifted a cheap model over
it) and then to the reference deployment: a rejected answer always has somewhere to
climb while one of them has not answered.

A deployment with no `quality_profile` behaves, until traffic says otherwise, like the
known model at or just below its price (`prior_profile`): a model is rarely better than
what it costs, so the prior never flatters a newcomer.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

# List prices (USD per million input, output tokens) of the models the quality
# predictor knows, as RouterBench and the arena data priced them (hosted open models at
# Together's rates). Only `prior_profile` uses them.
PROFILE_PRICES: Mapping[str, tuple[float, float]] = {
    "gpt-4-0314": (30.0, 60.0),
    "gpt-4-1106-preview": (10.0, 30.0),
    "claude-v1": (8.0, 24.0),
    "claude-v2": (8.0, 24.0),
    "claude-2.1": (8.0, 24.0),
    "gpt-3.5-turbo": (1.5, 2.0),
    "gpt-3.5-turbo-1106": (1.0, 2.0),
    "claude-instant-v1": (0.8, 2.4),
    "meta/llama-2-70b-chat": (0.9, 0.9),
    "vicuna-33b-v1.3": (0.8, 0.8),
    "zero-one-ai/Yi-34B-Chat": (0.8, 0.8),
    "meta/code-llama-instruct-34b-chat": (0.776, 0.776),
    "mistralai/mixtral-8x7b-chat": (0.6, 0.6),
    "palm-2-chat-bison-001": (0.25, 0.5),
    "WizardLM/WizardLM-13B-V1.2": (0.3, 0.3),
    "Starling-LM-7B-alpha": (0.2, 0.2),
    "openchat_3.5": (0.2, 0.2),
    "mistralai/mistral-7b-chat": (0.2, 0.2),
}
# The cheapest known model, the prior of whatever costs less than every known one.
FLOOR_PROFILE = "mistralai/mistral-7b-chat"


def blended_per_mtok(input_per_mtok: float, output_per_mtok: float) -> float:
    """One figure per price: the mean of input and output USD per million tokens."""
    return (input_per_mtok + output_per_mtok) / 2


def prior_profile(input_per_mtok: float, output_per_mtok: float) -> str:
    """The known model a deployment at this price is assumed to behave like: the
    dearest known model that costs no more (blended), else the cheapest known one."""
    price = blended_per_mtok(input_per_mtok, output_per_mtok)
    affordable = [
        (blended_per_mtok(*rates), name)
        for name, rates in PROFILE_PRICES.items()
        if blended_per_mtok(*rates) <= price
    ]
    return max(affordable)[1] if affordable else FLOOR_PROFILE


# How far under the target an explored candidate may be predicted: a bounded try (a
# learned offset moves within +-0.25), not a request sent to any cheap model.
EXPLORE_MARGIN = 0.1


@dataclass(frozen=True, slots=True)
class Estimate:
    """A candidate's predicted quality in [0, 1] and expected cost of this request;
    `prior`: what the predictor alone said, before live traffic moved it (None: the
    same as `quality`)."""

    quality: float
    cost_usd: float
    prior: float | None = None
    profile: str | None = None  # the known model the predictor rated it as

    @property
    def predicted(self) -> float:
        """What the predictor alone said of it."""
        return self.quality if self.prior is None else self.prior


@dataclass(frozen=True, slots=True)
class Choice:
    """The candidates in the order to try them, with what decided it."""

    estimates: Mapping[str, Estimate]
    fraction: float  # the route's quality_target
    target: float  # fraction x the reference's predicted quality
    order: tuple[str, ...]
    reference: str | None = None  # the candidate that is the route's reference, if one is

    def among(self, names: Collection[str]) -> Choice:
        """The same choice over only `names` (those that may be tried now)."""
        kept = {n: e for n, e in self.estimates.items() if n in names}
        return _ordered(kept, self.fraction, self.target, self.reference)

    @property
    def chosen(self) -> str:
        return self.order[0]  # `among` nothing: an empty order, which plans never ask

    def meets(self, name: str) -> bool:
        return self.estimates[name].quality >= self.target

    def chain(self) -> tuple[str, ...]:
        """The verified climb: the choice, then each time the cheapest candidate left
        predicted to do strictly better than the last one asked; then the strongest by
        the predictor alone and the reference, those of them not asked yet."""
        steps = [self.chosen]
        rest = sorted(self.order[1:], key=lambda n: self.estimates[n].cost_usd)
        while True:
            bar = self.estimates[steps[-1]].quality
            better = [n for n in rest if self.estimates[n].quality > bar]
            if not better:
                break
            steps.append(better[0])
            rest.remove(better[0])
        # Learned offsets may put a cheap model at the top of the climb: its rejected
        # answer still goes to the model the predictor rates best, then the reference.
        reference = [] if self.reference is None else [self.reference]
        for last_resort in [self.strongest(), *reference]:
            if last_resort in self.estimates and last_resort not in steps:
                steps.append(last_resort)
        return tuple(steps)

    def strongest(self) -> str:
        """The candidate the predictor alone rates best (the cheaper of equals)."""
        e = self.estimates
        return max(e, key=lambda n: (e[n].predicted, -e[n].cost_usd))

    def explorer(self, margin: float = EXPLORE_MARGIN) -> str | None:
        """The candidate to try first when exploring, cheaper than the choice and under
        the target: the cheapest that the predictor alone or traffic put at most
        `margin` under it. Traffic lowering one does not end its tries (it moves an
        offset only on verdicts, so one unlucky verdict would end them for good): a
        model that got better can earn its place back. None: no such one."""
        chosen = self.estimates[self.chosen]

        def worth_a_try(e: Estimate) -> bool:
            near = max(e.quality, e.predicted) >= self.target - margin
            return near and e.quality < self.target and e.cost_usd < chosen.cost_usd

        tries = [n for n, e in self.estimates.items() if worth_a_try(e)]
        return min(tries, key=lambda n: self.estimates[n].cost_usd, default=None)

    def reasons(self) -> list[str]:
        """One line per candidate, in order: its quality, cost and why it stands there."""
        of = "reference" if self.reference is None else f"reference '{self.reference}'"
        lines = [f"quality target {self.fraction:g} x {of} = {self.target:.3f}"]
        for name in self.order:
            e = self.estimates[name]
            if name == self.chosen:
                why = (
                    "chosen: the cheapest that meets the target"
                    if self.meets(name)
                    else "chosen: none meets the target, the best predicted"
                )
            elif self.meets(name):
                why = "meets the target, dearer: a fallback"
            else:
                why = "below the target: a last resort"
            lines.append(
                f"candidate '{name}': predicted quality {e.quality:.3f}, "
                f"expected cost ${e.cost_usd:.6f}: {why}"
            )
        return lines


def choose(
    estimates: Mapping[str, Estimate],
    reference_quality: float,
    fraction: float,
    reference: str | None = None,
) -> Choice:
    """Order `estimates` (name -> Estimate, in the route's order) for a request;
    `reference`: the candidate that is the route's reference (its estimate is then the
    reference quality, so that it always meets its own target)."""
    if not estimates:
        raise ValueError("no candidates to choose from")
    if reference is not None and reference in estimates:
        reference_quality = estimates[reference].quality
    else:
        reference = None
    return _ordered(estimates, fraction, fraction * reference_quality, reference)


def _ordered(
    estimates: Mapping[str, Estimate], fraction: float, target: float, reference: str | None
) -> Choice:
    names = list(estimates)
    meeting = sorted(
        (n for n in names if estimates[n].quality >= target), key=lambda n: estimates[n].cost_usd
    )
    below = sorted(
        (n for n in names if estimates[n].quality < target),
        key=lambda n: (-estimates[n].quality, estimates[n].cost_usd),
    )
    return Choice(dict(estimates), fraction, target, tuple(meeting + below), reference)
