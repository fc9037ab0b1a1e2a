"""One accepted client: dial the upstream, run both links, close the sockets once.

Sockets are only ever *shut down* while link threads may still use them;
the last thread out closes the file descriptors, so no thread can touch an fd
number that was closed and reused. A reset sets SO_LINGER 0 and skips the
shutdown, so the final close sends RST instead of FIN.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import socket
import struct
import threading
import time
from typing import TYPE_CHECKING

from .addr import resolve_dial
from .fdwake import Waker
from .link import Link
from .toxic_collection import DOWNSTREAM, UPSTREAM

if TYPE_CHECKING:
    from .proxy import Proxy

log = logging.getLogger(__name__)

DIAL_TIMEOUT_S = 30.0
IO_TIMEOUT_S = 0.25  # longest a blocking socket call may hold a link thread
_LINGER_RESET = struct.pack("ii", 1, 0)
_IO_TIMEOUT = struct.pack("ll", 0, int(IO_TIMEOUT_S * 1_000_000))


def _tune(sock: socket.socket) -> None:
    """Blocking fds with short kernel timeouts (see link.py); TCP_NODELAY as Go sets it."""
    sock.setblocking(True)
    for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
        sock.setsockopt(socket.SOL_SOCKET, option, _IO_TIMEOUT)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass


class Connection:
    """Client socket, upstream socket and the two links between them."""

    def __init__(self, proxy: "Proxy", client: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream: socket.socket | None = None
        self.closing = False
        self.resetting = False
        self.links: list[Link] = []
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._refs = 0
        self._fds_closed = False
        self._closed_waker = Waker()  # never drained: once closing, it stays readable
        self.closed_fd = self._closed_waker.fileno()

    # --- lifetime ---------------------------------------------------------------

    def acquire(self) -> None:
        with self._lock:
            self._refs += 1

    def release(self) -> None:
        with self._lock:
            self._refs -= 1
            if self._refs > 0 or self._fds_closed:
                return
            self._fds_closed = True
            for sock in (self.client, self.upstream):
                if sock is not None:
                    try:
                        sock.close()
                    except OSError:
                        pass
        self._closed_waker.close()
        self.proxy.forget(self)
        self.done.set()

    def abort(self, reset: bool = False) -> None:
        """Close now: FIN to both peers (EOF at once), or RST when ``reset``."""
        with self._lock:
            if self._fds_closed:
                return
            self.closing = True
            if reset and not self.resetting:
                self.resetting = True
                for sock in (self.client, self.upstream):
                    if sock is not None:
                        try:
                            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
                        except OSError:
                            pass
            elif not self.resetting:
                for sock in (self.client, self.upstream):
                    self._shutdown(sock)
            links = list(self.links)
        self._closed_waker.wake()
        for link in links:
            link.interrupt()

    def close_output(self, sock: socket.socket) -> None:
        """One direction ended: close its destination (the other direction reads EOF)."""
        with self._lock:
            if self._fds_closed or self.resetting:
                return
            self._shutdown(sock)

    @staticmethod
    def _shutdown(sock: socket.socket | None) -> None:
        if sock is None:
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # --- thread body ----------------------------------------------------------------

    def serve(self) -> None:
        """Dial upstream, then run the upstream link here and the downstream one in a thread.

        The caller has already ``acquire``d once for this thread.
        """
        try:
            upstream = self._dial(self.proxy.upstream)
            if upstream is None:
                return  # release() closes the client: the dial failed
            with self._lock:
                if self.closing:
                    upstream.close()
                    return
                self.upstream = upstream
            _tune(self.client)
            _tune(upstream)
            toxics = self.proxy.toxics
            up = Link(self, self.client, upstream, UPSTREAM, toxics)
            down = Link(self, upstream, self.client, DOWNSTREAM, toxics)
            with self._lock:
                self.links = [up, down]
            self.acquire()
            try:
                threading.Thread(target=self._run_link, args=(down,), daemon=True,
                                 name=f"toxiproxy-{self.proxy.name}-down").start()
            except RuntimeError:
                self.release()
                self.abort()
            up.run()
        except Exception:  # pragma: no cover - never leak fds on a bug
            log.exception("connection on proxy %s failed", self.proxy.name)
            self.abort()
        finally:
            self.release()

    def _run_link(self, link: Link) -> None:
        try:
            link.run()
        finally:
            self.release()

    def _dial(self, upstream: str) -> socket.socket | None:
        """Non-blocking connect that a disable or stop can cut short."""
        try:
            candidates = resolve_dial(upstream)
        except OSError as exc:  # e.g. a stopped container's name leaves Docker's DNS
            self.proxy.outages.failed(upstream, f"cannot resolve it: {exc.strerror or exc}")
            return None
        deadline = time.monotonic() + DIAL_TIMEOUT_S
        err = 0
        for family, address in candidates:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            err = sock.connect_ex(address)
            if err in (errno.EINPROGRESS, errno.EWOULDBLOCK):
                poller = select.poll()
                poller.register(sock.fileno(), select.POLLOUT)
                poller.register(self.closed_fd, select.POLLIN)
                while not self.closing:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or poller.poll(min(remaining, 0.5) * 1000):
                        break
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) if not self.closing else -1
                if err == 0 and time.monotonic() > deadline:
                    err = errno.ETIMEDOUT
            if err == 0:
                self.proxy.outages.answered()
                return sock
            sock.close()
            if self.closing:
                return None
        reason = os.strerror(err) if err > 0 else "no address to dial"
        self.proxy.outages.failed(upstream, f"unable to open a connection: {reason}")
        return None
