"""An httpx transport whose connections are aiohttp's.

The gateway keeps httpx's client API (requests, responses, timeouts, exceptions), but
httpcore's pool over anyio costs ~0.6 ms of CPU per request on these machines, more
than everything else the gateway does; aiohttp's C-accelerated pool costs ~0.2 ms
(figures from tests/benchmarks). LiteLLM ships the same arrangement for the same
reason. aiohttp's exceptions are translated to httpx's here, so callers see only httpx.

aiohttp is not imported at startup (~0.25 s of a replica's start): a new transport
imports it in a daemon thread, so a gateway answers `/readyz` meanwhile and its first
request rarely waits for it.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    import aiohttp

LARGE_BODY_BYTES = 1 << 20  # aiohttp's own threshold (`payload.TOO_LARGE_BYTES_BODY`)
BODY_SLICE_BYTES = 1 << 16


class AiohttpTransport(httpx.AsyncBaseTransport):
    """`httpx.AsyncClient(transport=AiohttpTransport())`: one pooled aiohttp session."""

    def __init__(self, max_connections: int = 1000, keepalive_s: float = 30.0) -> None:
        self._limit = max_connections
        self._keepalive_s = keepalive_s
        self._session: aiohttp.ClientSession | None = None
        if "aiohttp" not in sys.modules:
            threading.Thread(target=_import_aiohttp, name="import-aiohttp", daemon=True).start()

    def _open_session(self) -> aiohttp.ClientSession:
        # Created on first use: a session binds to the running event loop.
        if self._session is None or self._session.closed:
            import aiohttp

            connector = aiohttp.TCPConnector(
                limit=self._limit, keepalive_timeout=self._keepalive_s, ttl_dns_cache=300
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,  # httpx decodes content-encoding itself
                skip_auto_headers=("User-Agent", "Content-Type", "Accept-Encoding"),
                trust_env=False,
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeout = _timeout(request.extensions.get("timeout", {}))
        session = self._open_session()
        with _translate(request):
            response = await session.request(
                request.method,
                str(request.url),
                headers=request.headers.multi_items(),
                data=_payload(request.content),
                allow_redirects=False,
                timeout=timeout,
                compress=None,
            )
        return httpx.Response(
            status_code=response.status,
            headers=response.raw_headers,
            stream=_ResponseStream(response, request),
            request=request,
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _translate(self._request):
            async for chunk in self._response.content.iter_any():
                yield chunk

    async def aclose(self) -> None:
        self._response.release()


def _payload(content: bytes) -> bytes | AsyncIterator[memoryview]:
    """The body as aiohttp takes it: a large one (a base64 image, say) as slices of it,
    written one at a time as the socket takes them, since aiohttp warns against bytes
    over 1 MiB (a BytesIO would copy them). Its `content-length` header stays."""
    return _slices(content) if len(content) > LARGE_BODY_BYTES else content


async def _slices(content: bytes) -> AsyncIterator[memoryview]:
    view = memoryview(content)
    for start in range(0, len(view), BODY_SLICE_BYTES):
        yield view[start : start + BODY_SLICE_BYTES]


def _timeout(spec: dict[str, Any]) -> aiohttp.ClientTimeout:
    """httpx's per-phase timeouts in aiohttp's terms: `read` bounds each read (a stall),
    as in httpx; there is no total limit here, the executor owns deadlines."""
    import aiohttp

    return aiohttp.ClientTimeout(
        total=None,
        connect=spec.get("pool"),
        sock_connect=spec.get("connect"),
        sock_read=spec.get("read"),
    )


@contextmanager
def _translate(request: httpx.Request) -> Iterator[None]:
    try:
        yield
    except httpx.HTTPError:
        raise
    except Exception as exc:
        error = _httpx_error(exc)
        if error is None:
            raise
        raise error(str(exc) or type(exc).__name__, request=request) from exc


def _httpx_error(exc: Exception) -> type[httpx.TransportError] | None:
    import aiohttp

    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout
    if isinstance(exc, aiohttp.ServerTimeoutError | asyncio.TimeoutError):
        return httpx.ReadTimeout
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError
    if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError):
        return httpx.RemoteProtocolError
    if isinstance(exc, aiohttp.ClientError):
        return httpx.ReadError
    return None


def _import_aiohttp() -> None:
    import aiohttp  # noqa: F401
