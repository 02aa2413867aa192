"""Upstream clients: the OpenAI-compatible fast path and litellm for other providers."""

from gateway.upstreams.base import (
    UpstreamClient,
    UpstreamConnectFailed,
    UpstreamFailure,
    UpstreamReply,
    UpstreamStatus,
    UpstreamTarget,
    UpstreamTimedOut,
)

__all__ = [
    "UpstreamClient",
    "UpstreamConnectFailed",
    "UpstreamFailure",
    "UpstreamReply",
    "UpstreamStatus",
    "UpstreamTarget",
    "UpstreamTimedOut",
]
