"""A learner's connection to the syncer: HELLO handshake, requests with deadlines, reconnects.

One persistent TCP connection per learner. Every call has a deadline; reconnects use
tenacity with exponential backoff and jitter, and their sleeps wake at once when the
learner stops, so shutting down never waits out a backoff.
"""
from __future__ import annotations

import secrets
import socket
import threading
import time
from dataclasses import dataclass

from tenacity import (Retrying, retry_if_exception, retry_if_exception_type, stop_after_delay, stop_any,
                      wait_exponential_jitter)
from tenacity.stop import stop_base

from . import wire
from .events import EventLog
from .protocol import FATAL_REASONS, RETRY_LATER_REASONS, FrameFault, FrameType, Reason, Refusal, reason_of

__all__ = ["FATAL_REASONS", "TRANSIENT", "Address", "Link", "Refusal", "retry_later"]

# Worth a reconnect: the syncer's ERROR replies (Refusal) are decisions, handled apart.
TRANSIENT = (OSError, FrameFault, wire.DeadlineExceeded, wire.PeerClosed)
CONNECT_TIMEOUT = 3.0
MIN_WIRE_RATE = 2_000_000  # bytes/s assumed when sizing a deadline for a large frame
# A peer whose kernel stops answering (its address gone, say a container cut off its network
# and reattached with a new one) must be found within seconds, not at the end of a reply
# deadline sized for 64 MiB at MIN_WIRE_RATE (37 s). Two kernel timers do it:
# - TCP_USER_TIMEOUT: bytes we sent, still unacknowledged after the request timeout, fail
#   the connection (a push written into a dead connection);
# - keepalive: a silent connection (waiting for a reply, nothing unacknowledged) is probed
#   after IDLE s, and fails after COUNT unanswered probes INTERVAL s apart.
# The proxy's kernel acknowledges bytes and answers probes while a toxic holds the data back,
# so a slow, delayed or blackholed link is still judged by the request deadlines alone.
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 2, 1, 3


