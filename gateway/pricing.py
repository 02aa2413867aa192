"""Prices per token for every deployment and route reference model.

Order of authority: the policy's `price` override, then the self-hosted figure
(`gpu_hour_usd / (3600 * tokens_per_second)` per token), then litellm's bundled
price map (`policies.prices` reads it, so that `policy check` judges a reference model
priced exactly as this does). A zero or missing price is *unpriced*, never free: it is
logged once, counted in metrics, and costs 0 in the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.ledger.record import NANOS_PER_USD
from policies.prices import litellm_rates


@dataclass(frozen=True, slots=True)
class TokenPrice:
    """USD per token; `source` says where it came from, for explain and metrics."""

    input_usd: float
    output_usd: float
    source: str  # "policy", "self_hosted", "litellm:<name>" or "unpriced"

    @property
    def priced(self) -> bool:
        return self.source != "unpriced"

    def cost_nanos(self, prompt_tokens: int, completion_tokens: int) -> int:
        usd = prompt_tokens * self.input_usd + completion_tokens * self.output_usd
        return round(usd * NANOS_PER_USD)


UNPRICED = TokenPrice(0.0, 0.0, "unpriced")


def lookup_litellm(name: str, provider: str | None = None) -> TokenPrice:
    """Price of a model in litellm's map, trying `name` then `provider/name`."""
    rates = litellm_rates(name, provider)
    if rates is None:
        return UNPRICED
    candidate, input_usd, output_usd = rates
    return TokenPrice(input_usd, output_usd, f"litellm:{candidate}")


def self_hosted_price(gpu_hour_usd: float, tokens_per_second: float) -> TokenPrice:
    per_token = gpu_hour_usd / (3600.0 * tokens_per_second)
    return TokenPrice(per_token, per_token, "self_hosted")


def policy_price(input_per_mtok: float, output_per_mtok: float) -> TokenPrice:
    return TokenPrice(input_per_mtok / 1e6, output_per_mtok / 1e6, "policy")
