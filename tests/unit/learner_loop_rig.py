"""A fake learner whose network thread (Learner._network_loop) runs the real code on a
fake clock: a link, a queue and the stop events as fakes, the push rules (push_protocol.py)
real. Shared by the tests of the network thread's refusals, backoff and drain."""
from __future__ import annotations

import threading
from types import SimpleNamespace

from trainer import learner as learner_module
from trainer.adoption import VersionBook
from trainer.push_protocol import PushProtocol

INTERVAL = 0.5  # heartbeat interval (s)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


class Stop:
    """The learner's stop and drain_over events: wait(t) moves the fake clock instead of sleeping."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def wait(self, timeout: float) -> bool:
        self.clock.now += max(timeout, 1e-3)
        return False

    def is_set(self) -> bool:
        return False


class SetStop(Stop):
    """`stop` after a SIGTERM: set, and its wait returns at once."""

    def wait(self, timeout: float) -> bool:
        return True

    def is_set(self) -> bool:
        return True


def harness(clock: Clock, queue_items: list, stop: Stop, request, send_push, connect=None):
    """A fake learner whose _network_loop runs the real code; returns (fake, events)."""
    events: list[dict] = []
    closing = threading.Event()

    class Queue:
        items = queue_items

        def peek(self):
            return self.items[0] if self.items else None

        def __len__(self):
            return len(self.items)

        def wait(self, timeout: float) -> None:
            clock.now += max(timeout, 1e-3)

        def pop(self, item) -> None:
            self.items.remove(item)

    link = SimpleNamespace(connected=True, last_reply=0.0, request=request, closes=[])

    def close(reason=None) -> None:
        link.closes.append(reason)
        link.connected = False

    def reconnect(**kwargs):
        link.connected = True
        return (connect or (lambda: SimpleNamespace(header={})))()
    link.close, link.connect = close, reconnect
    log = SimpleNamespace(emit=lambda kind, **f: events.append({"kind": kind, **f}))
    queue = Queue()
    pushes = PushProtocol(1, 1, VersionBook.starting_at([0]), queue, log, "fp32", clock.monotonic)
    fake = SimpleNamespace(
        closing=closing, drain_over=Stop(clock), stop=stop, link=link, queue=queue, failures_in_a_row=0,
        cfg=SimpleNamespace(heartbeat_interval=INTERVAL), _send_push=send_push, _pull_new_versions=lambda: None,
        _note_versions=lambda versions, waiting=None: None, _awaited=lambda: None, pushes=pushes, _versions_lock=threading.Lock(),
        events=log, opts=SimpleNamespace(learner=1), fatal=None, pulled_on_this_connection=set())
    fake._refused = lambda exc, about_push: learner_module.Learner._refused(fake, exc, about_push)
    fake._back_off = lambda: learner_module.Learner._back_off(fake)
    return fake, events


def run_loop(fake, clock: Clock) -> None:
    original = learner_module.time
    learner_module.time = clock  # type: ignore[assignment]
    try:
        learner_module.Learner._network_loop(fake)  # type: ignore[arg-type]
    finally:
        learner_module.time = original
