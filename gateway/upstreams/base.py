"""The interface of an upstream client, and the failures it raises.

    UpstreamFailure             anything that kept an attempt from producing an answer
    ├── UpstreamStatus          the upstream answered with an HTTP error status
    ├── UpstreamConnectFailed   could not connect / connection reset before the answer
    ├── UpstreamTimedOut        no answer in time: a stream silent for the deployment's
    │                           timeout, a whole answer past the request's deadline
    └── UpstreamUnsupported     this deployment cannot take a parameter the request sets

Implementations translate their library's exceptions into these, `raise ... from exc`,
so the executor decides retries and fallback from one small vocabulary.
"""

from __future__ import annotations

import email.utils
import logging
import re
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, AnyStr, Literal, Protocol

EndpointType = Literal["chat", "completions", "embeddings"]

# Statuses worth another try (on this deployment after backoff, or on the next one);
# 529 is Anthropic's "overloaded", a 503 by another name.
RETRYABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
ANTHROPIC_API_BASE = "https://api.anthropic.com"  # litellm's default too
REDACTED = "[redacted]"
MIN_SECRET_CHARS = 12  # shorter runs are no key's, and matching them would mangle text
CREDENTIAL_HEADER = re.compile(r"auth|key|token|secret|signature|cookie", re.IGNORECASE)
AUTH_SCHEME = re.compile(r"^\s*(bearer|basic|token)\s+", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class UpstreamTarget:
    """Everything a client needs to call one deployment."""

    deployment: str
    provider: str  # "openai" (any OpenAI-compatible server) or a litellm provider ("anthropic")
    model: str
    api_base: str | None
    api_key: str | None
    timeout_s: float = 60.0  # a stream's longest silence (its first byte included)
    connect_timeout_s: float = 5.0
    headers: Mapping[str, str] = field(default_factory=dict)
    load_report: bool = False  # ask for vLLM's `endpoint-load-metrics` response header
    # A non-streamed call's wait for its answer, which comes in one piece at the end of
    # the generation (the executor sets the request's time left); None: `timeout_s`.
    answer_timeout_s: float | None = None

    @property
    def answer_wait_s(self) -> float:
        """How long a non-streamed call waits for its answer."""
        return self.timeout_s if self.answer_timeout_s is None else self.answer_timeout_s

    def redact(self, text: str) -> str:
        """`text` without this deployment's secrets (its key, its headers' values), whole
        or their first `MIN_SECRET_CHARS` and more: an upstream's error may quote what it
        was sent, and errors reach clients and logs."""
        for secret in self._secrets():
            text = _without(text, secret, REDACTED)
        return text

    def redact_bytes(self, content: bytes) -> bytes:
        for secret in self._secrets():
            content = _without(content, secret.encode(), REDACTED.encode())
        return content

    def _secrets(self) -> list[str]:
        """The key, and the values of headers that carry credentials (by their names:
        `anthropic-beta: prompt-caching-2024-07-31` is no secret, and redacting it would
        mangle errors), a scheme such as `Bearer ` left out: errors quote the token."""
        values = [self.api_key]
        for name, value in self.headers.items():
            if CREDENTIAL_HEADER.search(name):
                values.append(AUTH_SCHEME.sub("", value))
        return [v for v in values if v and len(v) >= MIN_SECRET_CHARS]


class UpstreamFailure(Exception):
    """`message` may reach clients; `detail`, the transport's own words (hosts, ports,
    resolver errors: the operator's business, not a tenant's), only the logs."""

    retryable: bool = True

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retry_after_s: float | None = None,
        body: Any = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.retry_after_s = retry_after_s
        self.body = body
        self.detail = detail

    @property
    def logged(self) -> str:
        return self.message if self.detail is None else f"{self.message} ({self.detail})"


class UpstreamStatus(UpstreamFailure):
    def __init__(self, message: str, *, status: int, **kwargs: Any) -> None:
        super().__init__(message, status=status, **kwargs)
        self.retryable = status in RETRYABLE_STATUSES


class UpstreamConnectFailed(UpstreamFailure):
    pass


class UpstreamTimedOut(UpstreamFailure):
    pass


class UpstreamUnsupported(UpstreamFailure):
    """The deployment's provider does not support parameters the request sets (`n`,
    `seed`, `logprobs` on Anthropic, ...), refused before any call. Not the client's
    fault: another deployment of the route may support them, so the next one is tried;
    never retried here. `params`: the fields named, in the provider's order."""

    retryable = False

    def __init__(
        self, message: str, *, deployment: str, provider: str, params: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.deployment = deployment
        self.provider = provider
        self.params = params


@dataclass(slots=True)
class UpstreamReply:
    """A non-streaming answer: the OpenAI-format JSON body and the raw bytes, when the
    upstream spoke OpenAI already (so the gateway can forward them unchanged). A native
    call's (`gateway.native.upstream`) raw bytes are in the bridged API's format, its
    body their chat view."""

    body: dict[str, Any]
    raw: bytes | None = None


class UpstreamClient(Protocol):
    async def complete(
        self, target: UpstreamTarget, endpoint: EndpointType, body: dict[str, Any]
    ) -> UpstreamReply:
        """One non-streaming call. Raises UpstreamFailure."""
        ...

    def stream(
        self, target: UpstreamTarget, endpoint: EndpointType, body: dict[str, Any]
    ) -> AsyncIterator[list[bytes]]:
        """A streaming call yielding SSE event payloads (the text after `data: `, without
        `[DONE]`) in OpenAI chunk format, in non-empty lists of the events that arrived
        together, so the gateway can forward them in one write. Failures before the
        first list raise UpstreamFailure from the first `__anext__`; later ones too, and
        the caller must not retry them silently."""
        ...

    async def close(self) -> None: ...


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds to wait from `retry-after-ms` or `retry-after` (seconds or an HTTP date)."""
    if not headers:
        return None
    value = headers.get("retry-after-ms")
    scale = 1000.0
    if value is None:
        value, scale = headers.get("retry-after"), 1.0
    if value is None:
        return None
    try:
        return max(0.0, float(value) / scale)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


async def close_stream(events: AsyncIterator[object]) -> None:
    """Close an upstream stream (releasing its connection); a broken one is left as is."""
    aclose = getattr(events, "aclose", None)
    if aclose is None:
        return
    try:
        await aclose()
    except Exception:  # closing a broken upstream stream: nothing left to save
        logging.getLogger(__name__).debug("closing an upstream stream failed", exc_info=True)


def messages_url(api_base: str) -> str:
    """Anthropic's Messages endpoint under `api_base`: an API root (Anthropic's SDKs and
    litellm take `https://api.anthropic.com`), a `/v1` base, or the endpoint itself."""
    base = api_base.rstrip("/")
    if base.endswith("/v1/messages"):
        return base
    return base + ("/messages" if base.endswith("/v1") else "/v1/messages")


def _without(text: AnyStr, secret: AnyStr, mark: AnyStr) -> AnyStr:
    """`text` with each run of `secret`'s leading characters, at least
    `MIN_SECRET_CHARS` of them, replaced by `mark`."""
    head = secret[:MIN_SECRET_CHARS]
    parts, start = [], 0
    while (found := text.find(head, start)) >= 0:
        end = found + len(head)
        while end - found < len(secret) and end < len(text) and text[end] == secret[end - found]:
            end += 1
        parts += [text[start:found], mark]
        start = end
    parts.append(text[start:])
    return mark[:0].join(parts)
