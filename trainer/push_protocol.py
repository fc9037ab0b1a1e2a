"""The learner's side of the push protocol, with no I/O: what a push says, and what its
answer, a refusal or the versions in a reply do to the queue and the version book.

The live learner (learner.py, a network thread over a TCP link) and the simulator's
stand-in (chaos/sim/learner.py, one thread, a simulated link) both carry out these
answers, so the rules they follow are one: a push is retried under its id after a
"not now" (storage) refusal, with exponential backoff and jitter; a refusal for a cause
that retrying cannot fix ends the learner; any other refusal drops the push and frees
its fragment; a reply's versions may say the syncer went back. Callers serialise calls
(the live learner holds its versions lock around those that touch the book)."""
from __future__ import annotations

import enum
import random
from types import SimpleNamespace
from typing import Callable

from tenacity import wait_exponential_jitter

from . import wire
from .adoption import VersionBook
from .codec import encode
from .events import EventLog
from .protocol import FATAL_REASONS, MAX_POLL_MS, RETRY_LATER_REASONS, Reason
from .pushes import OutgoingPush, PushQueue

RENAMED_SEQ_STRIDE = 1 << 32  # the fresh_id_on_retry defect's new seqs: never one the learner will use
POLL_FLOOR_MS = 5  # the shortest long poll: a tighter loop would only spin
# A push answered `internal` this many times in a row is dropped as a refused push is: a
# syncer that fails on it every time (a bug of ours) must not hold up every push behind it,
# nor drop its learner's connection every backoff for the rest of the run.
INTERNAL_RETRIES = 3
# Seconds between sends after "not now" (storage) refusals: 0.2 doubling to 2, plus up to 0.2 of jitter.
BACKOFF_INITIAL, BACKOFF_MAX, BACKOFF_JITTER = 0.2, 2.0, 0.2


class Refused(enum.Enum):
    FATAL = "fatal"          # stop: retrying cannot do better (another mode, an unknown learner)
    DEFERRED = "deferred"    # keep the head push, send it again after `retry_in`
    DROPPED = "dropped"      # the head push was refused for good: its fragment may push again
    IGNORED = "ignored"      # a refusal of no push (a heartbeat's, a pull's)


BACKOFF = wait_exponential_jitter(multiplier=BACKOFF_INITIAL, max=BACKOFF_MAX, jitter=BACKOFF_JITTER)


def backoff(attempt: int, rng: random.Random | None = None) -> float:
    """The wait before retry `attempt` (1, 2, …): tenacity's exponential wait with jitter.
    With `rng`, the same formula on that PRNG: tenacity draws jitter from the process-wide
    one, which a simulation that must replay exactly cannot share."""
    if rng is None:
        return BACKOFF(SimpleNamespace(attempt_number=attempt))
    doublings = min(max(attempt, 1) - 1, 16)
    return max(0.0, min(BACKOFF_INITIAL * 2 ** doublings + rng.uniform(0, BACKOFF_JITTER), BACKOFF_MAX))


def poll_ms(heartbeat_interval: float, request_timeout: float, sync_every: int, fragments: int,
            step_seconds: float | None) -> int:
    """How long a long poll may wait: a heartbeat interval, and no longer than until the
    learner's next push falls due (H/P steps at its measured pace), since the push waits
    behind the poll on the one connection; at least POLL_FLOOR_MS, at most MAX_POLL_MS and
    half a request timeout."""
    seconds = min(heartbeat_interval, request_timeout / 2)
    if step_seconds:
        seconds = min(seconds, sync_every / fragments * step_seconds)
    return int(min(MAX_POLL_MS, max(POLL_FLOOR_MS, seconds * 1000)))


