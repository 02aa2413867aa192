"""litellm's bundled price map, read as JSON straight from the installed package
(importing litellm costs seconds; the file is all that is needed). `policy check` asks
it whether a reference model is priced; `gateway.billing.pricing` prices tokens with it, so
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


def litellm_entry(name: str, provider: str | None = None) -> tuple[str, Mapping[str, Any]] | None:
    """(the entry's name, the entry) of a model in the map with a price above zero,
    trying `name` then `provider/name`; None if neither has one (a zero price is no
    price: never free)."""
    table = litellm_price_map()
    candidates = [name]
    if provider and not name.startswith(f"{provider}/"):
        candidates.append(f"{provider}/{name}")
    for candidate in candidates:
        entry = table.get(candidate)
        if entry and (
            _rate(entry, "input_cost_per_token") or _rate(entry, "output_cost_per_token")
        ):
            return candidate, entry
    return None


def litellm_rates(name: str, provider: str | None = None) -> tuple[str, float, float] | None:
    """(the entry's name, USD per input token, per output token) of a model in the map,
    as `litellm_entry` finds it."""
    found = litellm_entry(name, provider)
    if found is None:
        return None
    candidate, entry = found
    return candidate, _rate(entry, "input_cost_per_token"), _rate(entry, "output_cost_per_token")


def _rate(entry: Mapping[str, Any], field: str) -> float:
    return float(entry.get(field) or 0.0)
