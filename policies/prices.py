"""litellm's bundled price map, read as JSON straight from the installed package
(importing litellm costs seconds; the file is all that is needed). `policy check` asks
it whether a reference model is priced; `gateway.pricing` prices tokens with it, so
the two never disagree."""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PRICE_MAP_FILE = "model_prices_and_context_window_backup.json"


@functools.cache
def litellm_root() -> Path | None:
    """The installed litellm package's directory (found, not imported: importing it
    costs seconds), or None when it is not installed."""
    spec = importlib.util.find_spec("litellm")
    return None if spec is None or spec.origin is None else Path(spec.origin).parent


@functools.cache
def litellm_price_map() -> Mapping[str, Mapping[str, Any]]:
    root = litellm_root()
    if root is None:
        log.warning("litellm is not installed: prices come from the policy only")
        return {}
    path = root / PRICE_MAP_FILE
    data: dict[str, Mapping[str, Any]] = json.loads(path.read_text())
    data.pop("sample_spec", None)
    return data


def litellm_rates(name: str, provider: str | None = None) -> tuple[str, float, float] | None:
    """(the entry's name, USD per input token, per output token) of a model in the map,
    trying `name` then `provider/name`; None if neither has a price above zero (a zero
    price is no price: never free)."""
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
            return candidate, input_usd, output_usd
    return None
