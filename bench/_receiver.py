"""A loopback callback receiver that keeps the first delivery of each path waiting: the
node sending it holds the batch's `deliver` lease for as long as the receiver is silent.

Not part of the package; the bench scripts import it from `sys.path[0]`.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

LATER_ANSWER = 0.5  # seconds before a later POST is answered: its sender's lease shows


class HoldingReceiver:
    """POST <path>: the first one to each path is answered only when the receiver closes;
    each later one after LATER_ANSWER s, 200. `arrivals(path)` are the moments
    (`time.perf_counter()`) the POSTs arrived."""

    def __init__(self) -> None:
        self.url = ""
        self._arrived: dict[str, list[float]] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server: ThreadingHTTPServer | None = None

    def arrivals(self, path: str) -> list[float]:
        """When each POST to `path` arrived."""
        with self._lock:
            return list(self._arrived.get(path, []))

    def _arrive(self, path: str) -> int:
        with self._lock:
            seen = self._arrived.setdefault(path, [])
            seen.append(time.perf_counter())
            return len(seen)

    def __enter__(self) -> HoldingReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if receiver._arrive(self.path) == 1:
                    receiver._closing.wait()
                else:
                    time.sleep(LATER_ANSWER)
                try:
                    self.send_response(200)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"{}")
                except OSError:
                    pass  # its sender was killed meanwhile

            def log_message(self, *args: Any) -> None:
                return

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="bench-receiver", daemon=True).start()
        self._server = server
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closing.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
