"""Calls in a bridged API's own wire format, to deployments that serve it natively
(`gateway.native`), over the OpenAI-compatible client's connection pool:

    responses   POST {api_base}/responses          Authorization: Bearer <api_key>
    messages    POST {api_base}/v1/messages        x-api-key: <api_key>, anthropic-version
                (api_base defaults to Anthropic's; one ending in /v1 takes /messages)

The reply keeps the upstream's bytes (what the client gets) and carries its chat view
(what the pipeline reads); a stream yields its events (`NativeEvent`: parsed once, by the
SSE reader), up to the API's last event (neither sends `[DONE]`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from gateway.native.formats import (
    TERMINAL_EVENTS,
    NativeEvent,
    NativeSurface,
    chat_view,
    native_event,
)
from gateway.upstreams.base import (
    ANTHROPIC_API_BASE,
    UpstreamConnectFailed,
    UpstreamReply,
    UpstreamTarget,
    messages_url,
)
from gateway.upstreams.openai_impl import OpenAICompatibleClient, post_request

ANTHROPIC_VERSION = "2023-06-01"


class NativeClient:
    """Native calls over `http`'s pool (which owns and closes it)."""

    def __init__(self, http: OpenAICompatibleClient) -> None:
        self._http = http

    async def complete(
        self,
        target: UpstreamTarget,
        surface: NativeSurface,
        body: dict[str, Any],
        headers: Mapping[str, str],
    ) -> UpstreamReply:
        """One non-streaming call: the upstream's bytes and their chat view."""
        reply = await self._http.send(target, native_request(target, surface, body, headers))
        return UpstreamReply(chat_view(surface, reply.body), raw=reply.raw)

    def stream(
        self,
        target: UpstreamTarget,
        surface: NativeSurface,
        body: dict[str, Any],
        headers: Mapping[str, str],
    ) -> AsyncIterator[list[NativeEvent]]:
        """A streaming call: its events, each parsed once, as `UpstreamClient.stream`
        yields payloads."""
        terminal = TERMINAL_EVENTS[surface]
        request = native_request(target, surface, body, headers)
        return self._http.send_stream(target, request, native_event, lambda e: e.kind in terminal)


def native_request(
    target: UpstreamTarget,
    surface: NativeSurface,
    body: dict[str, Any],
    passed_on: Mapping[str, str],
) -> httpx.Request:
    """The HTTP request for `surface`: its path and credentials; the client's headers
    `passed_on`, then the deployment's own `headers`, override the defaults."""
    headers = {"content-type": "application/json"}
    if surface == "responses":
        if target.api_base is None:
            raise UpstreamConnectFailed(f"deployment '{target.deployment}' has no api_base")
        url = target.api_base.rstrip("/") + "/responses"
        credentials = {"authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    else:
        url = messages_url(target.api_base or ANTHROPIC_API_BASE)
        headers["anthropic-version"] = ANTHROPIC_VERSION
        credentials = {"x-api-key": target.api_key} if target.api_key else {}
    headers.update({**passed_on, **target.headers, **credentials})
    return post_request(target, url, headers, body)