def detect_dead_peers(sock: socket.socket, unacknowledged_for: float, idle: int = KEEPALIVE_IDLE,
                      interval: int = KEEPALIVE_INTERVAL, count: int = KEEPALIVE_COUNT) -> None:
    """Fail the connection (ETIMEDOUT) when the peer's kernel is gone, busy or idle."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    options = (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", count),
               ("TCP_USER_TIMEOUT", max(1, int(unacknowledged_for * 1000))))
    for option, value in options:
        if hasattr(socket, option):  # Linux; elsewhere the system's defaults apply
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


class _stop_when_set(stop_base):
    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, retry_state) -> bool:  # type: ignore[override]
        return self.event.is_set()


def retry_later(exc: BaseException) -> bool:
    """A refusal that says "not now" (the syncer's disk is full or failing): keep the
    request and send it again after a backoff."""
    return isinstance(exc, Refusal) and exc.reason in RETRY_LATER_REASONS


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> "Address":
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--connect: expected HOST:PORT, got {text!r}")
        return cls(host, int(port))

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


class Link:
    def __init__(self, address: Address, secret: bytes, learner: int, mode: str,  # secret: key_N (keys.py)
                 events: EventLog, request_timeout: float, stop: threading.Event) -> None:
        self.address = address
        self.secret = secret
        self.learner = learner
        self.mode = mode
        self.events = events
        self.request_timeout = request_timeout
        self.stop = stop
        self.nonce = secrets.token_hex(8)
        self.lock = threading.RLock()
        self.channel: wire.Channel | None = None
        self.connections = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self.last_reply = 0.0  # monotonic time of the last frame the syncer answered

    # ----------------------------------------------------------------- basics
    def deadline_for(self, nbytes: int) -> float:
        return time.monotonic() + self.request_timeout + nbytes / MIN_WIRE_RATE

    def _exchange(self, channel: wire.Channel, msg: wire.Message) -> wire.Frame:
        self.bytes_up += channel.send(msg, self.deadline_for(msg.wire_size))
        reply = channel.recv(self.deadline_for(wire.DEFAULT_MAX_PAYLOAD))
        self.bytes_down += reply.wire_bytes
        self.last_reply = time.monotonic()
        if reply.type == FrameType.ERROR:
            raise Refusal(reason_of(reply.header.get("reason")), str(reply.header.get("detail")))
        return reply

    def close(self, reason: str | None = None) -> None:
        with self.lock:
            if self.channel is not None:
                try:
                    self.channel.close()
                finally:
                    self.channel = None
                if reason:
                    self.events.emit("disconnect", error=reason)

    @property
    def connected(self) -> bool:
        return self.channel is not None

    # ----------------------------------------------------------------- handshake
    def _handshake(self, want_params: bool, seeded: bool = False) -> wire.Frame:
        sock = socket.create_connection((self.address.host, self.address.port), timeout=CONNECT_TIMEOUT)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        detect_dead_peers(sock, unacknowledged_for=self.request_timeout)
        try:
            channel = wire.Channel.connect(sock, self.secret, self.deadline_for(0), self.learner)
            self.bytes_up += wire.HANDSHAKE.size
            self.bytes_down += wire.HANDSHAKE.size
            header = {"learner": self.learner, "nonce": self.nonce, "mode": self.mode, "want_params": want_params}
            if seeded:  # this learner can build the initial parameters from the run's seed
                header["seeded"] = True
            hello = wire.message(FrameType.HELLO, header)
            welcome = self._exchange(channel, hello)
            if welcome.type != FrameType.WELCOME:
                raise FrameFault(Reason.PROTOCOL, f"expected WELCOME, got {welcome.type}")
        except BaseException:
            sock.close()
            raise
        self.channel = channel
        self.connections += 1
        self.events.emit("connect", address=str(self.address), incarnation=welcome.header.get("incarnation"),
                         connections=self.connections, wire_bytes=welcome.wire_bytes)
        return welcome

    def connect(self, want_params: bool, budget: float, seeded: bool = False) -> wire.Frame:
        """HELLO until it succeeds, with backoff and jitter, for at most `budget` seconds.
        `seeded`: the parameters may come as a digest of the seeded initial ones (WELCOME)."""
        retrying = Retrying(
            wait=wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.2),
            stop=stop_any(stop_after_delay(budget), _stop_when_set(self.stop)),
            # A syncer whose disk is full or failing refuses a new incarnation's HELLO: later.
            retry=retry_if_exception_type(TRANSIENT) | retry_if_exception(retry_later),
            sleep=self.stop.wait,
            reraise=True,
        )
        with self.lock:
            self.close()
            for attempt in retrying:
                with attempt:
                    return self._handshake(want_params, seeded)
        raise ConnectionError("stopped before connecting")  # pragma: no cover (tenacity reraises)

    def bye(self, wait: float) -> bool:
        """Say BYE and close, for a stop that must stay short: the link is taken only if it is
        free within `wait` s, and the BYE's answer (an ACK) is awaited for the request timeout,
        not a deadline sized for a 64 MiB frame (37 s). A network thread still waiting on a
        syncer gone silent (paused, a blackholed link) held a stop that long. When the link
        stays busy, its socket is shut down instead: that thread's wait ends at once, and
        the syncer, having no BYE, counts the learner out by its lease. Whether BYE was said."""
        if not self.lock.acquire(timeout=max(0.0, wait)):
            channel = self.channel
            if channel is not None:
                try:
                    channel.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            return False
        try:
            if self.channel is None:
                return False
            deadline = time.monotonic() + self.request_timeout
            try:
                self.bytes_up += self.channel.send(wire.message(wire.BYE, {}), deadline)
                self.bytes_down += self.channel.recv(deadline, max_payload=0).wire_bytes
                return True
            except TRANSIENT:
                return False
            finally:
                self.close()
        finally:
            self.lock.release()

    def request(self, msg: wire.Message) -> wire.Frame:
        """One request on the current connection. On a transport error the link is closed."""
        with self.lock:
            if self.channel is None:
                raise ConnectionError("not connected")
            try:
                return self._exchange(self.channel, msg)
            except TRANSIENT as exc:
                self.close(f"{type(exc).__name__}: {exc}")
                raise
