"""The fast path: OpenAI-compatible upstreams (vLLM, OpenAI, any compatible server)
called directly over one pooled httpx transport.

Requests and responses are httpx's, sent straight to the transport rather than through
`httpx.AsyncClient.send`: a proxy wants none of the client's per-request machinery
(auth flows, redirects, and a cookie jar that would carry one upstream's cookies into
requests made for other tenants), and that machinery cost ~0.1 ms per request. The
transport is chosen by name (`TRANSPORTS`): aiohttp's connection pool by default (see
`aiohttp_transport`), or httpx's own httpcore pool.

Non-streaming replies keep the upstream's raw bytes so the gateway can forward them
unchanged, and are waited for whole (`UpstreamTarget.answer_wait_s`); a stream's every
read within the deployment's `timeout_s`. Streams are split into SSE events on bytes,
without decoding lines twice.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal, TypeVar

import httpx
import orjson

from gateway.upstreams.aiohttp_transport import AiohttpTransport
from gateway.upstreams.base import (
    EndpointType,
    UpstreamConnectFailed,
    UpstreamFailure,
    UpstreamReply,
    UpstreamStatus,
    UpstreamTarget,
    UpstreamTimedOut,
    retry_after,
)
from gateway.upstreams.error_bodies import error_message

TransportType = Literal["aiohttp", "httpcore"]
Event = TypeVar("Event")  # a stream's event as its reader parses it (`parsed_sse_events`)
TRANSPORTS: dict[str, Callable[[int], httpx.AsyncBaseTransport]] = {
    "aiohttp": lambda limit: AiohttpTransport(max_connections=limit),
    "httpcore": lambda limit: httpx.AsyncHTTPTransport(
        limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
    ),
}

# vLLM reports its load on a response when the request asks for it (ORCA format).
LOAD_REQUEST_HEADER = "endpoint-load-metrics-format"
LOAD_RESPONSE_HEADER = "endpoint-load-metrics"

PATHS: dict[str, str] = {
    "chat": "/chat/completions",
    "completions": "/completions",
    "embeddings": "/embeddings",
}


class OpenAICompatibleClient:
    """UpstreamClient for servers that speak OpenAI's HTTP API."""

    def __init__(
        self,
        max_connections: int = 1000,
        transport: TransportType = "aiohttp",
        on_load_report: Callable[[str, str], None] | None = None,
    ) -> None:
        self._transport = TRANSPORTS[transport](max_connections)
        self._urls: dict[tuple[str, str], httpx.URL] = {}
        # (deployment, header value) for vLLM's per-response `endpoint-load-metrics`
        self._on_load_report = on_load_report

    async def close(self) -> None:
        await self._transport.aclose()

    async def complete(
        self, target: UpstreamTarget, endpoint: EndpointType, body: dict[str, Any]
    ) -> UpstreamReply:
        return await self.send(target, self._request(target, endpoint, body))

    async def send(self, target: UpstreamTarget, request: httpx.Request) -> UpstreamReply:
        """One non-streaming call of a request built by `post_request` (any JSON API over
        this pool): its JSON object and raw bytes. Raises UpstreamFailure.

        The answer is waited for `target.answer_wait_s`, not the per-read `timeout_s`:
        a non-streamed upstream sends nothing until it has generated the whole answer."""
        wait_s = target.answer_wait_s
        if wait_s != target.timeout_s:
            request.extensions["timeout"] = {**request.extensions["timeout"], "read": wait_s}
        with translate_errors(target, wait_s):
            response = await self._transport.handle_async_request(request)
            self._load_report(target, response)
            try:
                content = await response.aread()
            finally:
                await response.aclose()
        if response.status_code != 200:
            raise status_failure(target, response.status_code, response.headers, content)
        try:
            parsed = orjson.loads(content)
        except orjson.JSONDecodeError as exc:
            raise UpstreamFailure(
                f"deployment '{target.deployment}' returned malformed JSON", status=502
            ) from exc
        if not isinstance(parsed, dict):
            raise UpstreamFailure(
                f"deployment '{target.deployment}' returned JSON that is not an object",
                status=502,
            )
        return UpstreamReply(body=parsed, raw=content)

    def stream(
        self, target: UpstreamTarget, endpoint: EndpointType, body: dict[str, Any]
    ) -> AsyncIterator[list[bytes]]:
        return self.send_stream(target, self._request(target, endpoint, body), json_payload)

    async def send_stream(
        self,
        target: UpstreamTarget,
        request: httpx.Request,
        parse: Callable[[bytes], Event | None],
        last: Callable[[Event], bool] | None = None,
    ) -> AsyncIterator[list[Event]]:
        """A streaming call of a request built by `post_request`: its SSE events as
        `parsed_sse_events` yields them (`parse`, `last`: see there)."""
        with translate_errors(target):
            response = await self._transport.handle_async_request(request)
        self._load_report(target, response)
        try:
            if response.status_code != 200:
                with translate_errors(target):
                    content = await response.aread()
                raise status_failure(target, response.status_code, response.headers, content)
            with translate_errors(target):
                chunks = response.aiter_raw()
                async for events in parsed_sse_events(chunks, parse, last):
                    yield events
                async for _ in chunks:  # read past [DONE] so the connection is reused
                    pass
        finally:
            await response.aclose()

    def _request(
        self, target: UpstreamTarget, endpoint: EndpointType, body: dict[str, Any]
    ) -> httpx.Request:
        # Built directly rather than with `build_request`, which re-merges the client's
        # defaults and re-parses the URL on every call.
        if target.api_base is None:
            raise UpstreamConnectFailed(f"deployment '{target.deployment}' has no api_base")
        headers = {"content-type": "application/json", **target.headers}
        if target.load_report:
            headers[LOAD_REQUEST_HEADER] = "text"
        if target.api_key:
            headers["authorization"] = f"Bearer {target.api_key}"
        return post_request(target, self._url(target.api_base, endpoint), headers, body)

    def _load_report(self, target: UpstreamTarget, response: httpx.Response) -> None:
        if target.load_report and self._on_load_report is not None:
            value = response.headers.get(LOAD_RESPONSE_HEADER)
            if value:
                self._on_load_report(target.deployment, value)

    def _url(self, api_base: str, endpoint: EndpointType) -> httpx.URL:
        url = self._urls.get((api_base, endpoint))
        if url is None:
            url = self._urls[(api_base, endpoint)] = httpx.URL(
                api_base.rstrip("/") + PATHS[endpoint]
            )
        return url


