"""A learner refused for the syncer's disk (storage_full, storage_io) keeps its push and
sends it again after a growing backoff, instead of dropping it or reconnecting in a loop.

Drives Learner._network_loop with fakes for the link, the queue and the stop event, as
test_trainer_quiet_heartbeat does."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from trainer import learner as learner_module
from trainer.protocol import Reason, Refusal


class Stop:
    """The learner's stop event: wait(t) records t and returns at once (no real sleep)."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def wait(self, timeout: float) -> bool:
        self.waits.append(timeout)
        return False

    def is_set(self) -> bool:
        return False


def run(reason: Reason, refusals: int) -> tuple[SimpleNamespace, list[str], list[dict]]:
    closing = threading.Event()
    item = SimpleNamespace(fragment=0, seq=7, claimed=True)
    sent: list[str] = []
    events: list[dict] = []

    def send_push(pushed: object) -> None:
        assert pushed is item, "a different push was sent: the refused one was dropped"
        sent.append("try")
        if len(sent) <= refusals:
            raise Refusal(reason, "push 1:1:7 not stored: ENOSPC (No space left on device)")
        closing.set()
        queue.items.clear()

    class Queue:
        items = [item]

        def peek(self):
            return self.items[0] if self.items else None

        def __len__(self):
            return len(self.items)

    queue = Queue()

    def dropped(exc: Refusal) -> None:
        raise AssertionError(f"the push was dropped after {exc}")

    fake = SimpleNamespace(
        closing=closing, drain_over=threading.Event(), stop=Stop(),
        link=SimpleNamespace(connected=True, close=lambda reason=None: pytest.fail(f"link closed: {reason}")),
        queue=queue, cfg=SimpleNamespace(heartbeat_interval=1.0), _send_push=send_push,
        _pull_new_versions=lambda: None, _drop_refused_push=dropped, _refusals_in_a_row=0,
        events=SimpleNamespace(emit=lambda kind, **f: events.append({"kind": kind, **f})),
        opts=SimpleNamespace(learner=1))
    fake._back_off = lambda exc: learner_module.Learner._back_off(fake, exc)  # type: ignore[arg-type]
    learner_module.Learner._network_loop(fake)  # type: ignore[arg-type]
    return fake, sent, events


@pytest.mark.parametrize("reason", [Reason.STORAGE_FULL, Reason.STORAGE_IO])
def test_a_storage_refusal_keeps_the_push_and_backs_off(reason: Reason) -> None:
    fake, sent, events = run(reason, refusals=6)
    assert len(sent) == 7, "the same push is sent again until it is taken"
    waits = fake.stop.waits
    assert len(waits) == 6
    assert all(b >= a * 0.9 or b >= learner_module.BACKOFF_MAX / 2 for a, b in zip(waits, waits[1:])) \
        and waits[-1] > waits[0] * 4, f"the waits do not grow: {waits}"
    assert max(waits) <= learner_module.BACKOFF_MAX
    deferred = [e for e in events if e["kind"] == "push_deferred"]
    assert len(deferred) == 6 and deferred[0]["reason"] == str(reason) and deferred[0]["seq"] == 7
