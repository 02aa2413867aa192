"""Run the real gateway app under uvicorn on a loopback socket, in a thread, so that
tests (and the sync OpenAI SDK) talk to it over real HTTP."""

from __future__ import annotations

import logging
import socket
import threading
import time
from types import TracebackType
from typing import Self

import uvicorn

from gateway.http.app import create_app
from gateway.http.services import Services
from gateway.settings import Settings


class GatewayServer:
    def __init__(self, settings: Settings) -> None:
        self.app = create_app(settings)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            lifespan="on",
            proxy_headers=False,  # as `serve` runs it: no header replaces the peer
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(config)
        # A daemon: a server that fails to stop must not keep the test run from exiting.
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def services(self) -> Services:
        """The running app's services: its lifespan state, which uvicorn keeps."""
        services: Services = self._server.lifespan.state["services"]
        return services

    def start(self) -> Self:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("gateway failed to start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=20)
        if self._thread.is_alive():
            logging.getLogger(__name__).error("gateway on port %d did not stop in 20 s", self.port)
        self._sock.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
