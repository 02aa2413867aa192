"""Relaying a native stream: the upstream's events go to the client as they came, and
its usage is read from the events that report it (`gateway.pipeline.streaming.Tally`).
Each event arrives parsed (`NativeEvent`, by the SSE reader): nothing here parses.

    Responses API   usage of `response.completed` (or `.incomplete`, `.failed`)
    Messages API    usage of `message_start`, updated by `message_delta`'s (its
                    `output_tokens` is the running total); final only with
                    `message_delta`: `message_start`'s output count is 1 whatever
                    follows, so a stream cut short before `message_delta` keeps its
                    prompt (`early`) and counts its text
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gateway.native.formats import (
    NativeEvent,
    NativeSurface,
    chat_usage,
    event_texts,
    frame,
    messages_error_event,
    responses_error_event,
)
from gateway.pipeline.accounting import Usage, reported_usage
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
    """What a native stream carried: its generated text (to count tokens if the
    upstream reports no final usage) and the usage it reported."""

    end = b""  # neither API sends a marker after its last event
    # Events by which the upstream says, in-band, that its answer failed.
    FAILURES = frozenset({"error", "response.failed"})

    def __init__(self, surface: NativeSurface) -> None:
        self.surface = surface
        self.usage: Usage | None = None  # final
        self.early: Usage | None = None  # the Messages API's `message_start` usage
        self._texts: list[str] = []
        self._reported: dict[str, Any] = {}  # the Messages API's usage, merged
        self._sequence = 0  # the Responses API's next `sequence_number`
        self.failed = False  # the upstream ended the stream with its own failure event

    def frame(self, events: Sequence[NativeEvent]) -> bytes:
        """The SSE bytes to forward for events that arrived together (one write)."""
        for event in events:
            self._read(event)
        return b"".join(frame(event.kind, event.payload) for event in events)

    def texts(self) -> list[str]:
        return self._texts

    def error(self, failure: UpstreamFailure) -> bytes:
        """The API's in-band error event for a stream that broke after it started."""
        message = f"upstream stream failed: {failure.message}"
        if self.surface == "responses":
            return responses_error_event(message, self._sequence)
        return messages_error_event(message)

    def _read(self, event: NativeEvent) -> None:
        data, kind = event.data, event.kind
        self._texts.extend(event_texts(data))
        sequence = data.get("sequence_number")
        if isinstance(sequence, int):
            self._sequence = sequence + 1
        self.failed = self.failed or kind in self.FAILURES
        if self.surface == "responses":
            response = data.get("response")
            if isinstance(response, dict) and response.get("usage") is not None:
                self.usage = self._usage(response["usage"]) or self.usage
        elif kind == "message_start" and isinstance(data.get("message"), dict):
            self.early = self._merge(data["message"].get("usage")) or self.early
        elif kind == "message_delta" and isinstance(data.get("usage"), dict):
            self.usage = self._merge(data["usage"]) or self.usage

    def _merge(self, usage: Any) -> Usage | None:
        if isinstance(usage, dict):
            self._reported.update({k: v for k, v in usage.items() if v is not None})
        return self._usage(self._reported)

    def _usage(self, usage: Any) -> Usage | None:
        return reported_usage({"usage": chat_usage(self.surface, usage)})
