"""The learner's network thread (Learner._network_loop) against what a review found: a
refused heartbeat, pull or HELLO dropped the push waiting at the head of the queue; a
request refused every time was sent again at once, for ever; after a SIGTERM one network
error ended the thread before the final round's pushes went. Driven on a fake clock, as
test_learner_storage_backoff does."""
from __future__ import annotations

import threading
from types import SimpleNamespace

from tests.unit.test_learner_storage_backoff import Clock, Stop
from trainer import learner as learner_module
from trainer.adoption import VersionBook
from trainer.protocol import Reason, Refusal
from trainer.push_protocol import PushProtocol, Refused

INTERVAL = 0.5


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
        _note_versions=lambda versions: None, _awaited=lambda: None, pushes=pushes, _versions_lock=threading.Lock(),
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


def test_a_refusal_of_no_push_leaves_the_claimed_head_push_queued() -> None:
    clock = Clock()
    item = SimpleNamespace(fragment=0, seq=4, claimed=True)
    queue = [item]
    log = SimpleNamespace(emit=lambda kind, **f: None)
    pushes = PushProtocol(1, 1, VersionBook.starting_at([0]), SimpleNamespace(peek=lambda: queue[0]), log, "fp32",
                          clock.monotonic)
    for reason in (Reason.INTERNAL, Reason.BAD_FRAGMENT, "a reason from a newer syncer"):
        assert pushes.refused(reason, "not about the push", about_push=False) is Refused.IGNORED
    assert queue == [item]


def test_a_refused_heartbeat_neither_drops_the_waiting_push_nor_repeats_at_once() -> None:
    """The head push waits out a storage backoff; the heartbeats meanwhile are refused (a
    syncer failing them): the push stays, and the refused requests are spaced by a growing
    backoff, not sent again at once."""
    clock = Clock()
    item = SimpleNamespace(fragment=0, seq=7, claimed=True)
    sends: list[float] = []
    beats: list[float] = []

    def send_push(pushed) -> None:
        sends.append(clock.now)
        fake.link.last_reply = clock.now
        if len(sends) <= 5:
            raise Refusal(Reason.STORAGE_FULL, "push 1:1:7 not stored")
        fake.queue.items.clear()
        fake.closing.set()

    def request(message):
        beats.append(clock.now)
        raise Refusal(Reason.BAD_FRAGMENT, "planted: every heartbeat refused")

    fake, events = harness(clock, [item], Stop(clock), request, send_push)
    fake.pushes.retry_at = 0.0
    run_loop(fake, clock)
    assert len(sends) == 6, "the push refused for the disk was sent again (not dropped by a heartbeat's refusal)"
    assert not [e for e in events if e["kind"] == "push" and e.get("status") == "refused"]
    gaps = [b - a for a, b in zip(beats, beats[1:])]
    assert gaps and min(gaps) >= 0.19, f"a refused heartbeat was sent again at once: {beats} {sends}"


def test_after_a_sigterm_a_network_error_does_not_end_the_thread_before_the_final_push() -> None:
    clock = Clock()
    final = SimpleNamespace(fragment=0, seq=9, claimed=False)
    sends: list[float] = []

    def send_push(pushed) -> None:
        sends.append(clock.now)
        if len(sends) <= 3:
            raise ConnectionResetError("planted: the link drops")
        fake.queue.items.clear()

    fake, _ = harness(clock, [final], SetStop(clock), lambda message: SimpleNamespace(header={}), send_push)
    fake.closing.set()  # the inner loop has queued its last pushes and waits for the drain
    fake.pulled_on_this_connection.add(0)
    run_loop(fake, clock)
    assert fake.pulled_on_this_connection == set(), "a reconnection forgets which copies the syncer serves"
    assert len(sends) == 4 and fake.queue.items == [], "the final push went after the link came back"
    gaps = [b - a for a, b in zip(sends, sends[1:])]
    assert min(gaps) >= 0.19 and gaps[-1] > gaps[0], f"no growing backoff between reconnections: {gaps}"


def test_the_first_pull_of_a_fragment_on_a_connection_is_whole_then_steps() -> None:
    """With delta pulls a learner names the version it holds (`have`) and gets the steps
    after it. A syncer restarted since rebuilt its served copy from its recovered Θ: steps
    of its new life added to a copy of its old one left the learner off Θ for good. So a
    fragment's first pull on each connection names nothing, and is whole."""
    import json

    import torch

    from trainer import wire

    sent: list[dict] = []
    version = {"v": 0}

    def request(message):
        sent.append(json.loads(message.head))
        version["v"] += 1
        return SimpleNamespace(header={"version": version["v"], "encoding": "fp32"},
                               tensors=lambda: {"w": torch.zeros(2)}, wire_bytes=10)
    book = SimpleNamespace(pulls_wanted=lambda: [0], put_pulled=lambda f, v, t: None, pulled={},
                           adopted=[0])
    fake = SimpleNamespace(
        _versions_lock=threading.Lock(), book=book, cfg=SimpleNamespace(pull_encoding="delta-int8"),
        link=SimpleNamespace(request=request), params={"w": torch.zeros(2)}, fragment_names=[["w"]],
        events=SimpleNamespace(emit=lambda kind, **f: None), pulled_on_this_connection=set(), globals=[{}])
    fake._held = lambda f: learner_module.Learner._held(fake, f)
    pull = lambda: learner_module.Learner._pull_new_versions(fake)  # noqa: E731
    pull()
    pull()
    fake.pulled_on_this_connection.clear()  # what the network thread does on a reconnect
    pull()
    assert ["have" in h for h in sent] == [False, True, False], sent
    assert all(h["type"] == str(wire.PULL) for h in sent)
