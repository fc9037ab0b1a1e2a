"""ToxiproxyServer: the HTTP API plus its proxies, usable in-process or from the CLI."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from .api import Api, ApiHTTPServer
from .collection import ProxyCollection
from .config import populate_from_file

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 1.0


class ToxiproxyServer:
    """A Toxiproxy-compatible server.

    ``srv = ToxiproxyServer(host="127.0.0.1", port=0); srv.start(); ...; srv.stop()``.
    Port 0 picks a free port; ``srv.port`` and ``srv.url`` tell which.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 8474,
                 config: str | Path | None = None) -> None:
        self.host = host
        self._requested_port = port
        self.config = config
        self.proxies = ProxyCollection()
        self._httpd: ApiHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._httpd is None:
            return self._requested_port
        return self._httpd.server_port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._httpd is not None

    def start(self) -> "ToxiproxyServer":
        """Bind the API port, apply ``config`` if given, and serve in a daemon thread.

        A config file that cannot be applied raises ``ConfigError`` and leaves nothing running.
        """
        if self._httpd is not None:
            return self
        httpd = ApiHTTPServer((self.host, self._requested_port), Api(self.proxies))
        try:
            if self.config is not None:
                populate_from_file(self.proxies, self.config)
        except Exception:
            httpd.server_close()
            self.proxies.clear()
            raise
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="toxiproxy-api", daemon=True)
        self._thread.start()
        log.info("Starting Toxiproxy HTTP server on %s (version compatible with 2.12.0)", self.url)
        return self

    def stop(self) -> None:
        """Stop the API and every proxy, closing all connections, in about a second at most."""
        httpd, self._httpd = self._httpd, None
        deadline = time.monotonic() + STOP_TIMEOUT_S
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
            httpd.close_open_connections()
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))
            self._thread = None
        self.proxies.clear(timeout=max(0.1, deadline - time.monotonic()))

    def __enter__(self) -> "ToxiproxyServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
