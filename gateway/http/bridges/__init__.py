"""Other APIs' formats served through the chat pipeline: OpenAI's Responses API and
Anthropic's Messages API, translated at the edge with litellm's translation code."""

from __future__ import annotations

from typing import Any

from starlette.routing import Route

from gateway.errors import GatewayError
from gateway.http.bridges import messages
from gateway.http.bridges.responses import create_response

__all__ = ["ROUTES", "error_body"]

MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"

ROUTES = [
    Route("/v1/responses", create_response, methods=["POST"]),
    Route(MESSAGES_PATH, messages.create_message, methods=["POST"]),
    Route(COUNT_TOKENS_PATH, messages.count_tokens, methods=["POST"]),
]


def error_body(path: str, error: GatewayError) -> dict[str, Any]:
    """An error as the API at `path` renders it: Anthropic's shape on its Messages API,
    OpenAI's everywhere else."""
    anthropic = path in (MESSAGES_PATH, COUNT_TOKENS_PATH)
    return messages.error_body(error) if anthropic else error.body()
