"""Prices per token for every deployment and route reference model.

Order of authority: the policy's `price` override, then the self-hosted figure
(`gpu_hour_usd / (3600 * tokens_per_second)` per token), then litellm's bundled
price map (`policies.prices` reads it, so that `policy check` judges a reference model
priced exactly as this does). A zero or missing price is *unpriced*, never free: it is
logged once, counted in metrics, and costs 0 in the ledger.

Token classes (`gateway.billing.usage`: cache reads and writes, reasoning, audio, image) have
their own rates where the provider bills them apart: the policy's `price` fields, else
the map's (`cache_read_input_token_cost`, ...), else the plain input or output rate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.billing.usage import (
    CLASS_NAMES,
    COMPLETION_SOURCES,
    NO_CLASSES,
    PROMPT_SOURCES,
    TokenClasses,
)
from gateway.ledger.record import NANOS_PER_USD
from policies.prices import litellm_entry
from policies.schema import Price

PROMPT_CLASSES = frozenset(PROMPT_SOURCES)
COMPLETION_CLASSES = frozenset(COMPLETION_SOURCES)
# Where litellm's map keeps each class's USD per token (the first present, above zero).
MAP_FIELDS: dict[str, tuple[str, ...]] = {
    "cache_read": ("cache_read_input_token_cost", "input_cost_per_token_cache_hit"),
    "cache_write": ("cache_creation_input_token_cost",),
    "audio_prompt": ("input_cost_per_audio_token",),
    "image_prompt": ("input_cost_per_image_token",),
    "reasoning": ("output_cost_per_reasoning_token",),
    "audio_completion": ("output_cost_per_audio_token",),
    "image_completion": ("output_cost_per_image_token",),
}
# The policy's `price` field (USD per million tokens) for each class.
POLICY_FIELDS: dict[str, str] = {
    "cache_read": "cached_input_per_mtok",
    "cache_write": "cache_write_per_mtok",
    "audio_prompt": "audio_input_per_mtok",
    "image_prompt": "image_input_per_mtok",
    "reasoning": "reasoning_per_mtok",
    "audio_completion": "audio_output_per_mtok",
    "image_completion": "image_output_per_mtok",
}


@dataclass(frozen=True, slots=True)
class ClassRates:
    """USD per token of each token class; None: the plain input (prompt classes) or
    output (completion classes) rate."""

    cache_read: float | None = None
    cache_write: float | None = None
    audio_prompt: float | None = None
    image_prompt: float | None = None
    reasoning: float | None = None
    audio_completion: float | None = None
    image_completion: float | None = None


NO_RATES = ClassRates()


@dataclass(frozen=True, slots=True)
class TokenPrice:
    """USD per token; `source` says where it came from, for explain and metrics."""

    input_usd: float
    output_usd: float
    source: str  # "policy", "self_hosted", "litellm:<name>" or "unpriced"
    rates: ClassRates = NO_RATES
    # The dearest prompt-side and completion-side rates, fixed with the price: what a
    # budget holds per token (`worst_case_nanos`, on every admission with limits).
    _worst: tuple[float, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        prompt = max([self.input_usd, *(self.rate(n) for n in PROMPT_CLASSES)])
        completion = max([self.output_usd, *(self.rate(n) for n in COMPLETION_CLASSES)])
        object.__setattr__(self, "_worst", (prompt, completion))

    @property
    def priced(self) -> bool:
        return self.source != "unpriced"

    def rate(self, name: str) -> float:
        """USD per token of the token class `name`."""
        rate = getattr(self.rates, name)
        if rate is not None:
            return float(rate)
        return self.input_usd if name in PROMPT_CLASSES else self.output_usd

    def worst_case_nanos(self, prompt_tokens: int, completion_tokens: int) -> int:
        """The most these tokens can cost, whatever classes the upstream reports them in
        (a cache write can cost more than plain input): what a budget holds."""
        prompt_rate, completion_rate = self._worst
        usd = prompt_tokens * prompt_rate + completion_tokens * completion_rate
        return math.ceil(usd * NANOS_PER_USD - 1e-6)  # up, but not for float noise

    def cost_nanos(
        self, prompt_tokens: int, completion_tokens: int, classes: TokenClasses = NO_CLASSES
    ) -> int:
        """What the tokens cost; `classes` are parts of the two totals, priced apart."""
        plain_prompt = max(prompt_tokens - classes.prompt, 0)
        plain_completion = max(completion_tokens - classes.completion, 0)
        usd = plain_prompt * self.input_usd + plain_completion * self.output_usd
        if classes != NO_CLASSES:
            for name in CLASS_NAMES:
                tokens = getattr(classes, name)
                if tokens:
                    usd += tokens * self.rate(name)
        return round(usd * NANOS_PER_USD)

    def cache_savings_nanos(
        self, prompt_tokens: int, completion_tokens: int, classes: TokenClasses
    ) -> int:
        """What the cache saved: the cost with its reads and writes priced as plain
        input, less the cost (negative when writes cost more than reads saved)."""
        if not (classes.cache_read or classes.cache_write):
            return 0
        uncached = self.cost_nanos(prompt_tokens, completion_tokens, classes.uncached())
        return uncached - self.cost_nanos(prompt_tokens, completion_tokens, classes)


UNPRICED = TokenPrice(0.0, 0.0, "unpriced")


def map_rates(entry: Mapping[str, Any]) -> ClassRates:
    """The class rates in one entry of litellm's map (a zero rate is no rate)."""
    found: dict[str, float] = {}
    for name, keys in MAP_FIELDS.items():
        rate = next((float(entry[k]) for k in keys if _positive(entry.get(k))), None)
        if rate is not None:
            found[name] = rate
    return ClassRates(**found)


def litellm_class_rates(name: str, provider: str | None = None) -> ClassRates:
    """The class rates litellm's map has for a model (none when it has no entry)."""
    found = litellm_entry(name, provider)
    return NO_RATES if found is None else map_rates(found[1])


def lookup_litellm(name: str, provider: str | None = None) -> TokenPrice:
    """Price of a model in litellm's map, trying `name` then `provider/name`."""
    found = litellm_entry(name, provider)
    if found is None:
        return UNPRICED
    candidate, entry = found
    input_usd = float(entry.get("input_cost_per_token") or 0.0)
    output_usd = float(entry.get("output_cost_per_token") or 0.0)
    return TokenPrice(input_usd, output_usd, f"litellm:{candidate}", map_rates(entry))


def self_hosted_price(gpu_hour_usd: float, tokens_per_second: float) -> TokenPrice:
    per_token = gpu_hour_usd / (3600.0 * tokens_per_second)
    return TokenPrice(per_token, per_token, "self_hosted")


def policy_price(price: Price, fallback: ClassRates = NO_RATES) -> TokenPrice:
    """The policy's `price`; a class it leaves unset keeps `fallback`'s rate (the
    provider's, from litellm's map), else the plain input or output rate."""
    rates = {
        name: per_mtok / 1e6 if (per_mtok := getattr(price, field)) is not None else None
        for name, field in POLICY_FIELDS.items()
    }
    chosen = {
        name: getattr(fallback, name) if rate is None else rate for name, rate in rates.items()
    }
    return TokenPrice(
        price.input_per_mtok / 1e6, price.output_per_mtok / 1e6, "policy", ClassRates(**chosen)
    )


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0
