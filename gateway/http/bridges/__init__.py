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

ROUTES = [
    Route("/v1/responses", create_response, methods=["POST"]),
    Route(MESSAGES_PATH, messages.create_message, methods=["POST"]),
]


def error_body(path: str, error: GatewayError) -> dict[str, Any]:
    """An error as the API at `path` renders it: Anthropic's shape on its Messages API,
    OpenAI's everywhere else."""
    return messages.error_body(error) if path == MESSAGES_PATH else error.body()
