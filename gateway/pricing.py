"""Prices per token for every deployment and route reference model.

Order of authority: the policy's `price` override, then the self-hosted figure
(`gpu_hour_usd / (3600 * tokens_per_second)` per token), then litellm's bundled
price map, read as JSON straight from the installed package (importing litellm
costs seconds; the file is all we need). A zero or missing price is *unpriced*,
never free: it is logged once, counted in metrics, and costs 0 in the ledger.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.ledger.record import NANOS_PER_USD

log = logging.getLogger(__name__)

PRICE_MAP_FILE = "model_prices_and_context_window_backup.json"


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


@functools.cache
def litellm_price_map() -> Mapping[str, Mapping[str, Any]]:
    spec = importlib.util.find_spec("litellm")
    if spec is None or spec.origin is None:
        log.warning("litellm is not installed: prices come from the policy only")
        return {}
    path = Path(spec.origin).parent / PRICE_MAP_FILE
    data: dict[str, Mapping[str, Any]] = json.loads(path.read_text())
    data.pop("sample_spec", None)
    return data


def lookup_litellm(name: str, provider: str | None = None) -> TokenPrice:
    """Price of a model in litellm's map, trying `name` then `provider/name`."""
    table = litellm_price_map()
    candidates = [name]
    if provider and not name.startswith(f"{provider}/"):
        candidates.append(f"{provider}/{name}")
    for candidate in candidates:
        entry = table.get(candidate)
        if not entry:
            continue
        input_usd = float(entry.get("input_cost_per_token") or 0.0)
        output_usd = float(entry.get("output_cost_per_token") or 0.0)
        if input_usd > 0 or output_usd > 0:
            return TokenPrice(input_usd, output_usd, f"litellm:{candidate}")
    return UNPRICED


def self_hosted_price(gpu_hour_usd: float, tokens_per_second: float) -> TokenPrice:
    per_token = gpu_hour_usd / (3600.0 * tokens_per_second)
    return TokenPrice(per_token, per_token, "self_hosted")


def policy_price(input_per_mtok: float, output_per_mtok: float) -> TokenPrice:
    return TokenPrice(input_per_mtok / 1e6, output_per_mtok / 1e6, "policy")