class PushProtocol:
    """One incarnation's pushes: their messages, answers and refusals."""

    def __init__(self, learner: int, incarnation: int, book: VersionBook, queue: PushQueue, events: EventLog,
                 encoding: str, monotonic: Callable[[], float], rng: random.Random | None = None,
                 defect: str | None = None) -> None:
        self.learner = learner
        self.incarnation = incarnation
        self.book = book
        self.queue = queue
        self.events = events
        self.encoding = encoding
        self.monotonic = monotonic
        self.rng = rng
        self.defect = defect  # a planted learner defect (trainer/defects.py), or None
        self.renamed: dict[int, int] = {}  # fresh_id_on_retry: a push's seq now -> the seq the book knows
        self.refusals_in_a_row = 0
        self.internal_in_a_row = 0  # the head push's `internal` answers: INTERNAL_RETRIES bounds them
        self.retry_at = 0.0  # the head push waits until then after a "not now" refusal

    def ident(self, item: OutgoingPush) -> str:
        return f"{self.learner}:{self.incarnation}:{item.seq}"

    def deferred(self, now: float) -> bool:
        """The head push is waiting out a backoff (the link goes on heartbeating and pulling)."""
        return now < self.retry_at

    def sent(self, item: OutgoingPush) -> None:
        """The head push is being sent: the book marks it (the next push of its fragment waits
        for its adoption), the queue claims it (a push queued meanwhile must not merge into it)."""
        self.book.sent(item.fragment, item.seq)
        self.queue.claim(item)

    def message(self, item: OutgoingPush, step_tokens: int) -> wire.Message:
        """A claimed push's message, built once: a retry is the same push, under the same id.
        Reads only the push (no book, no queue): the caller builds it off its lock."""
        if item.message is not None and self.defect == "fresh_id_on_retry":
            first = self.renamed.pop(item.seq, item.seq)
            item.seq += RENAMED_SEQ_STRIDE
            self.renamed[item.seq] = first
            item.message = None
        if item.message is None:
            header = {"learner": self.learner, "incarnation": self.incarnation, "seq": item.seq,
                      "fragment": item.fragment, "base_version": item.base_version, "tokens": item.tokens,
                      "steps": item.steps, "position": item.position, "encoding": self.encoding,
                      "step_tokens": max(1, step_tokens)}
            if item.final:
                header["final"] = 1
            item.message = wire.message(wire.PUSH, header, encode(item.delta, self.encoding))
        item.attempts += 1
        return item.message

    def answered(self, item: OutgoingPush, reply: wire.Frame, latency: float) -> None:
        """The syncer answered the push (accepted, duplicate or stale): it leaves the queue,
        and the version that will hold it is awaited."""
        self.refusals_in_a_row = self.internal_in_a_row = 0
        self.queue.pop(item)
        self.note_versions(reply.header.get("versions"))
        status = reply.header.get("status")
        version = int(reply.header.get("version", 0))
        self._known_as(item)
        self.book.answered(item.fragment, item.seq, version + 1 if status == "accepted" else version)
        self.events.emit("push", fragment=item.fragment, seq=item.seq, id=self.ident(item),
                         base_version=item.base_version, tokens=item.tokens, steps=item.steps,
                         wire_bytes=item.message.wire_size if item.message else 0, encoding=self.encoding,
                         status=status, version=version, attempts=item.attempts, coalesced=item.coalesced,
                         residual=item.residual, final=item.final, latency=round(latency, 4),
                         incarnation=self.incarnation)

    def refused(self, reason: Reason | str, detail: str, *, about_push: bool) -> Refused:
        """The syncer refused the last request (ERROR): what the learner does about it.
        `about_push`: the refused request was the head push. A refused HELLO, heartbeat or
        pull says nothing about the push waiting at the head, which stays queued."""
        if str(reason) in FATAL_REASONS:
            return Refused.FATAL
        if not about_push:
            return Refused.IGNORED
        item = self.queue.peek()
        if str(reason) == Reason.INTERNAL.value:
            self.internal_in_a_row += 1
        if str(reason) in RETRY_LATER_REASONS and self.internal_in_a_row <= INTERNAL_RETRIES:
            # The syncer's disk, or its error (`internal`, the push stored or not): the push
            # is kept and sent again, same id, after a backoff.
            self.refusals_in_a_row += 1
            delay = backoff(self.refusals_in_a_row, self.rng)
            self.retry_at = self.monotonic() + delay
            self.events.emit("push_deferred", reason=str(reason), detail=detail, retry_in=round(delay, 3),
                             refusals_in_a_row=self.refusals_in_a_row,
                             **({"fragment": item.fragment, "seq": item.seq}
                                if item is not None and item.claimed else {}))
            return Refused.DEFERRED
        self.refusals_in_a_row = self.internal_in_a_row = 0
        if item is None or not item.claimed:
            return Refused.IGNORED
        self.queue.pop(item)
        self._known_as(item)
        self.book.refused(item.fragment, item.seq)
        self.events.emit("push", fragment=item.fragment, seq=item.seq, status="refused", reason=str(reason),
                         detail=detail, wire_bytes=item.message.wire_size if item.message else 0,
                         tokens=item.tokens, steps=item.steps, id=self.ident(item), incarnation=self.incarnation)
        return Refused.DROPPED

    def _known_as(self, item: OutgoingPush) -> None:
        """fresh_id_on_retry: the book awaits the push under the seq it was sent with first."""
        first = self.renamed.pop(item.seq, None)
        if first is not None:
            self.book.awaiting[item.fragment].pop(first, None)
            self.book.sent(item.fragment, item.seq)

    def note_versions(self, versions: list[int] | None, waiting: list[int] | None = None) -> None:
        """Versions a reply carried: a syncer that went back is followed, and said. `waiting`
        (a heartbeat's answer): this learner's pushes per fragment the syncer has not merged."""
        for r in self.book.note_versions(versions):
            # Queued pushes made on the lost versions would be refused as ahead of the syncer
            # and dropped, their progress with them: they go on the version it has.
            rebased = self.queue.rebase(r.fragment, r.theirs)
            self.events.emit("syncer_rollback", fragment=r.fragment, held=r.held, syncer_version=r.theirs,
                             incarnation=self.incarnation, rebased=[item.seq for item in rebased])
        self.book.note_waiting(waiting)
