"""A learner heartbeats only on a quiet link: any reply renews its lease at the syncer.

Drives Learner._network_loop on a fake clock, with fakes for the link and the push queue,
so the count of heartbeats does not depend on how fast the machine is.
"""
from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest

from trainer import learner as learner_module

INTERVAL = 0.2
HORIZON = 3.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


class FakeLink:
    """Counts the heartbeats (the only frames the loop itself requests); always connected."""

    secret = b"k" * 32
    connected = True

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.last_reply = 0.0
        self.heartbeats: list[float] = []
        self.headers: list[dict] = []
        self.closing: threading.Event | None = None

    def request(self, frame) -> SimpleNamespace:
        self.heartbeats.append(self.clock.now)
        self.headers.append(json.loads(frame.head))
        if "wait_ms" in self.headers[-1]:  # a long poll: the syncer answers within its wait
            self.clock.now += self.headers[-1]["wait_ms"] / 1000
            if self.clock.now >= HORIZON and self.closing is not None:
                self.closing.set()
        self.last_reply = self.clock.now
        return SimpleNamespace(header={})


class FakeQueue:
    """A push falls due every `period` s of fake time (never, if None); wait() moves the clock."""

    def __init__(self, clock: FakeClock, period: float | None, closing: threading.Event) -> None:
        self.clock, self.period, self.closing = clock, period, closing
        self.next_due = period if period is not None else float("inf")

    def peek(self) -> object | None:
        return "push" if self.clock.now >= self.next_due else None

    def __len__(self) -> int:
        return 1 if self.peek() is not None else 0

    def sent(self) -> None:
        assert self.period is not None
        self.next_due += self.period

    def wait(self, timeout: float) -> None:
        self.clock.now = min(self.clock.now + max(timeout, 1e-3), self.next_due)
        if self.clock.now >= HORIZON:
            self.closing.set()


def run_loop(monkeypatch: pytest.MonkeyPatch, push_every: float | None,
             awaited: list[int] | None = None, link_out: list | None = None) -> tuple[list[float], int]:
    clock = FakeClock()
    monkeypatch.setattr(learner_module, "time", clock)
    closing = threading.Event()
    link = FakeLink(clock)
    link.closing = closing
    queue = FakeQueue(clock, push_every, closing)
    pushes: list[float] = []

    def send_push(item: object) -> None:
        pushes.append(clock.now)
        link.last_reply = clock.now
        queue.sent()

    fake = SimpleNamespace(
        closing=closing, drain_over=threading.Event(), stop=threading.Event(), link=link, queue=queue,
        cfg=SimpleNamespace(heartbeat_interval=INTERVAL), _send_push=send_push,
        _pull_new_versions=lambda: None, _note_versions=lambda versions, waiting=None: None, _awaited=lambda: awaited, _poll_ms=lambda: int(INTERVAL * 1000),
        pushes=SimpleNamespace(deferred=lambda now: False, retry_at=0.0))
    learner_module.Learner._network_loop(fake)  # type: ignore[arg-type]
    if link_out is not None:
        link_out.append(link)
    return link.heartbeats, len(pushes)


def test_no_heartbeat_while_pushes_come_more_often_than_the_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    heartbeats, pushes = run_loop(monkeypatch, push_every=0.15)
    assert pushes >= 15, f"only {pushes} pushes were sent in {HORIZON} s of fake time"
    assert heartbeats == [], f"heartbeats sent between pushes 0.15 s apart: {heartbeats}"


def test_a_quiet_link_heartbeats_every_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    heartbeats, pushes = run_loop(monkeypatch, push_every=None)
    assert pushes == 0
    gaps = [round(b - a, 6) for a, b in zip(heartbeats, heartbeats[1:])]
    assert len(heartbeats) >= HORIZON / INTERVAL - 1, f"{len(heartbeats)} heartbeats in {HORIZON} s"
    assert all(g >= INTERVAL - 1e-9 for g in gaps), f"heartbeats closer than the interval: {gaps}"


