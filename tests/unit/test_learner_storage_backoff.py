"""A learner refused for the syncer's disk (storage_full, storage_io) keeps its push and
sends it again after a growing backoff, instead of dropping it or reconnecting in a loop,
and heartbeats while it waits, so the backoff never costs it its lease. A push answered
`internal` (stored or not, nobody can say) is kept too, a bounded number of times.

Drives Learner._network_loop on a fake clock (tests/unit/learner_loop_rig.py)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.unit.learner_loop_rig import INTERVAL, Clock, Stop, harness, run_loop
from trainer import learner as learner_module
from trainer.adoption import VersionBook
from trainer.events import EventLog, MemoryEvents
from trainer.protocol import Reason, Refusal
from trainer.push_protocol import INTERNAL_RETRIES, PushProtocol, Refused
from trainer.pushes import OutgoingPush, PushQueue


def run(reason: Reason, refusals: int, closes: list | None = None) -> tuple[list[float], list[float], list[dict]]:
    """(times a push was sent, times a heartbeat was sent, events) until the push is taken.
    `closes`: where the link's closes are noted; None, a close fails the test."""
    clock = Clock()
    item = SimpleNamespace(fragment=0, seq=7, claimed=True)
    sends: list[float] = []
    beats: list[float] = []

    def send_push(pushed: object) -> None:
        assert pushed is item, "a different push was sent: the refused one was dropped"
        sends.append(clock.now)
        fake.link.last_reply = clock.now
        if len(sends) <= refusals:
            raise Refusal(reason, "push 1:1:7 not stored: ENOSPC (No space left on device)")
        fake.queue.items.clear()
        fake.closing.set()

    def request(message) -> SimpleNamespace:
        beats.append(clock.now)
        fake.link.last_reply = clock.now
        return SimpleNamespace(header={})

    def dropped(exc: Refusal) -> None:
        raise AssertionError(f"the push was dropped after {exc}")

    fake, events = harness(clock, [item], Stop(clock), request, send_push)
    if closes is None:
        fake.link.close = lambda reason=None: pytest.fail(f"link closed: {reason}")
    else:
        fake.link.closes = closes
    # The real rules (push_protocol.py) on the fake queue and clock; a push dropped is a failure.
    fake.queue.pop = lambda pushed: dropped(Refusal(reason, "popped"))
    run_loop(fake, clock)
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


def test_an_internal_refusal_keeps_the_push_of_unknown_fate_and_sends_it_again_on_a_new_connection() -> None:
    """`internal`: the syncer failed handling the push, perhaps after storing it, and closed the
    connection. Dropping the push lost its progress when it was not stored; kept and sent again
    under its id, it is answered duplicate when it was."""
    closes: list = []
    sends, _, events = run(Reason.INTERNAL, refusals=3, closes=closes)
    assert len(sends) == 4, "the same push is sent again until it is taken"
    assert len(closes) == 3 and all("internal" in str(c) for c in closes), f"link closes: {closes}"
    gaps = [b - a for a, b in zip(sends, sends[1:])]
    assert min(gaps) > 0.05, f"sent again with no backoff: {gaps}"
    deferred = [e for e in events if e["kind"] == "push_deferred"]
    assert [e["reason"] for e in deferred] == ["internal"] * 3 and deferred[0]["seq"] == 7


def test_a_push_answered_internal_every_time_is_dropped_after_a_few_tries() -> None:
    """A syncer that fails on one push every time (a bug of ours) must not hold every push
    behind it for the rest of the run, nor cut its learner's connection every backoff."""
    book, queue, memory = VersionBook.starting_at([0]), PushQueue(4), MemoryEvents()
    protocol = PushProtocol(1, 1, book, queue, EventLog(None, "learner-1", learner=1, memory=memory), "fp32",
                            lambda: 0.0)
    head = OutgoingPush(0, 1, 0, 2048, 4, 4, {"w": torch.ones(2)})
    queue.put(head)
    protocol.sent(queue.claim())
    outcomes = [protocol.refused(Reason.INTERNAL, "boom", about_push=True) for _ in range(INTERNAL_RETRIES + 1)]
    assert outcomes == [Refused.DEFERRED] * INTERNAL_RETRIES + [Refused.DROPPED], outcomes
    assert len(queue) == 0 and book.may_push(0, window=1), "the dropped push still holds its fragment"
    refused = [e for e in memory.events() if e["kind"] == "push" and e.get("status") == "refused"]
    assert len(refused) == 1 and refused[0]["reason"] == "internal"
    # The next push starts a count of its own.
    queue.put(OutgoingPush(0, 2, 0, 2048, 4, 8, {"w": torch.ones(2)}))
    protocol.sent(queue.claim())
    assert protocol.refused(Reason.INTERNAL, "boom", about_push=True) is Refused.DEFERRED
