"""A scripted in-process upstream client for timing-level gateway tests (hedging,
second opinions): each deployment's answer is a coroutine the test writes. The same
paths run over real sockets in the end-to-end tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gateway.upstreams.base import EndpointType, UpstreamReply, UpstreamTarget

Behaviour = Callable[[], Awaitable[UpstreamReply]]


class ScriptedClient:
    """An UpstreamClient whose answers are scripted per deployment; records the calls."""

    def __init__(self, behaviours: dict[str, Behaviour]) -> None:
        self.behaviours = behaviours
        self.calls: list[str] = []

    async def complete(
        self, target: UpstreamTarget, endpoint: EndpointType, body: dict[str, Any]
    ) -> UpstreamReply:
        self.calls.append(target.deployment)
        return await self.behaviours[target.deployment]()
