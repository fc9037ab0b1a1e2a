"""A learner refused for the syncer's disk (storage_full, storage_io) keeps its push and
sends it again after a growing backoff, instead of dropping it or reconnecting in a loop,
and heartbeats while it waits, so the backoff never costs it its lease.

Drives Learner._network_loop on a fake clock with fakes for the link, the queue and the
stop event, as test_trainer_quiet_heartbeat does."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from trainer import learner as learner_module
from trainer.adoption import VersionBook
from trainer.protocol import Reason, Refusal
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


def run(reason: Reason, refusals: int) -> tuple[list[float], list[float], list[dict]]:
    """(times a push was sent, times a heartbeat was sent, events) until the push is taken."""
    clock = Clock()
    closing = threading.Event()
    item = SimpleNamespace(fragment=0, seq=7, claimed=True)
    sends: list[float] = []
    beats: list[float] = []
    events: list[dict] = []

    class Queue:
        items = [item]

        def peek(self):
            return self.items[0] if self.items else None

        def __len__(self):
            return len(self.items)

        def wait(self, timeout: float) -> None:
            clock.now += max(timeout, 1e-3)

    queue = Queue()

    def send_push(pushed: object) -> None:
        assert pushed is item, "a different push was sent: the refused one was dropped"
        sends.append(clock.now)
        link.last_reply = clock.now
        if len(sends) <= refusals:
            raise Refusal(reason, "push 1:1:7 not stored: ENOSPC (No space left on device)")
        queue.items.clear()
        closing.set()

    def request(message) -> SimpleNamespace:
        beats.append(clock.now)
        link.last_reply = clock.now
        return SimpleNamespace(header={})

    def dropped(exc: Refusal) -> None:
        raise AssertionError(f"the push was dropped after {exc}")

    link = SimpleNamespace(connected=True, last_reply=0.0, request=request,
                           close=lambda reason=None: pytest.fail(f"link closed: {reason}"))
    log = SimpleNamespace(emit=lambda kind, **f: events.append({"kind": kind, **f}))
    # The real rules (push_protocol.py) on the fake queue and clock; a push dropped is a failure.
    pushes = PushProtocol(1, 1, VersionBook.starting_at([0]), queue, log, "fp32", clock.monotonic)
    queue.pop = lambda pushed: dropped(Refusal(reason, "popped"))  # type: ignore[attr-defined]
    fake = SimpleNamespace(
        closing=closing, drain_over=Stop(clock), stop=Stop(clock), link=link, queue=queue, failures_in_a_row=0,
        cfg=SimpleNamespace(heartbeat_interval=INTERVAL), _send_push=send_push, _pull_new_versions=lambda: None,
        _note_versions=lambda versions: None, _awaited=lambda: None, pushes=pushes, _versions_lock=threading.Lock(),
        events=log, opts=SimpleNamespace(learner=1))
    fake._refused = lambda exc, about_push: learner_module.Learner._refused(fake, exc, about_push)
    fake._back_off = lambda: learner_module.Learner._back_off(fake)
    original = learner_module.time
    learner_module.time = clock  # type: ignore[assignment]
    try:
        learner_module.Learner._network_loop(fake)  # type: ignore[arg-type]
    finally:
        learner_module.time = original
    return sends, beats, events


@pytest.mark.parametrize("reason", [Reason.STORAGE_FULL, Reason.STORAGE_IO])
def test_a_storage_refusal_keeps_the_push_backs_off_and_heartbeats_meanwhile(reason: Reason) -> None:
    sends, beats, events = run(reason, refusals=6)
    assert len(sends) == 7, "the same push is sent again until it is taken"
    gaps = [b - a for a, b in zip(sends, sends[1:])]
    assert gaps[-1] > gaps[0] * 3 and max(gaps) <= learner_module.BACKOFF_MAX + 0.01, f"no growing backoff: {gaps}"
    quiet = [b - a for a, b in zip(sorted(sends + beats), sorted(sends + beats)[1:])]
    assert max(quiet) <= INTERVAL + 1e-6, f"the link went quiet for {max(quiet):.2f} s during the backoff"
    deferred = [e for e in events if e["kind"] == "push_deferred"]
    assert len(deferred) == 6 and deferred[0]["reason"] == str(reason) and deferred[0]["seq"] == 7
