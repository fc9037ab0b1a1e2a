"""Small upstream servers and bounded waits for tests that push bytes through proxies.

Everything binds 127.0.0.1 on a free port and runs in daemon threads; ``close``
stops the listener and every connection.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable

CLOSE_MARKER = b"<<close>>"


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.01) -> bool:
    """Poll ``predicate`` until true or ``timeout``; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


class EchoServer:
    """Echoes every byte back; closes a connection when it receives ``CLOSE_MARKER``."""

    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.accepted = 0
        self._thread = threading.Thread(target=self._accept, daemon=True, name="echo-accept")
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._conns.add(conn)
                self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def handle(self, conn: socket.socket, data: bytes) -> bool:
        """React to received bytes; False closes the connection."""
        if data.endswith(CLOSE_MARKER):
            return False
        conn.sendall(data)
        return True

    def _serve(self, conn: socket.socket) -> None:
        try:
            while True:
                data = conn.recv(65536)
                if not data or not self.handle(conn, data):
                    break
        except OSError:
            pass
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def close(self) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(2)

    def __enter__(self) -> "EchoServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SinkServer(EchoServer):
    """Counts bytes instead of echoing; answers ``b"ok"`` once ``expect`` bytes arrived."""

    def __init__(self, expect: int) -> None:
        self.expect = expect
        self.received = 0
        super().__init__()

    def handle(self, conn: socket.socket, data: bytes) -> bool:
        before = self.received
        self.received += len(data)
        if before < self.expect <= self.received:
            conn.sendall(b"ok")
        return True


def recv_exact(sock: socket.socket, count: int, timeout: float = 5.0) -> bytes:
    """Read exactly ``count`` bytes or raise (TimeoutError, EOFError)."""
    sock.settimeout(timeout)
    chunks = []
    got = 0
    while got < count:
        data = sock.recv(count - got)
        if not data:
            raise EOFError(f"closed after {got} of {count} bytes")
        chunks.append(data)
        got += len(data)
    return b"".join(chunks)


def read_until_closed(sock: socket.socket, timeout: float = 5.0) -> tuple[bytes, str]:
    """Read until the peer closes; returns (data, "eof" | "reset" | "timeout")."""
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    chunks = []
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return b"".join(chunks), "reset"
        except (TimeoutError, socket.timeout):
            return b"".join(chunks), "timeout"
        if not data:
            return b"".join(chunks), "eof"
        chunks.append(data)


def round_trip(sock: socket.socket, payload: bytes = b"ping", timeout: float = 10.0) -> float:
    """Send ``payload`` to an echo server and time until it is back, in seconds."""
    start = time.monotonic()
    sock.sendall(payload)
    echoed = recv_exact(sock, len(payload), timeout)
    elapsed = time.monotonic() - start
    if echoed != payload:
        raise AssertionError(f"echo mismatch: {echoed[:32]!r}")
    return elapsed


def port_of(listen: str) -> int:
    return int(listen.rsplit(":", 1)[1])


def connect(listen: str, timeout: float = 5.0) -> socket.socket:
    host, port = listen.rsplit(":", 1)
    return socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
