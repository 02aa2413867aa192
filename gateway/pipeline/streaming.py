"""Relaying a stream: forward the upstream's events, price it once however it ends.

The gateway always asks the upstream for usage (`stream_options.include_usage`) and
drops the usage-only event again when the client did not ask for it. A stream cut
short (client gone, upstream reset) is priced from the events seen so far, counted
with the tokenizer (a prompt it reported early stands). Also: a buffered reply as SSE,
and what a losing hedge consumed.

A stream's first events are no verdict on its deployment: it may stall or break after
them. Its end is: finished, a success; broken by the upstream (silent past `timeout_s`,
its connection cut, its own failure event), a failure, as a non-streamed attempt's
timeout is; cut short by its client, none.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import orjson
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.errors import GatewayError
from gateway.health.sla import SlaGuard
from gateway.ledger.record import StatusType
from gateway.limits import UNLIMITED
from gateway.native import NativeCall
from gateway.native.formats import NativeEvent, event_texts
from gateway.native.replay import replayed_stream
from gateway.pipeline.accounting import (
    Accountant,
    Usage,
    choice_texts,
    counted_output,
    counted_usage,
    reply_usage,
    reported_usage,
)
from gateway.pipeline.executor import Loser, Opened, StreamEvents
from gateway.pipeline.native_streams import NativeTally
from gateway.request import Call
from gateway.runtime import DeploymentRuntime
from gateway.upstreams.base import EndpointType, UpstreamFailure, UpstreamReply, close_stream

log = logging.getLogger(__name__)
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class StreamSettlement:
    """One relayed stream and its accounting, which happens exactly once however the
    stream ends: finished, broken upstream, client gone, or cancelled before its body
    was ever iterated (then `RelayedStream` calls `finish`)."""

    def __init__(
        self,
        accountant: Accountant,
        observe: Callable[[Call, DeploymentRuntime, str, float | None], None],
        call: Call,
        opened: Opened,
        wants_usage: bool,
        ttft: float,
        tally: Tally[Any] | None = None,
    ) -> None:
        self.accountant, self.observe = accountant, observe
        self.call, self.opened = call, opened
        self.ttft = ttft
        self.tally: Tally[Any] = tally or StreamTally(wants_usage)  # a native stream's own
        self.status: StatusType = "partial"
        self.finished = False
        self.guard: SlaGuard | None = None
        self.admission = UNLIMITED
        self.frames = 0
        self.failure: UpstreamFailure | None = None  # the upstream broke the stream

    async def relay(self) -> AsyncIterator[bytes]:
        try:
            events: StreamEvents | None = self.opened.first
            last: StreamEvents = []
            while events is not None:
                self.frames += len(events)
                if frame := self.tally.frame(events):
                    yield frame
                last, events = events, await anext(self.opened.rest, None)
            if self.tally.failed:
                self.failure = in_band_failure(self.opened.deployment.name, last)
            self.status = "partial" if self.tally.failed else "ok"
            await self.count_prompt()
            if self.tally.end:
                yield self.tally.end
        except UpstreamFailure as failure:
            # Bytes already reached the client: no silent retry, tell it in-band.
            log.warning(
                "stream %s broke after it started: %s", self.call.request_id, failure.logged
            )
            self.failure = failure
            await self.count_prompt()
            yield self.tally.error(failure)
        finally:
            await self.finish()

    async def count_prompt(self) -> None:
        """Count the prompt of a stream that reported no usage, off the loop if long,
        while the client still waits for the last event: `finish` may not await. A
        stream cut short by its client is counted in `finish`, on the loop."""
        if self.tally.usage is None and self.tally.early is None:
            model = self.opened.deployment.target.model
            await self.call.prompt.count(model, self.call.endpoint, self.call.body)

    async def finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        deployment = self.opened.deployment
        try:
            usage = self.tally.usage or self.counted(deployment)
        except Exception:  # never lose the record over counting: price what was reported
            log.exception("counting tokens of stream %s failed", self.call.request_id)
            usage = Usage(0, 0, "none")
        # Settled before any await: a cancelled task may not get past the next one.
        self.accountant.settle(self.call, deployment, usage, status=self.status, ttft_s=self.ttft)
        self.admission.settle(self.call.records)
        self.observe(self.call, deployment, "200", self.ttft)  # the status the client got
        if self.guard is not None:
            self.judge(self.guard, deployment.name)
        await close_stream(self.opened.rest)

    def judge(self, guard: SlaGuard, deployment: str) -> None:
        """Tell the guard how the attempt ended (see the module's docstring)."""
        if self.failure is not None:
            guard.stream_failed(deployment, self.failure)
            return
        streamed = time.perf_counter() - self.opened.opened_at
        finished = self.status == "ok"
        itl = streamed / (self.frames - 1) if self.frames > 1 and finished else None
        guard.stream_ended(deployment, itl, streamed, finished=finished)

    def counted(self, deployment: DeploymentRuntime) -> Usage:
        """A stream without final usage: its text counted. A prompt it reported early
        (the Messages API's `message_start`) stands, with its token classes; the output
        count reported with it (1, at the start) is only a floor."""
        early, call, texts = self.tally.early, self.call, self.tally.texts()
        if early is None:
            return counted_usage(deployment, call.endpoint, call.body, texts, call.prompt)
        completion = counted_output(deployment, call.endpoint, call.body, texts)
        if completion <= early.completion_tokens:
            return early
        return dataclasses.replace(early, completion_tokens=completion, source="counted")


class RelayedStream(StreamingResponse):
    """A StreamingResponse that runs `finish` when it ends, however it ends."""

    def __init__(
        self, content: AsyncIterator[bytes], finish: Callable[[], Awaitable[None]], **kwargs: Any
    ) -> None:
        super().__init__(content, **kwargs)
        self._finish = finish

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._finish()


Event = TypeVar("Event", contravariant=True)  # as the stream's client yields them


class Tally(Protocol[Event]):
    """What a relay keeps of a stream, and how it frames its events for the client."""

    usage: Usage | None  # final, as the upstream reported it
    early: Usage | None  # reported before the end, not final (its prompt is)
    end: bytes  # sent after the last event
    failed: bool  # the upstream ended the stream with an in-band failure event

    def frame(self, events: Sequence[Event]) -> bytes:
        """The SSE bytes to forward for events that arrived together (one write)."""
        ...

    def texts(self) -> list[str]:
        """The text the events carried, to count when no usage was reported."""
        ...

    def error(self, failure: UpstreamFailure) -> bytes:
        """The in-band error event for a stream that broke after it started."""
        ...


class StreamTally:
    """What a relayed chat or completions stream carried: every payload (to count tokens
    if the upstream reports no usage) and the usage it reported."""

    end = b"data: [DONE]\n\n"
    failed = False  # a chat stream's failures break the stream (UpstreamFailure)
    early: Usage | None = None  # a chat stream reports usage once, at its end

    def __init__(self, wants_usage: bool) -> None:
        self.wants_usage = wants_usage
        self.seen: list[bytes] = []
        self.usage: Usage | None = None

    def frame(self, events: Sequence[bytes]) -> bytes:
        """The SSE bytes to forward for events that arrived together (one write)."""
        self.seen.extend(events)
        out: list[bytes] = []
        for payload in events:
            if _reports_usage(payload) and (event := _parse(payload)) is not None:
                self.usage = reported_usage(event) or self.usage
                if not self.wants_usage and not event.get("choices"):
                    continue  # the usage-only event the client did not ask for
            out.append(b"data: " + payload + b"\n\n")
        return b"".join(out)

    def texts(self) -> list[str]:
        return stream_texts(self.seen)

    def error(self, failure: UpstreamFailure) -> bytes:
        return sse_error(failure)


def loser_answer(loser: Loser) -> tuple[DeploymentRuntime, dict[str, Any] | None]:
    """A losing hedge and its reply (None: it did not answer)."""
    result = loser.result
    return loser.deployment, result.body if isinstance(result, UpstreamReply) else None


def loser_usage(loser: Loser, call: Call) -> tuple[Usage, StatusType]:
    """What a losing hedge of `call` consumed: its answer's usage if it answered, else
    its prompt."""
    endpoint, body, prompt = call.endpoint, call.body, call.prompt
    result = loser.result
    if isinstance(result, UpstreamReply):
        return reply_usage(loser.deployment, endpoint, body, result.body, prompt), "ok"
    if isinstance(result, tuple):  # a stream that opened too late: count what came
        first, _ = result
        return counted_usage(
            loser.deployment, endpoint, body, stream_texts(first), prompt
        ), "partial"
    return counted_usage(loser.deployment, endpoint, body, (), prompt), "partial"


def buffered_events(
    native: NativeCall | None,
    deployment: DeploymentRuntime,
    reply: UpstreamReply,
    body: Mapping[str, Any],
    endpoint: EndpointType,
) -> bytes:
    """A verified (buffered) answer as the stream the client asked for: a native
    deployment's in its API's events, replayed from its reply (its own ids: a stored
    response is continued by them), else as chat events."""
    if native is not None and native.serves(deployment) and reply.raw is not None:
        return replayed_stream(native.surface, orjson.loads(reply.raw))
    wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    return completion_events(reply.body, wants_usage, endpoint)


def completion_events(
    reply: dict[str, Any], include_usage: bool, endpoint: EndpointType = "chat"
) -> bytes:
    """A buffered chat or text completion as the SSE stream OpenAI would have sent for
    it: per choice, one chunk with the whole answer, then one with its finish reason."""
    base = {k: reply.get(k) for k in ("id", "created", "model", "system_fingerprint")}
    chat = endpoint == "chat"
    base["object"] = "chat.completion.chunk" if chat else "text_completion"
    events = []
    for choice in reply.get("choices") or []:
        index = choice.get("index", 0)
        if chat:
            first = {"index": index, "delta": _delta(choice), "finish_reason": None}
            last = {"index": index, "delta": {}, "finish_reason": choice.get("finish_reason")}
        else:
            first = {"index": index, "text": choice.get("text") or "", "finish_reason": None}
            last = {"index": index, "text": "", "finish_reason": choice.get("finish_reason")}
        if choice.get("logprobs") is not None:  # the client asked: all of them in one chunk
            first["logprobs"] = choice["logprobs"]
        events += [{**base, "choices": [first]}, {**base, "choices": [last]}]
    if include_usage and reply.get("usage"):
        events.append({**base, "choices": [], "usage": reply["usage"]})
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def _delta(choice: Mapping[str, Any]) -> dict[str, Any]:
    """A chat choice's message as a stream delta: nulls left out, and each tool call
    numbered (`index`), as streamed tool-call deltas are."""
    message = choice.get("message") or {}
    delta = {k: v for k, v in message.items() if v is not None}
    calls = delta.get("tool_calls")
    if isinstance(calls, list):
        delta["tool_calls"] = [
            {"index": i, **call} if isinstance(call, Mapping) else call
            for i, call in enumerate(calls)
        ]
    return delta


def _reports_usage(payload: bytes) -> bool:
    # Upstreams asked for usage put `"usage": null` in every chunk: parse only real ones.
    return b'"usage":{' in payload or b'"usage": {' in payload


# A native stream's failure event (the Messages API's `error.type`, the Responses API's
# `code`) as the HTTP status its API answers that error with, for the breaker to judge:
# broken, busy, or (not listed: no status) the request's own fault.
IN_BAND_STATUSES = {
    "api_error": 500,
    "overloaded_error": 529,
    "rate_limit_error": 429,
    "server_error": 500,
    "rate_limit_exceeded": 429,
}


def in_band_failure(deployment: str, last: StreamEvents) -> UpstreamFailure:
    """The failure a native stream's upstream ended it with: its failure event ends the
    stream, so it is among the last events read."""
    failures = NativeTally.FAILURES
    data: Mapping[str, Any] = next(
        (e.data for e in reversed(last) if isinstance(e, NativeEvent) and e.kind in failures),
        {},
    )
    # Named in `response.error.code` (the Responses API's `response.failed`), `code` (its
    # `error` event) or `error.type` (the Messages API's `error` event).
    response = data.get("response")
    error = response.get("error") if isinstance(response, Mapping) else data.get("error")
    if not isinstance(error, Mapping):
        error = data
    name = error.get("code") or error.get("type")
    status = IN_BAND_STATUSES.get(name) if isinstance(name, str) else None
    message = f"deployment '{deployment}' failed its stream in-band ({name or 'unnamed'})"
    return UpstreamFailure(message, status=status)


def sse_error(failure: UpstreamFailure) -> bytes:
    error = GatewayError(f"upstream stream failed: {failure.message}", code="upstream_stream_error")
    body = error.body()
    body["error"]["type"] = "upstream_error"
    return b"data: " + orjson.dumps(body) + b"\n\n"


def _parse(payload: bytes) -> dict[str, Any] | None:
    try:
        event = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return event if isinstance(event, dict) else None


def stream_texts(events: Iterable[bytes | NativeEvent]) -> list[str]:
    """The generated text in a stream's events: chat or completion chunks' payloads, or
    a bridged API's native events (a losing hedge's stream may be either)."""
    texts: list[str] = []
    for event in events:
        if isinstance(event, NativeEvent):
            texts.extend(event_texts(event.data))
        elif (chunk := _parse(event)) is not None:
            texts.extend(choice_texts(chunk))
    return texts
