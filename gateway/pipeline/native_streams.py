"""Relaying a native stream: the upstream's events go to the client as they came, and
its usage is read from the events that report it (`gateway.pipeline.streaming.Tally`).

    Responses API   usage of `response.completed` (or `.incomplete`, `.failed`)
    Messages API    usage of `message_start`, updated by `message_delta`'s (its
                    `output_tokens` is the running total)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from gateway.native.formats import (
    NativeSurface,
    chat_usage,
    frame,
    messages_error_event,
    responses_error_event,
)
from gateway.pipeline.accounting import Usage, reported_usage
from gateway.pipeline.streaming import stream_texts
from gateway.upstreams.base import UpstreamFailure

if TYPE_CHECKING:
    from gateway.native.call import NativeCall
    from gateway.runtime import DeploymentRuntime


def native_tally(native: NativeCall | None, deployment: DeploymentRuntime) -> NativeTally | None:
    """The tally of a stream `deployment` opened: its API's own when it was sent the
    request natively, else None (a chat stream)."""
    if native is None or not native.serves(deployment):
        return None
    return NativeTally(native.surface)


class NativeTally:
    """What a native stream carried: every payload (to count tokens if the upstream
    reports no usage) and the usage it reported."""

    end = b""  # neither API sends a marker after its last event
    # Events by which the upstream says, in-band, that its answer failed.
    FAILURES = frozenset({"error", "response.failed"})

    def __init__(self, surface: NativeSurface) -> None:
        self.surface = surface
        self.seen: list[bytes] = []
        self.usage: Usage | None = None
        self._reported: dict[str, Any] = {}  # the Messages API's usage, merged
        self._sequence = 0  # the Responses API's next `sequence_number`
        self.failed = False  # the upstream ended the stream with its own failure event

    def frame(self, events: list[bytes]) -> bytes:
        """The SSE bytes to forward for events that arrived together (one write)."""
        self.seen.extend(events)
        for payload in events:
            if b'"usage"' in payload or b'"sequence_number"' in payload or b'"error"' in payload:
                self._read(payload)
        return b"".join(frame(payload) for payload in events)

    def texts(self) -> list[str]:
        return stream_texts(self.seen)

    def error(self, failure: UpstreamFailure) -> bytes:
        """The API's in-band error event for a stream that broke after it started."""
        message = f"upstream stream failed: {failure.message}"
        if self.surface == "responses":
            return responses_error_event(message, self._sequence)
        return messages_error_event(message)

    def _read(self, payload: bytes) -> None:
        event = _parse(payload)
        if event is None:
            return
        sequence = event.get("sequence_number")
        if isinstance(sequence, int):
            self._sequence = sequence + 1
        kind = event.get("type")
        self.failed = self.failed or kind in self.FAILURES
        if self.surface == "responses":
            response = event.get("response")
            if isinstance(response, dict) and response.get("usage") is not None:
                self._report(response["usage"])
        elif kind == "message_start" and isinstance(event.get("message"), dict):
            self._merge(event["message"].get("usage"))
        elif kind == "message_delta":
            self._merge(event.get("usage"))

    def _merge(self, usage: Any) -> None:
        if isinstance(usage, dict):
            self._reported.update({k: v for k, v in usage.items() if v is not None})
            self._report(self._reported)

    def _report(self, usage: Any) -> None:
        self.usage = reported_usage({"usage": chat_usage(self.surface, usage)}) or self.usage


def _parse(payload: bytes) -> dict[str, Any] | None:
    try:
        event = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return event if isinstance(event, dict) else None
