"""A proxy: a listener, its live connections and its toxics.

Mirrors Toxiproxy's Proxy: start binds (rewriting port 0 to the real
address), stop closes the listener and every live connection at once, and a
changed listen or upstream restarts it.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from typing import Any

from .addr import bind_listener
from .connection import Connection
from .errors import AlreadyStarted
from .fdwake import Waker
from .outage import UpstreamOutages
from .toxic_collection import ToxicCollection

log = logging.getLogger(__name__)

_ACCEPT_POLL_MS = 500
_JOIN_S = 1.0


class Proxy:
    """One named proxy; all public methods are thread-safe."""

    def __init__(self, name: str, listen: str, upstream: str) -> None:
        self.name = name
        self.listen = listen
        self.upstream = upstream
        self.enabled = False
        self.toxics = ToxicCollection()
        self.outages = UpstreamOutages(name)  # failed dials of the upstream, said once per outage
        self._lock = threading.RLock()
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._stop_waker: Waker | None = None
        self._accepting = False
        self._conns: set[Connection] = set()
        self._conns_lock = threading.Lock()

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            return {
                "name": self.name,
                "listen": self.listen,
                "upstream": self.upstream,
                "enabled": self.enabled,
                "toxics": self.toxics.array(),
            }

    # --- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Listen; raises AlreadyStarted, or ListenError (500) if the bind fails."""
        with self._lock:
            if self.enabled:
                raise AlreadyStarted(self.name)
            self._start()

    def stop(self) -> None:
        with self._lock:
            self._stop()

    def update(self, listen: str, upstream: str, enabled: bool) -> None:
        """Apply a PATCH: restart on a new address, then honour ``enabled``."""
        with self._lock:
            if listen != self.listen or upstream != self.upstream:
                self._stop()
                self.listen = listen
                self.upstream = upstream
            if enabled != self.enabled:
                if enabled:
                    self._start()
                else:
                    self._stop()

    def _start(self) -> None:
        listener, bound = bind_listener(self.listen)
        self.listen = bound
        self._listener = listener
        self._stop_waker = Waker()
        self._accepting = True
        self.enabled = True
        self._accept_thread = threading.Thread(
            target=self._accept_loop, args=(listener, self._stop_waker),
            name=f"toxiproxy-{self.name}-accept", daemon=True,
        )
        self._accept_thread.start()
        log.info("started proxy %s on %s -> %s", self.name, self.listen, self.upstream)

    def _stop(self) -> None:
        if not self.enabled:
            return
        self.enabled = False
        with self._conns_lock:
            self._accepting = False
        assert self._stop_waker is not None and self._listener is not None
        self._stop_waker.wake()
        if self._accept_thread is not None:
            self._accept_thread.join(_JOIN_S)
        self._listener.close()
        self._stop_waker.close()
        self._listener = None
        self._stop_waker = None
        self._accept_thread = None
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            conn.abort()
        self.outages.stopped()
        log.info("terminated proxy %s", self.name)

    def wait_closed(self, deadline: float) -> bool:
        """Wait (until a monotonic deadline) for every connection to release its fds."""
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            if not conn.done.wait(max(0.0, deadline - time.monotonic())):
                return False
        return True

    # --- connections ------------------------------------------------------------------

    def forget(self, conn: Connection) -> None:
        with self._conns_lock:
            self._conns.discard(conn)

    def connection_count(self) -> int:
        with self._conns_lock:
            return len(self._conns)

    def _accept_loop(self, listener: socket.socket, stop: Waker) -> None:
        poller = select.poll()
        poller.register(listener.fileno(), select.POLLIN)
        poller.register(stop.fileno(), select.POLLIN)
        while self._accepting:
            poller.poll(_ACCEPT_POLL_MS)
            if not self._accepting:
                return
            try:
                client, _peer = listener.accept()
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:
                log.warning("proxy %s: accept failed: %s", self.name, exc)
                poller.poll(100)  # e.g. out of fds: back off briefly instead of spinning
                continue
            self._adopt(client)

    def _adopt(self, client: socket.socket) -> None:
        with self._conns_lock:
            if not self._accepting:
                client.close()
                return
            conn = Connection(self, client)
            self._conns.add(conn)
        conn.acquire()
        try:
            threading.Thread(target=conn.serve, daemon=True,
                             name=f"toxiproxy-{self.name}-conn").start()
        except RuntimeError:
            conn.abort()
            conn.release()
