"""One probe of an engine's `/health`.

vLLM keeps its port closed while the model loads, answers 200 once it serves, and 503
when its engine core has died (the API server process may live on). So a probe is
`ok` (200), `down` (no HTTP answer: refused, reset, timed out) or `unhealthy` (any other
status).
"""

from __future__ import annotations

from typing import Literal

import httpx

HealthType = Literal["ok", "down", "unhealthy"]


def probe_health(url: str, client: httpx.Client, timeout_s: float) -> HealthType:
    """GET `url` once and classify the answer."""
    try:
        response = client.get(url, timeout=timeout_s)
    except httpx.HTTPError:
        return "down"
    return "ok" if response.status_code == 200 else "unhealthy"
