"""Who is in the cluster: learner incarnations, heartbeat leases and data positions.

A learner process presents a random nonce in HELLO. The same nonce again is a reconnect
of the same incarnation (a network blip); a new nonce is a new process, so the
incarnation is bumped. Only the holder of learner N's key can HELLO as N at all (keys.py,
wire.py), so the nonce is no credential: no other learner can present it, supersede N's
incarnation or move N's data position. Incarnations, nonces and data positions are persisted by the
syncer, so numbers are never reused across syncer restarts.

An incarnation's age (`elapsed`), which bounds the steps and data it may claim
(validation.py), is counted on the monotonic clock while a syncer runs, persisted as
`life`, and credited with the syncer's downtime by the boot clock (clock.py): no wall
clock enters it, so a step of the wall clock in either direction changes nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .clock import wall

# expire() needs silence strictly past the timeout: the instant just after it.
LEASE_EPSILON = 1e-6


@dataclass
class Member:
    learner: int
    nonce: str = ""
    incarnation: int = 0
    position: int = 0        # data windows consumed, across incarnations
    start: int = 0           # the position this incarnation was welcomed at (position bound: validation.py)
    tokens: int = 0          # tokens reported in accepted pushes or gradients
    alive: bool = False
    last_seen: float = 0.0
    conn: int | None = None  # id of the connection that currently speaks for it
    busy: bool = False       # waiting in a sync barrier: its lease is held by the request
    finished: bool = False   # said BYE: stopped cleanly, its last pushes may still be merging
    since: float = 0.0       # wall-clock time this incarnation first joined: for people, never for bounds
    claimed: dict[int, int] = field(default_factory=dict)  # fragment → steps its accepted pushes claimed
    life: float = 0.0        # seconds of this incarnation counted up to `anchor` (monotonic + downtime)
    anchor: float = 0.0      # the monotonic time `life` was counted to (not persisted)

    def elapsed(self, now: float) -> float:
        """The incarnation's age for the push bounds, at monotonic time `now`: never decreases."""
        return self.life + max(0.0, now - self.anchor)

    def persistent(self, now: float | None = None) -> dict:
        out = {"nonce": self.nonce, "incarnation": self.incarnation, "position": self.position, "start": self.start,
               "tokens": self.tokens, "since": self.since, "claimed": {str(f): n for f, n in self.claimed.items()}}
        if now is not None:
            out["life"] = round(self.elapsed(now), 6)
        return out

    @classmethod
    def restore(cls, learner: int, data: dict, now: float = 0.0, downtime: float = 0.0) -> "Member":
        """`downtime`: seconds the syncer was down since `data` was written (clock.downtime_since)."""
        return cls(learner=learner, nonce=str(data.get("nonce", "")),
                   incarnation=int(data.get("incarnation", 0)),
                   position=int(data.get("position", 0)), tokens=int(data.get("tokens", 0)),
                   start=int(data.get("start", data.get("position", 0))),
                   since=float(data.get("since", 0.0)),
                   claimed={int(f): int(n) for f, n in (data.get("claimed") or {}).items()},
                   life=float(data.get("life", 0.0)) + max(0.0, downtime), anchor=now)


@dataclass(frozen=True)
class JoinResult:
    incarnation: int
    rejoin: bool     # a new process for a learner seen before
    reconnect: bool  # the same process on a new connection


