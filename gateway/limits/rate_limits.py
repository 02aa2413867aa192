"""Rate limits: the headers OpenAI sends, and the 429 when a window is full.

Requests and tokens per minute, per key and per team, over a sliding window (see
`gateway.limits.scripts`). A request counts its prompt tokens plus the most output it
may produce (`max_tokens`, else the route's `max_output_tokens`) when it is admitted;
its settlement corrects the count to the tokens really used, in the minute it was
counted in (or the next one, where that minute is now the previous one). A request
that alone counts more tokens than a limit can never fit: its 429 says so, with
`x-should-retry: false` and no `Retry-After`, so the OpenAI SDKs do not retry it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gateway.errors import RateLimited
from gateway.limits.rules import RateRule
from gateway.limits.scripts import WINDOW_MS
from gateway.limits.store import RateKindType, RateRefusal

WINDOW_S = WINDOW_MS / 1000


def ratelimit_headers(
    rules: Sequence[RateRule], remaining: Sequence[tuple[int | None, int | None]]
) -> dict[str, str]:
    """`x-ratelimit-limit-*` / `x-ratelimit-remaining-*` for the tightest limit of
    each kind (a key's own limit or its team's, whichever has less left)."""
    headers: dict[str, str] = {}
    for index, kind in enumerate(("requests", "tokens")):
        tightest: tuple[int, int] | None = None
        for rule, left in zip(rules, remaining, strict=True):
            limit = rule.requests_per_minute if kind == "requests" else rule.tokens_per_minute
            if limit is None or left[index] is None:
                continue
            pair = (left[index] or 0, limit)
            if tightest is None or pair < tightest:
                tightest = pair
        if tightest is not None:
            headers[f"x-ratelimit-limit-{kind}"] = str(tightest[1])
            headers[f"x-ratelimit-remaining-{kind}"] = str(tightest[0])
    return headers


def wait_s(refusal: RateRefusal, cost: int, limit: int) -> float:
    """Seconds until a request of `cost` fits, if nothing else is admitted meanwhile:
    the estimate `previous * (1 - f) + current` falls as the minute's fraction f grows,
    and in the next minute `current` becomes the previous count. Needs `cost <= limit`."""
    elapsed = refusal.elapsed_ms / WINDOW_MS
    if refusal.current + cost <= limit and refusal.previous > 0:
        fraction = 1 - (limit - refusal.current - cost) / refusal.previous
        return max(0.0, (fraction - elapsed) * WINDOW_S)
    fraction = 1 - (limit - cost) / refusal.current if refusal.current > 0 else 0.0
    return (1 - elapsed + fraction) * WINDOW_S


def rate_limited(rule: RateRule, refusal: RateRefusal, tokens: int) -> RateLimited:
    kind: RateKindType = refusal.kind
    limit = (rule.requests_per_minute if kind == "requests" else rule.tokens_per_minute) or 0
    cost = 1 if kind == "requests" else tokens
    if cost > limit:
        error = too_large(rule, cost, limit)
    else:
        message = f"rate limit of {rule.scope} '{rule.name}' reached: {limit} {kind} per minute" + (
            "" if kind == "requests" else f"; this request counts {cost} tokens"
        )
        error = RateLimited(message, retry_after_s=math.ceil(wait_s(refusal, cost, limit)))
    error.headers[f"x-ratelimit-limit-{kind}"] = str(limit)
    error.headers[f"x-ratelimit-remaining-{kind}"] = "0"
    return error


def too_large(rule: RateRule, tokens: int, limit: int) -> RateLimited:
    """The 429 for a request that no wait lets through: retrying it is pointless."""
    message = (
        f"request too large for {rule.scope} '{rule.name}': it counts {tokens} tokens "
        f"(prompt + max output tokens), more than the {rule.scope}'s limit of {limit} "
        "tokens per minute; lower max_tokens or shorten the prompt"
    )
    return RateLimited(message, retry_after_s=None)
