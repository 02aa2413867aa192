"""An ASGI app (the CPU engine's) served by uvicorn in a thread on an ephemeral loopback
port, for tests that talk to it over real HTTP. Used by test_cpu_server,
test_cpu_embeddings and tests/gateway/test_default_policy_e2e.

    with Server(create_app(service)) as server:
        httpx.get(f"{server.url}/health")
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from starlette.applications import Starlette


class Server:
    """uvicorn in a thread on an ephemeral loopback port."""

    def __init__(self, app: Starlette) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]})

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)
        self.sock.close()
