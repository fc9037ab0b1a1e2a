"""The learner's network thread (Learner._network_loop) against what a review found: a
refused heartbeat, pull or HELLO dropped the push waiting at the head of the queue; a
request refused every time was sent again at once, for ever; after a SIGTERM one network
error ended the thread before the final round's pushes went. Driven on a fake clock, as
tests/unit/learner_loop_rig.py sets up."""
from __future__ import annotations

import threading
from types import SimpleNamespace

from tests.unit.learner_loop_rig import Clock, SetStop, Stop, harness, run_loop
from trainer import learner as learner_module
from trainer.adoption import VersionBook
from trainer.protocol import Reason, Refusal
from trainer.push_protocol import PushProtocol, Refused


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