def post_request(
    target: UpstreamTarget, url: httpx.URL | str, headers: dict[str, str], body: dict[str, Any]
) -> httpx.Request:
    """A JSON POST to `url` with the deployment's timeouts."""
    # Built directly rather than with `build_request`, which re-merges the client's
    # defaults and re-parses the URL on every call.
    timeout = {
        "connect": target.connect_timeout_s,
        "read": target.timeout_s,
        "write": target.timeout_s,
        "pool": target.timeout_s,
    }
    return httpx.Request(
        "POST", url, content=orjson.dumps(body), headers=headers, extensions={"timeout": timeout}
    )


def sse_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[list[bytes]]:
    """An OpenAI stream's event payloads (each checked to be JSON), up to `[DONE]`."""
    return parsed_sse_events(chunks, json_payload)


async def parsed_sse_events(
    chunks: AsyncIterator[bytes],
    parse: Callable[[bytes], Event | None],
    last: Callable[[Event], bool] | None = None,
) -> AsyncIterator[list[Event]]:
    """Yield the SSE events (their joined `data:` lines, as `parse` reads them: the one
    parse of each) completed by each chunk read, as a list per read; stops at `[DONE]`,
    or after the event `last` says ends the stream (APIs that send no `[DONE]`). A body
    that ends before either was cut short, and one whose event `parse` finds no JSON
    (None) is broken: after its last good event, `UpstreamFailure` is raised."""
    buffer = b""
    data: list[bytes] = []
    async for chunk in chunks:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        events: list[Event] = []
        for raw_line in lines:
            line = raw_line.rstrip(b"\r")
            if line.startswith(b"data:"):
                data.append(line[5:].lstrip(b" "))
            elif not line and data:  # a blank line ends an event
                payload = b"\n".join(data)
                data = []
                if payload == b"[DONE]":
                    if events:
                        yield events
                    return
                event = parse(payload)
                if event is None:
                    # Relayed, it would break the client's parser, not raise an API error.
                    if events:
                        yield events
                    raise UpstreamFailure("the upstream stream sent an event that is not JSON")
                events.append(event)
                if last is not None and last(event):
                    yield events
                    return
        if events:
            yield events
    # An event not ended by a blank line is incomplete (the SSE rule): dropped.
    ended = "without [DONE]" if last is None else "before its last event"
    raise UpstreamFailure(f"the upstream stream ended {ended}")


def json_payload(payload: bytes) -> bytes | None:
    """`payload` if it is JSON (an OpenAI stream's chunks are read again only when they
    report usage), else None."""
    try:
        orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return payload


@contextmanager
def translate_errors(target: UpstreamTarget, wait_s: float | None = None) -> Iterator[None]:
    """Turn httpx's exceptions into UpstreamFailure, naming the deployment; `wait_s`: the
    read timeout when it is not the deployment's `timeout_s` (a non-streamed answer)."""
    name = target.deployment
    try:
        yield
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
        # No free connection in time is no connection: nothing was sent (aiohttp's pool
        # reports that wait as a connect timeout too).
        raise UpstreamConnectFailed(
            f"cannot connect to deployment '{name}'", detail=str(exc)
        ) from exc
    except httpx.TimeoutException as exc:
        waited = target.timeout_s if wait_s is None else wait_s
        raise UpstreamTimedOut(f"deployment '{name}' did not answer within {waited:g}s") from exc
    except httpx.HTTPError as exc:
        raise UpstreamConnectFailed(
            f"connection to deployment '{name}' failed", detail=repr(exc)
        ) from exc


def status_failure(
    target: UpstreamTarget, status: int, headers: httpx.Headers, content: bytes
) -> UpstreamStatus:
    content = target.redact_bytes(content)  # any status's message may quote the key
    if status in (401, 403):  # its message can quote (part of) the gateway's own key
        message = "the upstream rejected the gateway's credentials for this deployment"
    else:
        message = error_message(content) or f"HTTP {status}"
    return UpstreamStatus(
        f"deployment '{target.deployment}' answered {status}: {message}",
        status=status,
        retry_after_s=retry_after(headers),
        body=content,
    )