class Membership:
    """Not thread-safe on its own: the syncer calls it under its lock."""

    def __init__(self, num_learners: int, wall_clock: Callable[[], float] = wall) -> None:
        self.num_learners = num_learners
        self.wall_clock = wall_clock  # for `since` alone, which people read
        self.members: dict[int, Member] = {}
        self.durable: dict[int, int] = {}  # learner → the incarnation last written to disk

    def check_learner(self, learner: int) -> str | None:
        if not 1 <= learner <= self.num_learners:
            return f"learner {learner} is out of range 1..{self.num_learners}"
        return None

    def join(self, learner: int, nonce: str, conn: int, now: float) -> JoinResult:
        m = self.members.setdefault(learner, Member(learner))
        reconnect = m.nonce == nonce and m.incarnation > 0
        rejoin = not reconnect and m.incarnation > 0
        if not reconnect:
            m.incarnation += 1
            m.nonce = nonce
            m.since, m.claimed, m.start = self.wall_clock(), {}, m.position
            m.life, m.anchor = 0.0, now
        m.alive, m.last_seen, m.conn, m.busy, m.finished = True, now, conn, False, False
        return JoinResult(m.incarnation, rejoin, reconnect)

    def current(self, learner: int, conn: int) -> Member | None:
        """The member if `conn` still speaks for it (a newer HELLO supersedes a connection)."""
        m = self.members.get(learner)
        return m if m is not None and m.conn == conn else None

    def touch(self, m: Member, now: float) -> bool:
        """Renew the lease; True if the member had been marked dead and is back."""
        revived = not m.alive
        m.alive, m.last_seen = True, now
        return revived

    def expire(self, now: float, timeout: float) -> list[tuple[Member, float]]:
        """Members whose lease ran out, now marked dead, with how long they were silent."""
        out = []
        for m in self._leased():
            if now - m.last_seen > timeout:
                m.alive = False
                out.append((m, now - m.last_seen))
        return out

    def next_expiry(self, timeout: float) -> float | None:
        """When the first live lease runs out with no heartbeat before (None: no lease runs)."""
        return min((m.last_seen + timeout + LEASE_EPSILON for m in self._leased()), default=None)

    def _leased(self) -> list[Member]:
        """The members a lease keeps alive (a busy one's request holds it)."""
        return [m for m in self.members.values() if m.alive and not m.busy]

    def disconnect(self, learner: int, conn: int) -> Member | None:
        m = self.current(learner, conn)
        if m is None:
            return None
        was_alive = m.alive
        m.alive, m.conn, m.busy = False, None, False
        return m if was_alive else None

    def alive(self) -> list[Member]:
        return [m for m in self.members.values() if m.alive]

    def finish(self, m: Member) -> None:
        m.finished = True

    def weighed(self) -> list[Member]:
        """Who counts in a merge's weight denominator: the live, and those that stopped
        cleanly (a BYE is not a failure: without them the last learner's final pushes would
        each merge alone at full weight, and add up)."""
        return [m for m in self.members.values() if m.alive or m.finished]

    def presume_alive(self, now: float) -> list[int]:
        """After a syncer restart: every learner seen before counts as live until its lease
        runs out, as it did before the crash. Without it the pushes recovered from disk
        merged at once among themselves (no live learner, so no quorum to wait for and an
        empty weight denominator): a full round's weight for a third of a round."""
        presumed = []
        for m in self.members.values():
            if m.incarnation > 0:
                m.alive, m.last_seen = True, now
                presumed.append(m.learner)
        return presumed

    def persistent(self, now: float | None = None) -> dict:
        """Every member's durable record; with `now` (monotonic), each incarnation's age as well."""
        return {str(k): m.persistent(now) for k, m in sorted(self.members.items())}

    def note_durable(self, document: dict) -> None:
        """`document` (persistent()'s form) is on disk: its incarnations are never reused."""
        self.durable = {int(k): int(v["incarnation"]) for k, v in document.items()}

    def is_durable(self, learner: int) -> bool:
        """Whether the learner's current incarnation number is on disk (a HELLO whose write
        failed was refused, and its reconnect must write it before it is welcomed)."""
        m = self.members.get(learner)
        return m is None or self.durable.get(learner, 0) >= m.incarnation

    def restore(self, data: dict, now: float = 0.0, downtime: float = 0.0) -> None:
        self.members = {int(k): Member.restore(int(k), v, now, downtime) for k, v in data.items()}
        self.note_durable(data)