def test_pushes_slower_than_the_interval_leave_room_for_heartbeats(monkeypatch: pytest.MonkeyPatch) -> None:
    heartbeats, pushes = run_loop(monkeypatch, push_every=0.5)
    assert pushes >= 5
    assert heartbeats, "a link quiet for longer than the interval between pushes sent no heartbeat"


def test_a_learner_awaiting_a_merge_long_polls_instead_of_sleeping(monkeypatch: pytest.MonkeyPatch) -> None:
    """While a push waits for its merge, the heartbeat is a long poll that names the versions
    known (the syncer answers when one passes them): back to back, no sleep between, so an
    adoption waits for the merge, not for the next heartbeat interval."""
    out: list = []
    heartbeats, _ = run_loop(monkeypatch, push_every=None, awaited=[3, 4], link_out=out)
    (link,) = out
    assert link.headers and all(h["wait_ms"] == int(INTERVAL * 1000) and h["versions"] == [3, 4]
                                for h in link.headers)
    assert heartbeats[0] == 0.0, "the first poll waited for a heartbeat interval"


class FakeStop:
    """stop.wait(t) for the sync-mode heartbeat thread: moves the fake clock, and a GRAD is
    answered every `grad_every` s of it (never, if None)."""

    def __init__(self, clock: FakeClock, link: FakeLink, grad_every: float | None) -> None:
        self.clock, self.link, self.grad_every = clock, link, grad_every

    def wait(self, timeout: float) -> bool:
        self.clock.now += timeout
        if self.grad_every is not None:
            self.link.last_reply = self.clock.now - (self.clock.now % self.grad_every)
        return self.clock.now >= HORIZON


def run_sync_beats(monkeypatch: pytest.MonkeyPatch, grad_every: float | None) -> list[float]:
    clock = FakeClock()
    monkeypatch.setattr(learner_module, "time", clock)
    link = FakeLink(clock)
    link.lock = threading.Lock()  # type: ignore[attr-defined]
    fake = SimpleNamespace(link=link, stop=FakeStop(clock, link, grad_every),
                           cfg=SimpleNamespace(heartbeat_interval=INTERVAL))
    learner_module.Learner._sync_heartbeat_loop(fake)  # type: ignore[arg-type]
    return link.heartbeats


def test_sync_mode_sends_no_heartbeat_while_rounds_answer_within_the_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_sync_beats(monkeypatch, grad_every=0.05) == []


def test_sync_mode_heartbeats_while_a_long_step_keeps_the_link_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    beats = run_sync_beats(monkeypatch, grad_every=None)
    assert len(beats) >= HORIZON / INTERVAL - 2, f"{len(beats)} heartbeats in {HORIZON} s of a quiet link"


def test_a_long_poll_waits_no_longer_than_the_next_push_and_the_cap() -> None:
    """The poll holds the one connection: it waits at most until the learner's next push
    falls due (H/P steps at its pace), a heartbeat interval, MAX_POLL_MS and half a request
    timeout; at least POLL_FLOOR_MS. A --heartbeat-interval of 1.5 s asked 1500 ms, which a
    syncer refused, and the learner reconnected in a loop."""
    from trainer.protocol import MAX_POLL_MS

    def poll(interval=0.2, sync_every=20, fragments=1, step=None, request_timeout=5.0):
        fake = SimpleNamespace(cfg=SimpleNamespace(heartbeat_interval=interval, sync_every=sync_every,
                                                   fragments=fragments, request_timeout=request_timeout),
                               step_seconds=step)
        return learner_module.Learner._poll_ms(fake)  # type: ignore[arg-type]

    assert poll() == 200
    assert poll(step=0.0015) == 30            # a small task: 20 steps of 1.5 ms
    assert poll(step=0.01, fragments=4) == 50  # H/P = 5 steps of 10 ms
    assert poll(interval=1.5, step=1.0) == MAX_POLL_MS
    assert poll(interval=0.9, request_timeout=1.0) == 500
    assert poll(step=1e-6) == learner_module.POLL_FLOOR_MS
