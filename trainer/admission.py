"""Who gets a connection slot at the syncer, and how refusals are reported without flooding.

Two pools. A connection is *unauthenticated* from accept until its HELLO verifies: it
holds a slot of --max-unauthenticated and must finish within --handshake-timeout. Then it
is *authenticated* and holds a slot of --max-connections until it closes. When the
unauthenticated pool is full a newcomer is still admitted, and the oldest connection of
the peer host that holds the most slots is evicted (fairness per peer; SSH's MaxStartups
drops at random instead, which a flood can still win). So a flood of idle or slow
connections only ever displaces itself: a learner's handshake takes milliseconds, and is
lost only if the flood opens a whole pool's worth of connections meanwhile.

Not thread-safe on its own: the syncer calls it under its lock.
"""
from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from .protocol import Reason


@dataclass
class Slot:
    conn_id: int
    host: str
    sock: socket.socket
    opened: float
    authenticated: bool = False


@dataclass
class Admission:
    max_unauthenticated: int
    max_connections: int
    slots: dict[int, Slot] = field(default_factory=dict)

    def count(self, authenticated: bool) -> int:
        return sum(1 for s in self.slots.values() if s.authenticated == authenticated)

    def admit(self, conn_id: int, host: str, sock: socket.socket) -> Slot | None:
        """Take an unauthenticated slot for a new connection; returns the slot it evicted
        (the caller closes its socket and reports it), or None."""
        evicted = None
        if self.count(False) >= self.max_unauthenticated:
            evicted = self._victim()
            self.slots.pop(evicted.conn_id)
        self.slots[conn_id] = Slot(conn_id, host, sock, time.monotonic())
        return evicted

    def _victim(self) -> Slot:
        waiting = [s for s in self.slots.values() if not s.authenticated]
        busiest = Counter(s.host for s in waiting).most_common(1)[0][0]
        return min((s for s in waiting if s.host == busiest), key=lambda s: s.opened)

    def authenticate(self, conn_id: int) -> bool:
        """Move a connection whose HELLO verified to the authenticated pool; False when it
        is full (or the connection was evicted meanwhile)."""
        slot = self.slots.get(conn_id)
        if slot is None or self.count(True) >= self.max_connections:
            return False
        slot.authenticated = True
        return True

    def holds(self, conn_id: int) -> bool:
        return conn_id in self.slots

    def release(self, conn_id: int) -> None:
        self.slots.pop(conn_id, None)

    def sockets(self) -> list[socket.socket]:
        return [s.sock for s in self.slots.values()]


class Throttle:
    """At most `per_second` events of one kind and reason each second; the ones held back
    are counted and reported in the next that goes out (`suppressed`). Counters stay exact
    elsewhere: this only keeps a flood of bad frames from becoming a flood of log lines."""

    def __init__(self, emit: Callable[..., Any], per_second: int = 20,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.emit = emit
        self.per_second = per_second
        self.clock = clock
        self._window: dict[tuple[str, str], tuple[int, int]] = {}  # key → (second, sent in it)
        self._held: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def __call__(self, kind: str, reason: Reason | str, **fields: Any) -> bool:
        with self._lock:
            held = self._admit((kind, str(reason)))
        if held is None:
            return False
        self.emit(kind, reason=str(reason), **({"suppressed": held} if held else {}), **fields)
        return True

    def _admit(self, key: tuple[str, str]) -> int | None:
        """None when this event is held back; else how many were held back before it."""
        second = int(self.clock())
        start, sent = self._window.get(key, (second, 0))
        if start != second:
            start, sent = second, 0
        if sent >= self.per_second:
            self._window[key] = (start, sent)
            self._held[key] += 1
            return None
        self._window[key] = (start, sent + 1)
        return self._held.pop(key, 0)

    def flush(self) -> dict[str, int]:
        """What was held back and never reported since, as {"kind/reason": count}."""
        with self._lock:
            held = {f"{kind}/{reason}": n for (kind, reason), n in self._held.items() if n}
            self._held.clear()
        return held
