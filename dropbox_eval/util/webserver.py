"""BackgroundServer: an ASGI app served by uvicorn on a thread (sandbox forge, API, tests)."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn


class BackgroundServer:
    """Serve `app` on host:port (0 = any free port) until `stop`. `date_header` False: the
    app sets `Date` itself (uvicorn's is refreshed once per loop tick and lags under load).
    `keep_alive`: seconds an idle connection is kept open (uvicorn's default: 5)."""

    def __init__(
        self,
        app: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        name: str = "http-server",
        date_header: bool = True,
        keep_alive: int = 5,
    ) -> None:
        self.app = app
        self.date_header = date_header
        self.keep_alive = keep_alive
        self.host = host
        self.port = port
        self.name = name
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """`http://host:port` of the bound socket."""
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 10.0) -> str:
        """Start serving and wait until the socket is bound; returns the URL."""
        config = uvicorn.Config(
            self.app,
            host=self.host,
            port=self.port,
            log_level="warning",
            access_log=False,
            date_header=self.date_header,
            timeout_keep_alive=self.keep_alive,
            proxy_headers=False,  # no header is believed here (web/throttle.py)
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, name=self.name, daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                raise RuntimeError(f"{self.name} did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        self._server, self._thread = server, thread
        self.port = server.servers[0].sockets[0].getsockname()[1]
        return self.url

    def stop(self) -> None:
        """Ask uvicorn to exit and join its thread."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
        self._server = self._thread = None
