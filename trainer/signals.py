"""Stop on SIGTERM or SIGINT without taking a lock inside the signal handler.

A Python signal handler runs in the main thread, between two bytecodes of whatever it
was doing. `threading.Event.set()` takes the event's lock; if the main thread was inside
that same event's `wait()` (the step pacer and the syncer's main loop wait on their stop
event) and held the lock at that instant, the handler would wait for itself forever. The
handler therefore only starts a thread, and that thread sets the event.
"""
from __future__ import annotations

import signal
import threading
from collections.abc import Callable


def on_signal(action: Callable[[], object]) -> Callable[..., None]:
    """A signal handler that runs `action` on a thread of its own."""
    def handler(*_: object) -> None:
        threading.Thread(target=action, name="stop-on-signal", daemon=True).start()
    return handler


def set_on_signal(event: threading.Event) -> Callable[..., None]:
    """A signal handler that sets `event` from a thread of its own."""
    return on_signal(event.set)


def stop_on_signals(event: threading.Event, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
    """Install `set_on_signal(event)` for each of `signals`."""
    handler = set_on_signal(event)
    for sig in signals:
        signal.signal(sig, handler)
