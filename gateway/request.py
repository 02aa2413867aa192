"""What a request body asks of the gateway, read the same way by validation, budgets,
the selector and the upstream calls: output tokens per answer, the answers billed, and
the fields that cap an answer's length."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.billing.tokens import prompt_list
from gateway.upstreams.base import EndpointType

# The most output tokens one request may ask for: per choice, and over all its choices
# (prompts x n or best_of x max tokens). Beyond any model's context, far inside int64.
MAX_OUTPUT_TOKENS = 10_000_000
MAX_TOKEN_FIELDS = ("max_completion_tokens", "max_tokens")


def asked_tokens(body: Mapping[str, Any]) -> int | None:
    """The most output tokens per answer the client asks for (None: it sets none);
    `max_completion_tokens` first, as OpenAI reads it."""
    asked = body.get("max_completion_tokens") or body.get("max_tokens")
    return asked if isinstance(asked, int) and asked > 0 else None


def output_cap(endpoint: EndpointType, body: Mapping[str, Any], cap: int) -> dict[str, int]:
    """The max-token fields to set so that no answer runs past `cap` tokens: the
    client's own fields where they ask for more, else the endpoint's field (chat:
    `max_completion_tokens`, which every OpenAI chat model takes)."""
    if endpoint == "embeddings":
        return {}
    present = [f for f in MAX_TOKEN_FIELDS if body.get(f) is not None]
    if not present:
        return {"max_completion_tokens" if endpoint == "chat" else "max_tokens": cap}
    return {f: cap for f in present if body[f] > cap}


def choices_of(endpoint: EndpointType, body: Mapping[str, Any]) -> int:
    """How many answers a request is billed for: `n` (a completion's `best_of` when
    larger: each is generated), times a completion's prompts."""
    n = body.get("n") or 1
    if endpoint != "completions":
        return int(n)
    best_of = body.get("best_of") or 1
    return max(int(n), int(best_of)) * len(prompt_list(body.get("prompt")))
