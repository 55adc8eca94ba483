"""Run an ASGI app on a loopback port picked by the OS, in a background thread (tests, tools)."""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType
from typing import Any

import uvicorn


def tcp_listen_socket(host: str, port: int) -> socket.socket:
    """A bound TCP listening socket whose connections have TCP_NODELAY.

    asyncio sets TCP_NODELAY on an accepted connection only when its socket says `IPPROTO_TCP`, and
    a socket made with protocol 0 says 0; without it a small response on a reused connection waits
    for the peer's delayed ACK (~40 ms). Linux also copies the option from the listener."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    return sock


class ServerThread:
    """`with ServerThread(app) as url:` serves `app` on 127.0.0.1:<free port> until the block ends."""

    def __init__(self, app: Any, host: str = "127.0.0.1") -> None:
        self._sock = tcp_listen_socket(host, 0)  # the OS picks the port: no collisions with other servers
        self.port = int(self._sock.getsockname()[1])
        self.url = f"http://{host}:{self.port}"
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def start(self, timeout: float = 10.0) -> str:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server on {self.url} did not start")
            time.sleep(0.01)
        return self.url

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
